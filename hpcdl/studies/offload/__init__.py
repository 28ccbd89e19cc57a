"""The memory-offload study (after Myelin / AxoNN, ZeRO-Offload): optimizer state and saved
activations moved to a slower memory tier, the copies overlapped with compute.

    accounting   the fast tier's resident bytes under an enforced budget (tensor registry)
    slowtier     the slow tier: a file-backed store (CPU) or pinned host memory (CUDA), async copies
    timeline     compute / transfer / wait spans of a step; the hidden fraction of transfer time
    model        the MLP stack and its seeded synthetic batches
    optimizer    Adam with master weights and moments in the slow tier, streamed in buckets
    zero         ZeRO-Offload: parameters and gradients in the fast tier, masters, moments and the
                 Adam step on the host
    precision    the training precision (fp32, bf16, fp16), none's mixed-precision Adam, the weights' sample
    tolerance    how far apart two runs' weights may be when their Adam kernels differ (numpy only)
    activations  saved tensors kept (accounted) or packed to the slow tier and prefetched
    train        one measured training run under a strategy
    capacity     the largest depth that trains under the budget, per strategy
    compute      what the task app's task bodies run: a sweep point, a capacity search
    sweep        the points of a validated config and the slow-tier directory they share
    tiers        both tiers' bandwidths, measured by every sweep point: is the slow tier slower?
    checks       config checks beyond the schema; procs: process liveness (stale run directories)
    tables       raw/ -> tables/; figures: tables/ -> figures/; claims: tables/ -> claims
"""

from hpcdl.platform import StudySpec, computing_units_of


def _run_resources(cfg: dict) -> dict:
    m = cfg["offload"]["model"]
    # the largest point at the largest depth: none's 16 bytes per parameter (18 at bf16 / fp16), or
    # zero_offload's 2-8 in the fast tier and 18-20 on the host, so 24; + 8 per activation element. On
    # CPU it is all process memory, on a GPU the slow tier holds about as much in host memory
    largest = max(m["depths"]) * (24 * m["width"] ** 2 + 8 * m["batch"] * m["width"])
    return {"mem_mb": max(2000, 2 * largest // 2**20), "runtime": 60}


def _setting(cfg: dict) -> str:
    b = cfg["offload"]
    m = b["model"]
    return (f"MLP width {m['width']}, batch {m['batch']}, depths {m['depths']}, strategies "
            f"{'/'.join(b['strategies'])} at {b.get('precision', 'fp32')}, capacity under a "
            f"{b['capacity']['budget_mb']:g} MiB fast-tier budget")


# Which paper figure each of ours re-draws (StudySpec.paper_figures). Neither paper's figures were read
# for this project (resources/papers.yaml quotes their abstracts), so no figure number is given; each
# entry names the published result nearest to it instead.
_MYELIN = ("no direct counterpart identified in Singh and Bhatele, Myelin / AxoNN (IPDPS 2022, arXiv "
           "2110.13005) or Ren et al., ZeRO-Offload (arXiv 2101.06840); their figures were not read for this "
           "project")
_TIERS = "an MLP stack in place of transformer blocks, tiers the CPU analogue or GPU vs pinned host memory"
_PAPER_FIGURES = {
    "tradeoff": (
        f"{_MYELIN}. Ours: peak fast-tier memory against the median step time per strategy and depth; "
        f"{_TIERS}; the nearest published result is Myelin's memory reduction (papers.yaml memory_4x)."),
    "breakdown": (
        f"{_MYELIN}. Ours: a step's time split into forward, backward, optimizer and exposed transfer, per "
        f"strategy and depth; {_TIERS}."),
    "capacity": (
        f"{_MYELIN}. Ours: the largest model that trains under the fast-tier budget per strategy; "
        f"{_TIERS}; the nearest published results are ZeRO-Offload's model size on one GPU and Myelin's "
        "parameters per GPU (papers.yaml zero_offload_10x, throughput_13pct)."),
    "timeline": (
        f"{_MYELIN}. Ours: one measured step's compute, copies and waits on their lanes."),
}


SPEC = StudySpec(
    name="offload",
    title="Memory offload (optimizer state and activations to a slower tier)",
    short_title="Memory offload",
    raw_tables=("steps", "timeline", "capacity"),
    tables=("tradeoff", "capacity", "tiers", "failures"),
    figures=("tradeoff", "breakdown", "capacity", "timeline"),
    task_units=computing_units_of("offload"),
    devices=("cpu", "cuda"),
    task_gpus=lambda cfg: 1,  # on CUDA every point holds one GPU: its fast tier
    run_resources=_run_resources,
    question=("How much fast-tier memory does moving optimizer state and saved activations to a slower tier "
              "save, how much of the copy time hides behind compute, and how much larger a model fits?"),
    headline="tradeoff",
    setting=_setting,
    paper_figures=_PAPER_FIGURES,
)
