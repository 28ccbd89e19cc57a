"""The spatial study's own commands, run as `python -m hpcdl spatial <command> ...`
(hpcdl.platform.orchestration.cli)."""

# name -> "module:function" taking the command's arguments and returning an exit code; by name, so
# that listing the commands imports none of them
COMMANDS = {
    "calibrate": "hpcdl.studies.spatial.calibration.gpu:main",   # the oracle's layer times on one device
}
