"""The spatial study's claims, family by family; claims.py (the stage) names them and judges them in order.

    runs          what a run's timings can judge: a missing run, phases disturbed by other load, ranks that
                  shared fewer GPUs (one_gpu_rule)
    model         partitioned_exact and loss_falls: the partitioned model's exactness and its learning
    scaling       strong_efficiency_2: 2-rank efficiency against this machine's own ceiling
    oracle        oracle_error (each held-out run, out of sample) and oracle_picks_spatial (the pick)
    gpu_compute   compute_term: the oracle's compute sum against whole one-GPU steps of a GPU calibration,
                  and where that calibration came from
"""
