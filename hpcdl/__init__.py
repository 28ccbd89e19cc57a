"""hpcdl: compute modules for the convergence of deep learning and HPC studies."""

__version__ = "0.1.0"
