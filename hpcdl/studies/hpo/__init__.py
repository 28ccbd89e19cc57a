"""Hyperparameter optimisation study: Optuna ask-and-tell driving trial tasks trained in epoch chunks.

    sweep     which Optuna studies a config runs, in order (grid per worker count, samplers, pruned)
    space     search spaces, Optuna sampler and pruner factories
    compute   one trial's training in resumable epoch chunks (what the task bodies call)
    driver    the ask-and-tell loop in the app: submits chunks, reports epochs, asks the pruner
    storage   the Optuna journal, resuming after a killed driver, the best trial's state
    records   tidy rows from the journal (trials, intermediate values, studies, run counts)
    checks    config checks; tables, figures, claims: the three analysis stages
"""

from hpcdl.platform import StudySpec, computing_units_of


def _run_threads(cfg: dict) -> int:
    """Concurrent trials at most (Snakemake caps this at --cores)."""
    return max([*cfg["hpo"]["grid"]["workers"], cfg["hpo"]["workers"]])


def _setting(cfg: dict) -> str:
    b = cfg["hpo"]
    return (f"{b['n_trials']}-trial searches ({b['sampler']} sampler, {b['pruner']} pruner, models "
            f"{'/'.join(b['space']['model'])}), a grid on {b['grid']['workers']} "
            f"{'GPUs' if b.get('device') == 'cuda' else 'workers'}"
            + (f" on {b['grid']['train_limit']} images" if b["grid"].get("train_limit") else "")
            + f", {b['data']['train_limit'] or 'all'} training images")


# Which paper figure each of ours re-draws (StudySpec.paper_figures). The paper's figures were not read
# for this project (resources/papers.yaml quotes a thesis record and the authors' repository), so no
# figure number is given.
_PDML = ("no direct counterpart identified in Kahira, Bautista-Gomez, Badia (PDML'19; its figures were not "
         "read for this project)")
_OPTUNA = "Optuna's plot of this project's own searches, which go beyond the paper's grid"
_PAPER_FIGURES = {
    "best_so_far": (
        f"{_PDML}. Ours: the best validation accuracy against wall time per search (the grid, random, TPE "
        "and the pruned sampler)."),
    "grid_scaling": (
        f"{_PDML}. Ours: the whole grid's elapsed time and speedup against the workers (CPU workers, or "
        "one GPU per worker on CUDA); the grid follows the authors' repository (papers.yaml grid)."),
    "optuna_param_importances": (
        f"{_PDML}. Ours: {_OPTUNA}."),
    "optuna_parallel_coordinate": (
        f"{_PDML}. Ours: {_OPTUNA}."),
    "optuna_intermediate_values": (
        f"{_PDML}. Ours: {_OPTUNA} (the pruned one)."),
}


SPEC = StudySpec(
    name="hpo",
    title="Hyperparameter optimisation (Optuna on PyCOMPSs tasks)",
    short_title="Hyperparameter search",
    raw_tables=("trials", "intermediate", "studies"),
    tables=("trials", "intermediate", "best_so_far", "grid_scaling", "best_config", "pruning"),
    figures=("best_so_far", "grid_scaling", "optuna_param_importances", "optuna_parallel_coordinate",
             "optuna_intermediate_values"),
    task_units=computing_units_of("hpo"),
    # On cuda every trial task (and the warm-up and test tasks) holds one GPU of its own; a grid on
    # w workers is then a grid on w GPUs (sweep.check_gpu_workers).
    devices=("cpu", "cuda"),
    task_gpus=lambda cfg: 1,
    # concurrent trials hold a GPU each: the run job needs the most workers any study or the grid uses
    job_gpus=lambda cfg: max([cfg["hpo"]["workers"], *cfg["hpo"]["grid"]["workers"]]),
    # The journal (results/hpo/journal/) is no declared output, so Snakemake never deletes it and a
    # rerun after a crash continues the studies.
    run_resources=lambda cfg: {"mem_mb": 4000, "runtime": 60},
    run_threads=_run_threads,
    question=("How much sooner does a hyperparameter search finish when its trials run as parallel PyCOMPSs "
              "tasks, and how much training does pruning save without losing the best configuration?"),
    headline="grid_scaling",
    setting=_setting,
    paper_figures=_PAPER_FIGURES,
)
