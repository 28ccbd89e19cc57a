"""The batch script of a two-node test job: run one rank target through run_ranks (srun, since the
allocation grants the tasks) and pickle what every rank returned, with where it ran.

    python run_ranks_job.py SPEC.pkl OUT.pkl      # SPEC: {"target", "nprocs", "kwargs", "timeout_s"}
"""

import os
import pickle
import sys

from hpcdl.platform.kit.rank_runtime.launch import (
    in_slurm_allocation,
    local_launcher,
    run_ranks,
    slurm_master_addr,
)

if __name__ == "__main__":
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    n = spec["nprocs"]
    launcher = "srun" if in_slurm_allocation(n) else local_launcher()
    ranks = run_ranks("node_ranks:located", n, {"target": spec["target"], "kwargs": spec["kwargs"]},
                      timeout_s=spec["timeout_s"])
    record = {"launcher": launcher, "job_id": os.environ.get("SLURM_JOB_ID"),
              "nodelist": os.environ.get("SLURM_JOB_NODELIST"), "master_addr": slurm_master_addr(),
              "ranks": ranks}
    with open(out_path + ".tmp", "wb") as f:
        pickle.dump(record, f)
    os.replace(out_path + ".tmp", out_path)
