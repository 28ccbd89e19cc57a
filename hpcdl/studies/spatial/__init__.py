"""Spatial scaling study: halo-exchange partitioned Conv3d, CosmoFlow-like hybrid training, analysis.

    partition    index arithmetic of spatially partitioned windowed ops along one axis (pure)
    devices      where a rank's tensors live (compute vs comm device, host staging) and GPU timing
    halo         halo exchange along one partitioned axis as an autograd Function
    overlap      a depth-partitioned conv3d whose halo exchange is hidden behind compute
    buckets      gradient all-reduce in buckets launched during the backward
    groups       hybrid data x spatial process groups
    model        CosmoFlow-like 3D CNN, whole (reference) or spatially partitioned
    data         Gaussian random fields with a power-law spectrum, cached as .npy files
    load         the machine's other load during a timed phase, from /proc
    train        the rank function of one hybrid data x spatial training run
    exactness    rank functions comparing the partitioned ops and model with the whole ones
    calibration  the measurements that calibrate the oracle (subpackage): the microbenchmarks run on
                 the study's ranks, and the GPU calibration at the papers' slab shapes
                 (python -m hpcdl spatial calibrate)
    perfmodel    the ParaDL-style oracle (pure, no other spatial module): the machine it prices on, its
                 strategy families and pick, its fit of the microbenchmarks, the papers' slab shapes and
                 layouts the GPU calibration times, and how it reads a GPU calibration's table
    paper_scale  the oracle at exactly the papers' settings, on assumed or GPU-calibrated compute: the
                 predictions, the compute term's check, the breakdown beside the published speedups
    paper        each published result (resources/papers.yaml) -> this run's table or claim, for the report
    sweep        the scaling runs of a config, what each unit of work reads of it, and the layer
                 shapes of the held-out runs the oracle is judged on out of sample
    compute      the units of work the task bodies (tasks/spatial.py) call
    tables, figures, claims   the analysis stages (claim_families: the claims, family by family);
                 summary: a digest of one run's claims
    checks       config checks beyond the schema
"""

from hpcdl.platform import StudySpec


def _largest_run(cfg: dict) -> int:
    from hpcdl.studies.spatial.sweep import expand

    return max(p["ranks"] for p in expand(cfg["spatial"]))


def _committed_calibrations(cfg: dict) -> tuple[str, ...]:
    """The GPU calibrations the paper predictions may read (<data.resources_dir>/calibration/), so that
    committing one reruns the stages, and the published results the breakdown sets beside them
    (<data.resources_dir>/papers.yaml, where it exists)."""
    from pathlib import Path

    papers = Path(cfg["data"]["resources_dir"]) / "papers.yaml"
    published = (str(papers),) if papers.exists() else ()
    if cfg["spatial"]["gpu_calibration"]["use"] == "none":
        return published
    found = Path(cfg["data"]["resources_dir"]) / "calibration"
    cals = sorted(found.glob("*.csv")) + sorted(found.glob("*.provenance.json"))
    return published + tuple(str(p) for p in cals)


def _setting(cfg: dict) -> str:
    b = cfg["spatial"]
    return (f"strong scaling at {b['strong']['grid']}^3, weak at {b['weak']['grid']}^3 per rank, up to "
            f"{_largest_run(cfg)} ranks; paper-scale predictions at {b['extrapolate']['grid']}^3 from the "
            "oracle")


# Which paper figure each of ours re-draws (StudySpec.paper_figures). Neither paper's figures were read
# for this project (resources/papers.yaml quotes the thesis summary and the oracle's abstract), so no
# figure number is given; each entry names the published result nearest to it instead.
_OYAMA = ("no direct counterpart identified in Oyama et al., IEEE TPDS 32(7) 2021 (its figures were not "
          "read for this project)")
_KAHIRA = ("no direct counterpart identified in Kahira et al., the ParaDL oracle (arXiv 2104.09075; its "
           "figures were not read for this project)")
_PAPER_FIGURES = {
    "strong_scaling": (
        f"{_OYAMA}. Ours: time per iteration per layout on a fixed global input, stacked by compute, "
        "exposed halo, gather, all-reduce and I/O, for a CosmoFlow-like model on a small grid over a few "
        "ranks of one machine, not CosmoFlow 512^3 on 512-2048 V100s; the nearest published result is the "
        "thesis summary's CosmoFlow speedup 512 -> 2048 GPUs (papers.yaml cosmoflow_strong_512_to_2048)."),
    "weak_scaling": (
        f"{_OYAMA}. Ours: time per iteration with the same slab per rank as the depth ranks grow, stacked "
        "as strong_scaling; papers.yaml holds no published weak-scaling result."),
    "efficiency": (
        f"{_OYAMA}. Ours: the 2-rank speedup beside this machine's own no-communication ceiling measured "
        "in the same run (a bar of this project's, not the paper's)."),
    "oracle_parity": (
        f"{_KAHIRA}. Ours: the oracle's predicted against measured iteration time of this run's training "
        "runs, calibrated in the same run, held-out runs out of sample; the paper's result is a mean "
        "accuracy over 6 strategies, 4 models and up to 1024 V100s (papers.yaml oracle_accuracy)."),
    "extrapolation": (
        f"{_KAHIRA}. Ours: the oracle's best configuration per strategy family and GPU count for CosmoFlow "
        "on the machine described in spatial.machine; model only."),
    "paper_predictions": (
        f"{_OYAMA}. Ours: the oracle's predicted time per iteration and speedup at the papers' settings "
        "(CosmoFlow 512^3, mini-batch 64, 512-2048 GPUs; 3D U-Net 256^3, mini-batch 16, 256-512 GPUs), "
        "model only, beside the thesis summary's speedups (papers.yaml cosmoflow_strong_512_to_2048, "
        "unet_strong_256_to_512)."),
    "paper_sensitivity": (
        f"{_OYAMA}. Ours: how the predicted speedups of paper_predictions move with each assumption of "
        "spatial.assumptions; model only, this project's own."),
    "memory": (
        f"{_OYAMA}. Ours: measured peak memory growth per rank and the oracle's modelled memory against "
        "the ranks, on this machine."),
    "loss": (
        f"{_OYAMA}. Ours: training loss per iteration on synthetic Gaussian random fields (amplitude and "
        "spectral index), not the paper's data set."),
}


SPEC = StudySpec(
    name="spatial",
    title="Spatial scaling (hybrid data x spatial 3D CNN)",
    short_title="Spatial scaling",
    raw_tables=("exactness", "calibration", "runs", "iterations", "ranks"),
    tables=("runs", "repeat_times", "oracle_repeats", "loss", "exactness", "calibration_fit", "extrapolation",
            "strategy_choice", "paper_predictions", "paper_bases", "paper_sensitivity", "paper_breakdown",
            "compute_check"),
    figures=("strong_scaling", "weak_scaling", "efficiency", "oracle_parity", "extrapolation",
             "paper_predictions", "paper_sensitivity", "memory", "loss"),
    # the largest run's ranks x threads, so no two timed runs overlap
    task_units=lambda cfg: _largest_run(cfg) * cfg["spatial"]["threads_per_rank"],
    # the batch step starts each run's ranks with srun inside this N-task allocation
    task_gpus=_largest_run,  # one GPU per rank of its largest launch
    devices=("cpu", "cuda"),
    run_resources=lambda cfg: {"mem_mb": 4000, "runtime": 30, "tasks": _largest_run(cfg), "mpi": "srun"},
    stage_files=_committed_calibrations,
    question=("Does partitioning a 3D CNN's volume over ranks scale efficiently, and does a ParaDL-style "
              "oracle predict its time well enough to choose the parallel strategy?"),
    headline="efficiency",
    setting=_setting,
    paper_figures=_PAPER_FIGURES,
)
