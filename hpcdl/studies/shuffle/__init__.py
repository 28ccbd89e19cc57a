"""Shuffle-fraction study: global, local and partial-Q data shuffling over real ranks, plus KAKURENBO.

    data           the study's slice of Fashion-MNIST, cached as .npy files every rank memory-maps
    partition      random and label-skewed (Dirichlet) partitions of the samples over M ranks
    exchange_plan  the partial-Q exchange every rank plans alone from the shared seed and epoch
    exchange       that exchange of the samples: in host memory over gloo in a background thread,
                   or as CUDA tensors over NCCL (`exchange_device`)
    kakurenbo      which easy samples KAKURENBO hides from the backward pass
    model          the network: an MLP with batch normalisation
    train          the rank function (DDP on the rank's device, one shuffling strategy) run under run_ranks
    compute        what the task app's task body runs: one sweep point's M ranks, as rows
    sweep          the sweep points of a validated config; checks: config checks beyond the schema
    tables         raw/ -> tables/ (per run, gap to global, recovery Q, KAKURENBO rounds); figures:
                   tables/ -> figures/; claims: tables/ -> claims (paired intervals over seeds)

partition, exchange_plan and kakurenbo are numpy only.
"""

from hpcdl.platform import StudySpec


def _largest_world(cfg: dict) -> int:
    b = cfg["shuffle"]
    kk = b.get("kakurenbo", {})
    sizes = [m for g in b["grids"] for m in g["world_sizes"]]
    return max(sizes + ([kk["world_size"]] if any(f > 0 for f in kk.get("fractions", [])) else []))


def _setting(cfg: dict) -> str:
    b = cfg["shuffle"]
    grids = "; ".join(f"M={g['world_sizes']}, Q={g['qs']}" for g in b["grids"])
    kk = b["kakurenbo"]
    return (f"{b['n_train']} training / {b['n_val']} validation images, {b['epochs']} epochs, {grids}; "
            f"seeds {b['seeds']} for global, local and partial-{b['claim_q']:g}, "
            f"{b.get('q_sweep_seeds') or b['seeds'][:1]} for the other Q; KAKURENBO F={kk['fractions']} "
            f"at M={kk['world_size']} in {len(kk.get('seeds') or b['seeds'])} interleaved rounds")


SPEC = StudySpec(
    name="shuffle",
    title="Shuffle fraction (global / local / partial-Q, KAKURENBO)",
    short_title="Shuffle fraction",
    raw_tables=("epochs", "points"),
    tables=("epochs", "final", "gap", "recovery", "kakurenbo_rounds", "kakurenbo"),
    figures=("acc_gap_vs_q", "acc_vs_epoch", "final_acc_vs_q", "time_per_epoch_vs_q", "bytes_vs_q",
             "kakurenbo"),
    # one core per rank of the largest M, so no point oversubscribes
    task_units=_largest_world,
    # the batch step starts each point's ranks with srun inside this N-task allocation
    task_gpus=_largest_world,  # one GPU per rank of its largest launch
    devices=("cpu", "cuda"),
    run_resources=lambda cfg: {"mem_mb": 4000, "runtime": 60, "tasks": _largest_world(cfg), "mpi": "srun"},
    question=("Does exchanging only a fraction Q of the samples between ranks each epoch keep the "
              "accuracy of global shuffling, and does hiding easy samples (KAKURENBO) save training time?"),
    headline="acc_gap_vs_q",
    setting=_setting,
)
