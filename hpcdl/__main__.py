"""`python -m hpcdl …`: the platform's command line (hpcdl.platform.orchestration.cli)."""

import sys

from hpcdl.platform.orchestration.cli import main

sys.exit(main())
