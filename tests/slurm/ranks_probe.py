"""Run the 2-rank allreduce probe through hpcdl.platform.kit.rank_runtime.launch and write what every
rank reported."""

import json
import os
import sys

from hpcdl.platform.kit.rank_runtime.launch import in_slurm_allocation, local_launcher, run_ranks

if __name__ == "__main__":
    launcher = "srun" if in_slurm_allocation(2) else local_launcher()
    results = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 2, {"value": 1.0},
                        timeout_s=120)
    record = {"launcher": launcher, "job_id": os.environ.get("SLURM_JOB_ID"), "ranks": results}
    with open(sys.argv[1], "w") as f:
        json.dump(record, f, indent=1)
