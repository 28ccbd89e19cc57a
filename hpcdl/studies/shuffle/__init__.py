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


# Which paper figure each of ours re-draws (StudySpec.paper_figures). Neither paper's figures were read
# for this project (resources/papers.yaml quotes their abstracts), so no figure number is given; each
# entry names the published result nearest to it instead.
_NGUYEN = ("no direct counterpart identified in Nguyen et al., Why Globally Re-shuffle? (IPDPS 2022; its "
           "figures were not read for this project)")
_KAKURENBO = ("no direct counterpart identified in Nguyen, Gerofi et al., KAKURENBO (NeurIPS 2023, arXiv "
              "2310.10102; its figures were not read for this project)")
_SMALL = "Fashion-MNIST and an MLP over a few ranks of one machine, not the paper's up to 2048 GPUs of ABCI"
_PAPER_FIGURES = {
    "acc_gap_vs_q": (
        f"{_NGUYEN}. Ours: local and partial-Q accuracy minus global's, paired by seed, against Q, per "
        f"partitioning and rank count; {_SMALL} (papers.yaml partial_keeps_global)."),
    "acc_vs_epoch": (
        f"{_NGUYEN}. Ours: validation accuracy per epoch per strategy; {_SMALL}."),
    "final_acc_vs_q": (
        f"{_NGUYEN}. Ours: final validation accuracy against Q; {_SMALL}."),
    "time_per_epoch_vs_q": (
        f"{_NGUYEN}. Ours: time per epoch and rank, stacked by loading, exposed exchange, compute and "
        f"update, against Q; {_SMALL}."),
    "bytes_vs_q": (
        f"{_NGUYEN}. Ours: the bytes partial-Q exchanges per epoch against the Q x N line, a check of this "
        "project's exchange."),
    "kakurenbo": (
        f"{_KAKURENBO}. Ours: wall time saved, work skipped, overhead and accuracy change per maximum "
        "hiding fraction F, on Fashion-MNIST at one small world size; the paper's result is a fraction of "
        "training time saved at an accuracy change (papers.yaml kakurenbo_time)."),
}


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
    paper_figures=_PAPER_FIGURES,
)
