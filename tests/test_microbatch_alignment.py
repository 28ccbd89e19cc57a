"""Alignment of micro-batch views and which cuDNN plan runs at which offset (issue 42), on the
study's real layer shapes: hpcdl.studies.microbatch.cudnn.alignment, pure and CPU-only. The plan names and
workspaces in PLANS are HAND-MADE inputs of the decision; every shape and offset is the study's."""

from __future__ import annotations

import pytest

from hpcdl.studies.microbatch.common.dp import KernelDP, policy_sizes
from hpcdl.studies.microbatch.common.workloads import alexnet, resnet18
from hpcdl.studies.microbatch.cudnn import alignment as al

MiB = 2**20
CONV1_227 = 3 * 227 * 227 * 4  # AlexNet conv1's fp32 input sample at 227x227: the H200 run's case
SIZES = policy_sizes("powerOfTwo", 64)  # configs/gpu.yaml: batch 64, policies undivided + powerOfTwo


def test_alignment_arithmetic():
    assert CONV1_227 == 618_348 and CONV1_227 % 16 == 12
    assert [al.pow2_alignment(n) for n in (0, 1, 4, 12, 24, 618_348, 2 * 618_348, 4096)] == [
        16, 1, 4, 4, 8, 4, 8, 16]
    assert al.pow2_alignment(4096, cap=256) == 256
    # every offset k * b * sample: b = 1 -> 4 bytes, 2 -> 8, 4 and up -> 16 (the cap)
    assert [al.offset_alignment(CONV1_227, b) for b in (1, 2, 4, 8, 64)] == [4, 8, 16, 16, 16]
    assert al.offset_alignment(CONV1_227, 1, cap=256) == 4
    assert al.offset_alignment(CONV1_227, 64, cap=256) == 256  # 64 x 618 348 = 2^8 x 154 587
    assert al.offset_alignment(4096, 1, base_alignment=8) == 8  # never more than the base address
    # within a batch: the full batch has only offset 0, the base's alignment
    assert al.offset_alignment(CONV1_227, 64, batch=64) == 16
    assert al.offset_alignment(CONV1_227, 33, batch=64) == 16  # 33 fits once
    assert al.offset_alignment(CONV1_227, 32, batch=64) == 16
    assert al.offset_alignment(CONV1_227, 3, batch=64) == 4
    assert al.starts(64, 16) == [0, 16, 32, 48] and al.starts(10, 4) == [0, 4]
    assert al.offset_alignment(0, 1) == 16  # a tensor never offset (the filter)
    with pytest.raises(ValueError, match="cap must be a power of two"):
        al.pow2_alignment(8, cap=12)
    with pytest.raises(ValueError, match="base_alignment must be a power of two"):
        al.offset_alignment(CONV1_227, 1, base_alignment=0)
    with pytest.raises(ValueError, match="micro-batch 65 is not within the batch size 1..64"):
        al.offset_alignment(CONV1_227, 65, batch=64)


def test_a_frontend_that_cannot_declare_alignment_refuses_only_graphs_below_16_bytes():
    """nvidia-cudnn-frontend 1.32 (the H200 run, 2026-11-26) lowers every graph tensor at 16 bytes."""
    conv1 = alexnet(227)[0]
    fwd1 = al.declared_alignment(al.operands(conv1, "forward"), 1, 64)
    why = al.undeclarable(fwd1, 1, "nvidia-cudnn-frontend 1.32.0")
    assert why.startswith("at micro-batch 1, x is 4-byte aligned at some offset; "
                          "nvidia-cudnn-frontend 1.32.0 cannot declare a tensor's alignment")
    dgrad2 = al.declared_alignment(al.operands(conv1, "backward_data"), 2, 64)
    refused = al.undeclarable(dgrad2, 2, "f")
    assert "dx is 8-byte aligned" in refused and "dy" not in refused
    assert al.undeclarable(al.declared_alignment(al.operands(conv1, "forward"), 4, 64), 4, "f") == ""
    for layer in alexnet(224) + resnet18(224):  # the study's shapes: nothing is refused
        for kernel in al.ROLES:
            assert all(al.undeclarable(al.declared_alignment(al.operands(layer, kernel), b, 64), b, "f") == ""
                       for b in SIZES), (layer, kernel)


def test_the_study_layers_sample_sizes_and_fully_aligned_micro_batches():
    conv1 = alexnet(227)[0]
    ops = al.operands(conv1, "forward")
    assert [(o.role, o.sample_bytes) for o in ops] == [("x", CONV1_227), ("w", 0), ("y", 64 * 56 * 56 * 4)]
    # the study's own image size (configs/gpu.yaml, paper.yaml: 224): every size of every layer
    for layers in (alexnet(224), resnet18(224)):
        for layer in layers:
            assert al.fully_aligned_sizes(layer, 64, SIZES) == SIZES, layer
    assert al.operands(alexnet(224)[0], "forward")[0].sample_bytes == 602_112  # 3 x 224^2 x 4, 2^12-aligned
    assert al.operands(resnet18(224)[0], "forward")[0].sample_bytes == 602_112
    # at 227x227 only conv1's 3-channel input is off: micro-batches 1 and 2 are not 16-aligned
    for layers in (alexnet(227), resnet18(227)):
        assert al.fully_aligned_sizes(layers[0], 64, SIZES) == [4, 8, 16, 32, 64]
        assert all(al.fully_aligned_sizes(ly, 64, SIZES) == SIZES for ly in layers[1:])
    assert al.declared_alignment(al.operands(conv1, "forward"), 1, 64) == {"x": 4, "w": 16, "y": 16}
    assert al.declared_alignment(al.operands(conv1, "backward_data"), 2, 64) == {"dy": 16, "w": 16, "dx": 8}
    wgrad = al.declared_alignment(al.operands(conv1, "backward_filter"), 1, 64)
    assert wgrad == {"x": 4, "dy": 16, "dw": 16}
    assert al.declared_alignment(al.operands(conv1, "forward"), 64, 64) == {"x": 16, "w": 16, "y": 16}
    # a full tensor at a less aligned address declares no more than that address has
    ops = al.operands(conv1, "forward", bases={"x": 8, "w": 4})
    assert al.declared_alignment(ops, 4, 64) == {"x": 8, "w": 4, "y": 16}


PLANS = {0: ("eng0 k1", 0), 1: ("eng1 k2", 600 * MiB), 3: ("eng3", 4 * MiB)}  # HAND-MADE names/sizes
REFUSED = {2: "cudnnGraphNotSupportedError: no kernel for this configuration"}


def test_what_the_h200_run_built_skips_the_plan_with_the_offset_never_crashing():
    """conv1 at 227x227, forward, b = 1 with the frontend's default declaration (16 bytes for every
    tensor): what raised from the timing loop is now a skipped row naming the first bad offset."""
    ops = al.operands(alexnet(227)[0], "forward")
    default = {"x": 16, "w": 16, "y": 16}
    got = {d.index: d for d in al.decide(PLANS, REFUSED, ops, default, al.starts(64, 1), 512 * MiB)}
    assert [got[i].status for i in range(4)] == ["skipped", "over_limit", "skipped", "skipped"]
    assert got[0].reason == (
        "cannot run at 48 of 64 micro-batch offsets: x at sample 1 (byte offset 618348) is 4-byte "
        "aligned; the graph declares 16")
    assert got[3].reason == got[0].reason and got[3].engine == "eng3" and got[3].workspace_bytes == 4 * MiB
    assert got[1].reason == f"needs {600 * MiB} bytes > the largest limit {512 * MiB}"
    assert got[2].reason == REFUSED[2] and got[2].engine == "" and got[2].workspace_bytes == -1
    # declared as the tensors really are: every built plan within the limit runs at every offset
    real = al.declared_alignment(ops, 1, 64)
    got = {d.index: d for d in al.decide(PLANS, REFUSED, ops, real, al.starts(64, 1), 512 * MiB)}
    assert [got[i].status for i in range(4)] == ["run", "over_limit", "skipped", "run"]
    assert got[0].starts == tuple(range(64)) and got[0].reason == ""


@pytest.mark.parametrize("image", [224, 227])
def test_every_offset_of_every_study_layer_runs_as_declared(image):
    """Per (layer, kernel, micro-batch, offset) of AlexNet and ResNet-18 at batch 64: with the real
    declaration every plan runs; with the default 16 exactly the misaligned cells are skipped."""
    skipped = set()
    for layer in (*alexnet(image), *resnet18(image)):
        for kernel in al.ROLES:
            ops = al.operands(layer, kernel)
            for b in SIZES:
                offs = al.starts(64, b)
                real = al.declared_alignment(ops, b, 64)
                assert all(d.status == "run" for d in al.decide(PLANS, {}, ops, real, offs, 1e12))
                default = dict.fromkeys(real, 16)
                if any(d.status == "skipped" for d in al.decide(PLANS, {}, ops, default, offs, 1e12)):
                    skipped.add((layer.name, kernel, b))
    want = {("conv1", k, b) for k in ("forward", "backward_data", "backward_filter") for b in (1, 2)}
    assert skipped == (want if image == 227 else set())


def test_probe_offsets_visit_each_address_class_once():
    ops = al.operands(alexnet(227)[0], "forward")
    assert al.probe_offsets(ops, al.starts(64, 1)) == [0, 1, 2]
    assert al.probe_offsets(ops, al.starts(64, 2)) == [0, 2]
    assert al.probe_offsets(ops, al.starts(64, 4)) == [0]
    assert al.describe({"x": 4, "w": 16, "y": 16}) == "x:4 w:16 y:16"


def _binary_partitions(n: int, largest: int):
    """Every multiset of powers of two <= largest summing to n, largest part first."""
    if n == 0:
        yield []
        return
    p = largest
    while p >= 1:
        if p <= n:
            for rest in _binary_partitions(n - p, p):
                yield [p, *rest]
        p //= 2


def test_largest_first_puts_every_power_of_two_step_where_its_graph_runs():
    """Every division of 32 into powers of two, run largest first, places each step at an offset
    its size's graph (declared for the offsets 0, b, 2b, ...) runs at, for conv1 at 227x227; the
    DP's own order (smaller parts first) does not."""
    conv1 = alexnet(227)[0]
    count = 0
    for parts in _binary_partitions(32, 32):
        steps = al.execution_order([("e", b) for b in reversed(parts)])
        assert [b for _, b in steps] == parts
        for (_, b), s in zip(steps, al.step_starts(steps), strict=True):
            assert s % b == 0 and s in al.starts(32, b)
            for kernel in al.ROLES:
                ops = al.operands(conv1, kernel)
                assert al.misaligned(ops, al.declared_alignment(ops, b, 32), s) == []
        count += 1
    assert count == 202  # the binary partitions of 32
    # a real DP whose best division of 3 is 1 + 2 lists the 1 first: the 2 would start at sample 1
    dp = KernelDP({("e", 1): (1.0, 0.0), ("e", 2): (1.5, 0.0), ("e", 3): (10.0, 0.0)}, 3, "powerOfTwo")
    division = dp.division(dp.best()[0])
    assert division == [("e", 1), ("e", 2)]
    ops = al.operands(conv1, "forward")
    at1 = al.misaligned(ops, al.declared_alignment(ops, 2, 3), al.step_starts(division)[1])
    assert at1 == ["x at sample 1 (byte offset 618348) is 4-byte aligned; the graph declares 16"]
    ordered = al.execution_order(division)
    assert ordered == [("e", 2), ("e", 1)] and al.step_starts(ordered) == [0, 2]
    assert al.misaligned(ops, al.declared_alignment(ops, 1, 3), 2) == []
    # under policy all a step can still land off its benchmarked offsets (3 + 2: the 2 at sample 3)
    assert al.misaligned(ops, al.declared_alignment(ops, 2, 5), 3) == [
        "x at sample 3 (byte offset 1855044) is 4-byte aligned; the graph declares 8"]
