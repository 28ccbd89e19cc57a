"""Heterogeneous-memory study: a differential-tracing runtime estimator for data placement and a
placement agent on top (after Denoyelle, Gerofi et al., ISC 2022).

    kernels.c    mini-app kernels with named objects: STREAM triad, 3-D stencil, CG, GUPS, an MLP step
    trace        compile, run untraced and under valgrind lackey, parse the trace (streaming, checked)
    layout       objects -> pages and ranges; placements as page masks (unknown names/ranges refused)
    reference    the SIMULATED reference: pycachesim hierarchy + two memory tiers with a timing model
    estimator    differential tracing from the sampled traces of the all-fast and all-slow runs
    agent        gymnasium placement env, greedy / random baselines, stable-baselines3 PPO
    compute      what the task app's task body runs (run_point): on the CPU one application end to
                 end, on cuda the CUDA path's
    gpu          the CUDA path: each app's placements measured on the task's GPU, and their rows
    gpu_apps     the apps in torch, with named objects
    gpu_tiers    objects in GPU memory or in pinned host memory mapped into the GPU (zero-copy)
    gpu_placement  the placements, byte shares, estimate and agent at object granularity (pure)
    sweep        the points of a validated config (one per app) and the settings they compute from
    checks       config checks beyond the schema
    tables       raw/ -> tables/; figures: tables/ -> figures/; claims: tables/ -> claims
"""

from hpcdl.platform import StudySpec, computing_units_of


def _setting(cfg: dict) -> str:
    b = cfg["hetmem"]
    cpu = (f"kernels {'/'.join(a['name'] for a in b['apps'])}, LLC misses sampled 1 in {b['sample_every']}, "
           f"tiers {b['tiers']['fast']['name']} / {b['tiers']['slow']['name']} of a simulated reference")
    gpu = (f"kernels {'/'.join(a['name'] for a in b['apps'])} in torch at scale {b['gpu']['scale']:g}, tiers "
           "GPU memory / pinned host memory mapped into the GPU, measured (hardware)")
    device = b.get("device", "auto")
    if device != "auto":
        return cpu if device == "cpu" else gpu
    # under auto the device resolves where the task runs: both readings, each named
    return f"on the CPU: {cpu}; on a GPU: {gpu}"


# Which paper figure each of ours re-draws (StudySpec.paper_figures). The paper's figures were not read
# for this project (resources/papers.yaml quotes its abstract and the authors' repository), so no figure
# number is given; each entry names the published result nearest to it instead.
_ISC = ("no direct counterpart identified in Denoyelle, Gerofi, Iskra, Perarnau (ISC High Performance 2022; "
        "its figures were not read for this project)")
_PAPER_FIGURES = {
    "parity": (
        f"{_ISC}. Ours: the estimate against a simulated two-tier reference (CPU) or GPU memory vs mapped "
        "host memory (CUDA) for five small kernels, not the paper's mini-apps on KNL DRAM vs MCDRAM; the "
        "paper's result is a mean error (papers.yaml estimate_error)."),
    "error_vs_sampling": (
        f"{_ISC}. Ours: the estimate's mean error against the sampling period of the last-level-cache "
        "misses, per kernel."),
    "runtime_vs_fraction": (
        f"{_ISC}. Ours: the runtime of greedy, random and PPO placements relative to all-fast against the "
        "fast-memory capacity, simulated on the CPU, measured on a GPU."),
    "estimate_vs_reference_time": (
        f"{_ISC}. Ours: one estimate's wall time against one real run of the kernel; the paper states the "
        "speed without a number (papers.yaml estimate_speed)."),
}


SPEC = StudySpec(
    name="hetmem",
    title="Heterogeneous memory (differential-tracing estimator, placement agent; simulated tiers on the "
          "CPU, GPU memory vs mapped host memory on a GPU)",
    short_title="Heterogeneous memory",
    raw_tables=("traces", "validation", "policies"),
    tables=("tracing", "validation", "errors", "speed", "policies"),
    figures=("parity", "error_vs_sampling", "runtime_vs_fraction", "estimate_vs_reference_time"),
    task_units=computing_units_of("hetmem"),
    # the CUDA path (gpu.py) measures real placements where the device resolves to cuda; each app's
    # task then holds one GPU, whose memory is the fast tier
    devices=("cpu", "cuda"),
    task_gpus=lambda cfg: 1,
    run_resources=lambda cfg: {"mem_mb": 3000, "runtime": 30},
    question=("Can two traced runs (all data in fast memory, all in slow) estimate an application's runtime "
              "under any placement of its data over two memory tiers, accurately and far faster than "
              "running it?"),
    headline="parity",
    setting=_setting,
    paper_figures=_PAPER_FIGURES,
)
