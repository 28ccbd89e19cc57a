"""`python -m hpcdl …`: the platform's command line (hpcdl.platform.cli)."""

import sys

from hpcdl.platform.cli import main

sys.exit(main())
