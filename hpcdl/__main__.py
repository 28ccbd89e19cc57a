"""`python -m hpcdl …`: the platform's command line (hpcdl.platform.cli), and
`python -m hpcdl spatial-calibrate …`: the spatial study's GPU calibration (hpcdl.studies.spatial.gpucal)."""

import sys

if sys.argv[1:2] == ["spatial-calibrate"]:
    from hpcdl.studies.spatial.gpucal import main as calibrate

    sys.exit(calibrate(sys.argv[2:]))

from hpcdl.platform.cli import main

sys.exit(main())
