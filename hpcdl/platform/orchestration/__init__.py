"""The platform's orchestration wing: what runs the studies (docs/architecture.md, "Layers"): the CLI,
the rules' files and commands, the Slurm pre-check, the verdict and the report pages, and the task
runtime. It may use the study wing (hpcdl.platform.kit); no study imports it.
"""
