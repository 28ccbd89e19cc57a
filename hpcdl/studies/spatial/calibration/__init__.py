"""The spatial oracle's calibration: the measurements (torch) that feed the oracle's pure model (perfmodel).

    microbench       the rank function of the microbenchmarks run on 2 ranks in a study run: the I/O, the
                     sections below on every rank
    comm_timings     ping-pong, all-reduce, all-gather and halo exchange between ranks
    compute_timings  the model's layers, optimizer step and fresh pages timed as a step runs them
    timing           how repeated timings become one number
    gpu              the GPU calibration at the papers' slab shapes (python -m hpcdl spatial calibrate):
                     each perfmodel.layouts item timed on one device, its table and provenance
    gpu_plan         the GPU calibration's order and time budget (pure)
    gpu_ops          the timed work of each GPU calibration item
    gpu_journal      the GPU calibration's table kept as a journal, a row appended as each item finishes

What the oracle makes of these rows is perfmodel's: perfmodel.fit fits the microbenchmarks,
perfmodel.gpu_table reads a GPU calibration's table.
"""
