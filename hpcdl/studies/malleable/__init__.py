"""Malleability study (after Libutti, De Giusti and Naiouf 2021): training jobs whose thread count
changes while they run, and a co-scheduler that uses it, enforced with real cgroup CPU quotas.

    cgroups     v1 / v2 CPU quotas: detection, per-run cgroup tree, stale sweep, own-quota reading
    job         the malleable job (API / signal / quota requests applied at iteration boundaries)
    forkserver  job processes forked from a forkserver that has imported torch once (_preload)
    policies    rigid / equal share / proportional-to-remaining-work core assignment (pure)
    scheduler   the co-scheduler: arrivals, departures, failures, quota + thread enforcement
    response    single-job experiments: change response, oversubscription under a cut quota
    driver      one point in its own process group; supervisor cleanup of processes and cgroups
    compute     a task's point: run it in a driver, its output -> tidy rows (lags, latencies, costs)
    sweep       the points of a config; checks: config checks
    tables, figures, claims   the three analysis stages
"""

from hpcdl.platform import StudySpec


def _units(cfg: dict) -> int:
    # A point owns every core the study shares: points never overlap (they time each other otherwise).
    return int(cfg["malleable"]["cores"])


def _setting(cfg: dict) -> str:
    b = cfg["malleable"]
    return (f"{b['cores']} cores, {len(b['cosched']['jobs'])} job(s) under "
            f"{'/'.join(b['cosched']['policies'])} co-scheduling, thread changes requested by "
            f"{'/'.join(b['response']['methods'])}")


# Which paper figure each of ours re-draws (StudySpec.paper_figures). The paper's figures were not read
# for this project (resources/papers.yaml quotes its abstract), so no figure number is given.
_LIBUTTI = ("no direct counterpart identified in Libutti, De Giusti, Naiouf, Towards a Malleable Tensorflow "
            "Implementation (CCIS 2020; its figures were not read for this project)")
_JOBS = "PyTorch jobs under cgroup CPU quotas, not TensorFlow"
_PAPER_FIGURES = {
    "gantt": (
        f"{_LIBUTTI}. Ours: each job's wait and cores over time under the rigid and malleable policies; "
        f"{_JOBS}."),
    "policy_bars": (
        f"{_LIBUTTI}. Ours: makespan, mean turnaround and utilisation per policy; {_JOBS}."),
    "iter_time": (
        f"{_LIBUTTI}. Ours: iteration time per thread count, and under a cut quota with threads kept or "
        f"following it; {_JOBS}."),
    "utilisation": (
        f"{_LIBUTTI}. Ours: cores busy and cores allocated over time per policy; {_JOBS}."),
}


SPEC = StudySpec(
    name="malleable",
    title="Malleable thread counts and co-scheduling (API / signal / quota, cgroups)",
    short_title="Malleable threads",
    raw_tables=("points", "series", "changes", "decisions", "jobs"),
    tables=("response", "oversub", "policies", "jobs", "utilisation", "change_cost", "series"),
    figures=("gantt", "policy_bars", "iter_time", "utilisation"),
    task_units=_units,
    run_resources=lambda cfg: {"mem_mb": 3000, "runtime": 30},
    question=("Can a training job change its thread count while it runs, within an iteration, and does a "
              "co-scheduler that reshapes jobs finish a queue sooner than rigid allocation?"),
    headline="policy_bars",
    setting=_setting,
    paper_figures=_PAPER_FIGURES,
)
