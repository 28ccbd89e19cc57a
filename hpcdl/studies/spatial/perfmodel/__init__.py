"""ParaDL-style performance oracle: per-layer, per-strategy compute, alpha-beta communication, memory.

Pure Python (no torch, no other spatial module):

    oracle       a training step's predicted seconds per component and memory per rank, on a strategy
    machine      the machine a prediction is priced on: compute fits, links, measured GPU times
    strategies   every strategy family at a GPU count, why each cannot run, and the pick
    fit          the machine's constants fitted from the microbenchmark rows (calibration.microbench)
    slabs        the per-GPU slab items the GPU calibration times: layer, halo, face, correction, fixed
    layouts      the papers' layouts and the step checks, and every item the GPU calibration times once
    gpu_table    a GPU calibration's table as data, and how the oracle reads it (Measured)
"""
