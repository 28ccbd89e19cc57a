"""Heterogeneous-memory study: a differential-tracing runtime estimator for data placement and a
placement agent on top (after Denoyelle, Gerofi et al., ISC 2022).

    kernels.c    mini-app kernels with named objects: STREAM triad, 3-D stencil, CG, GUPS, an MLP step
    trace        compile, run untraced and under valgrind lackey, parse the trace (streaming, checked)
    layout       objects -> pages and ranges; placements as page masks (unknown names/ranges refused)
    reference    the SIMULATED reference: pycachesim hierarchy + two memory tiers with a timing model
    estimator    differential tracing from the sampled traces of the all-fast and all-slow runs
    agent        gymnasium placement env, greedy / random baselines, stable-baselines3 PPO
    compute      what the task app's task body runs: one application end to end
    sweep        the points of a validated config (one per app) and the settings they compute from
    checks       config checks beyond the schema
    tables       raw/ -> tables/; figures: tables/ -> figures/; claims: tables/ -> claims
    gpu_probe    real GPU-memory vs pinned-host placements where CUDA exists (lead's GPU command)
"""

from hpcdl.platform.study import StudySpec


def _task_units(cfg: dict) -> int | str:
    value = cfg["hetmem"]["computing_units"]
    return int(value) if str(value).isdigit() else value


def _setting(cfg: dict) -> str:
    b = cfg["hetmem"]
    return (f"kernels {'/'.join(a['name'] for a in b['apps'])}, LLC misses sampled 1 in {b['sample_every']}, "
            f"tiers {b['tiers']['fast']['name']} / {b['tiers']['slow']['name']} of a simulated reference")


SPEC = StudySpec(
    name="hetmem",
    title="Heterogeneous memory (differential-tracing estimator, placement agent; simulated tiers)",
    raw_tables=("traces", "validation", "policies"),
    tables=("tracing", "validation", "errors", "speed", "policies"),
    figures=("parity", "error_vs_sampling", "runtime_vs_fraction", "estimate_vs_reference_time"),
    task_units=_task_units,
    run_resources=lambda cfg: {"mem_mb": 3000, "runtime": 30},
    question=("Can two traced runs (all data in fast memory, all in slow) estimate an application's runtime "
              "under any placement of its data over two memory tiers, accurately and far faster than "
              "running it?"),
    headline="parity",
    setting=_setting,
)
