"""Shuffle-fraction study: global, local and partial-Q data shuffling over real ranks, plus KAKURENBO.

Pure pieces (partition, plan, kakurenbo) are numpy only; `train` holds the rank function
that runs under `hpcdl.runtime.launch.run_ranks`; `run` turns one sweep point into rows.
"""
