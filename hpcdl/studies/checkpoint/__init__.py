"""The checkpoint-cost study: what saving and restoring deep-learning training state costs.

    formats      torch.save / safetensors / DCP / HDF5 / npz writers and readers
    state        nested training state <-> flat tensors any format can hold
    integrity    temp dir + fsync + rename commit, sha256 manifest, verification
    saver        synchronous saves, CheckFreq-style async saves (DCP's included), verified loads
    instruments  synthetic state, D2H ceiling, page-cache warm-up, peak RSS and scratch budget of an
                 I/O point (and the DCP ranks points' own storage probe)
    fio          the storage ceiling from fio: write + fsync of the state's size, before and after
    compute      what the task app's task bodies run: one (format, mode, size) I/O point, and the
                 DCP-ranks point, resume check and overhead run it exposes from the two below
    distributed  DCP save/load from N torch.distributed ranks (sharded DTensors)
    training     training-state checkpoints: bit-identical resume, overhead vs interval, Young/Daly
    sweep        the sweep points of a validated config; checks: config checks beyond the schema
    tables       raw/ -> tables/; figures: tables/ -> figures/; claims: tables/ -> claims

On CUDA (checkpoint.device) the state lives on the GPU: the synchronous save includes the
device-to-host copy, the asynchronous one blocks for a snapshot into pinned host memory, DCP runs
from GPU ranks over NCCL, resume lands on the GPU, and the ceiling adds the D2H copy ceiling to fio's.
"""

from hpcdl.platform import StudySpec, computing_units_of


def _task_gpus(cfg: dict) -> int:
    """GPUs each task holds on cuda: one for a single-process point, one per rank for the largest DCP
    launch. Every task holds the same count (one variable per study), as every timed task already
    holds all the cores: no two timed points overlap."""
    return max([1, *cfg["checkpoint"]["dcp_ranks"]])


def _run_resources(cfg: dict) -> dict:
    block = cfg["checkpoint"]
    # the largest fp32 state held about five times: state, snapshot, staging, loaded copy, slack
    return {"mem_mb": max(2000, 5 * 4 * block["sizes"]["max_params"] // 2**20), "runtime": 60,
            # the DCP points start their ranks with srun inside this N-task allocation
            "tasks": max([1, *block["dcp_ranks"]]), "mpi": "srun"}


def _setting(cfg: dict) -> str:
    b = cfg["checkpoint"]
    mib = [4 * b["sizes"][k] / 2**20 for k in ("min_params", "max_params")]
    return (f"{'/'.join(b['formats'])} x {'/'.join(b['modes'])} at {b['sizes']['points']} state sizes of "
            f"{mib[0]:g}-{mib[1]:g} MiB fp32, {b['repeats']} repeats, DCP on {b['dcp_ranks']} ranks")


# Which paper figure each of ours re-draws (StudySpec.paper_figures). The paper's figures were not read
# for this project (resources/papers.yaml quotes its abstract's scope), so no figure number is given.
_ROJAS = ("no direct counterpart identified in Rojas, Kahira, Meneses, Bautista-Gomez, Badia (arXiv "
          "2012.00825; its figures were not read for this project)")
_PYTORCH = "saved from PyTorch only, where the paper compares Chainer, PyTorch and TensorFlow"
_PAPER_FIGURES = {
    "save_load_time": (
        f"{_ROJAS}. Ours: save and verified load time against the state size per format; {_PYTORCH}."),
    "bandwidth": (
        f"{_ROJAS}. Ours: write bandwidth per format against the storage ceiling measured in the same run."),
    "blocking": (
        f"{_ROJAS}. Ours: the training stall of a synchronous and a CheckFreq-style asynchronous save "
        "against the state size (asynchronous saving is not in the paper's abstract)."),
    "overhead": (
        f"{_ROJAS}. Ours: training overhead against the checkpoint interval, with the Young/Daly optima "
        "from the measured cost."),
    "bytes_on_disk": (
        f"{_ROJAS}. Ours: bytes on disk per format against the raw tensor bytes (the abstract names file "
        f"sizes); {_PYTORCH}."),
    "dcp_ranks": (
        f"{_ROJAS}. Ours: torch.distributed.checkpoint save and load time from 1 to a few ranks of one "
        "machine (the abstract names the impact of scale)."),
}


SPEC = StudySpec(
    name="checkpoint",
    title="Checkpoint cost (formats, sync vs async, resume, interval)",
    short_title="Checkpoint cost",
    raw_tables=("io", "resume", "overhead"),
    tables=("io_cost", "async_repeats", "bandwidth_repeats", "resume", "overhead", "young_daly", "failures"),
    figures=("save_load_time", "bandwidth", "blocking", "overhead", "bytes_on_disk", "dcp_ranks"),
    task_units=computing_units_of("checkpoint"),
    task_gpus=_task_gpus,
    devices=("cpu", "cuda"),
    run_resources=_run_resources,
    question=("What does saving and restoring deep-learning training state cost in each format, and how much "
              "of it does asynchronous (CheckFreq-style) checkpointing hide from training?"),
    headline="blocking",
    setting=_setting,
    paper_figures=_PAPER_FIGURES,
)
