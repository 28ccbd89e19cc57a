"""Micro-batched convolution study (after μ-cuDNN): per-kernel micro-batch division by DP and ILP.

Two experiments, one subpackage each, behind the study's stage modules:

choice/     the per-kernel algorithm choice among what PyTorch has (oneDNN, native im2col, cuDNN's
            benchmark/heuristic modes), benchmarked, planned, executed as whole networks and vetted: what
            every run measures (compute.run_network)
cudnn/      μ-cuDNN's own experiment on CUDA (microbatch.cudnn.engines): cuDNN's engines by id under
            workspace limits, their engine table, plans, execution and why dividing pays or not
            (compute.run_cudnn_network; `python -m hpcdl.studies.microbatch.cudnn.engine_table`)
common/     what both plan with: the networks' conv layers (workloads) and μ-cuDNN's two planners, the DP
            per kernel (dp) and the ILP under one network budget (ilp); pure, no torch

cudnn/ also runs the choice experiment's kernels (choice.algorithms.KernelCall: a layer's full-batch
tensors, the framework's default as reference), timing rounds (choice.bench) and float64 results
(choice.exact); choice/ never imports cudnn/.

compute     one network point (what the task app runs): benchmark, plan, execute, check exactness
sweep       the network points of a validated config; checks: config checks beyond the schema
tables      raw/ -> tables/; figures: tables/ -> figures/; claims: tables/ -> claims; paper: the
            published rows beside ours
"""

from hpcdl.platform import StudySpec, computing_units_of


def _setting(cfg: dict) -> str:
    from hpcdl.studies.microbatch.cudnn.plan import cudnn_networks, network_limits_mib

    b = cfg["microbatch"]
    cudnn = b.get("cudnn") or {}
    engines = ""
    if cudnn.get("engines"):
        per = []
        for net in cudnn_networks(b):
            limits = "/".join(f"{v:g}" for v in sorted({*network_limits_mib(b, net), 64.0}))
            per.append(f"{net} ({limits} MiB)")
        engines = (f"; on CUDA, μ-cuDNN on cuDNN engines by id at batch {b['batch_size']}: "
                   f"{', '.join(per)} per-kernel limits (WR, the DP; 64: the library's default), each pooled "
                   "over the network's kernels for WD (the ILP)")
    deepbench = (f", DeepBench {b.get('deepbench_layers', 'subset')} x{b['deepbench_scale']:g}"
                 if "deepbench" in {*b["networks"], *(cudnn.get("networks") or [])} else "")
    return (f"{'/'.join(b['networks'])} conv layers at batch {b['batch_size']}, image {b['image_size']}"
            f"{deepbench}, policies {'/'.join(b['policies'])}{engines}")


# Which paper figure each of ours re-draws (StudySpec.paper_figures). The paper's figures were not read
# for this project (resources/papers.yaml quotes its abstract, the thesis summary and the authors'
# README), so no figure number is given; each entry names the published result nearest to it instead.
_UCUDNN = ("no direct counterpart identified in Oyama, Ben-Nun, Hoefler, Matsuoka, mu-cuDNN (IEEE CLUSTER "
           "2018, arXiv 1804.04806; its figures were not read for this project)")
_PAPER_FIGURES = {
    "layer_speedup": (
        f"{_UCUDNN}. Ours: each layer's speedup of the executed ILP plan, timed inside whole-network "
        "rounds, among PyTorch's algorithms (oneDNN and im2col on the CPU, cudnn.benchmark modes on "
        "CUDA), not cuDNN algorithms chosen by id on P100 / V100."),
    "budget_speedup": (
        f"{_UCUDNN}. Ours: the predicted network conv speedup against the total workspace budget the ILP "
        "shares, with the executed plans measured at the default's workspace; the nearest published "
        "results are the AlexNet and ResNet-18 speedups on P100-SXM2 and V100 (papers.yaml alexnet_p100, "
        "resnet18_p100, alexnet_v100, resnet18_v100)."),
    "microbatch_sizes": (
        f"{_UCUDNN}. Ours: the micro-batch division and algorithm the ILP chose for every layer and kernel "
        "(policy all)."),
    "predicted_vs_measured": (
        f"{_UCUDNN}. Ours: the plan time predicted from the benchmarked kernels against the measured "
        "whole-network time of the executed plan."),
    "cudnn_limits": (
        f"{_UCUDNN}. Ours: on CUDA only, the speedup over the fastest undivided cuDNN engine within the "
        "same per-kernel workspace limit, against that limit (the configured limits and the library "
        "default, 64 MiB), engines run by id; the nearest published setting is the authors' README's "
        "DeepBench run on P100 at 128, 256 and 512 MiB limits (papers.yaml deepbench_p100_limits)."),
    "cudnn_kernels": (
        f"{_UCUDNN}. Ours: on CUDA only, each network's conv time per iteration under each workspace limit, "
        "split into its layers and kernels: the undivided cuDNN baseline, the DP per kernel (WR) and the ILP "
        "network budget (WD), with the speedup and the kernels divided; the nearest published results are "
        "the AlexNet and ResNet-18 speedups (papers.yaml alexnet_p100, resnet18_p100, alexnet_v100, "
        "resnet18_v100)."),
    "cudnn_deepbench": (
        f"{_UCUDNN}; the nearest is the spcl/ucudnn README's DeepBench figure "
        "(misc/deepbench_3x3_5x5.png: DeepBench's 3x3 and 5x5 layers on a P100-SXM2, mini-batch 256, "
        "128/256/512 MiB; papers.yaml deepbench_p100_limits), read as its caption only. Ours: on CUDA "
        "only, each DeepBench layer's speedup of the DP per kernel (WR) over the undivided baseline at each "
        "limit, 3x3 and 5x5 layers apart, the README's maxima beside."),
    "cudnn_why": (
        f"{_UCUDNN}. Ours: on CUDA only, why dividing pays or not per kernel and limit, read off the run's "
        "engine table: the kernels by cause, the fastest engine's workspace at each micro-batch size and the "
        "per-call overhead."),
}


SPEC = StudySpec(
    name="microbatch",
    title="Micro-batched convolutions (μ-cuDNN: DP + ILP under a workspace limit)",
    short_title="Micro-batched convolutions",
    raw_tables=("bench", "plans", "budget", "execution", "network_rounds", "exactness", "planning",
                "stack_vetting", "cudnn_engines", "cudnn_limits"),
    tables=(
        "network_speedup",
        "network_rounds",
        "layer_speedup",
        "budget_speedup",
        "plans",
        "planning_cost",
        "stack_vetting",
        "exactness",
        "failures",
        "cudnn_limits",
        "cudnn_networks",
        "cudnn_engines",
        "cudnn_why",
    ),
    figures=("layer_speedup", "budget_speedup", "microbatch_sizes", "predicted_vs_measured", "cudnn_limits",
             "cudnn_kernels", "cudnn_deepbench", "cudnn_why"),
    task_units=computing_units_of("microbatch"),
    devices=("cpu", "cuda"),
    task_gpus=lambda cfg: 1,  # on CUDA each network's task holds one GPU
    run_resources=lambda cfg: {"mem_mb": 4000, "runtime": 60},
    question=("Does dividing each convolution's mini-batch into micro-batches, planned per layer (DP) and "
              "over a network's workspace budget (ILP), make the network's convolutions faster?"),
    headline="budget_speedup",
    setting=_setting,
    paper_figures=_PAPER_FIGURES,
)
