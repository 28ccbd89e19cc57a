"""μ-cuDNN at its papers' settings (issue #58 item 1): the `microbatch` blocks of configs/gpu.yaml and
configs/paper.yaml, the keys they add (deepbench_layers, cudnn.networks, cudnn.deepbench_limits_mib,
cudnn.screen_ratio) and the errors naming them, DeepBench's 3x3 and 5x5 training layers, and what the
task app, the engine-table driver and the about page take from them. Nothing here runs a kernel.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from hpcdl.platform.kit.config import ConfigError, load_config, validate_config
from hpcdl.studies.microbatch import paper, sweep
from hpcdl.studies.microbatch.common.dp import policy_sizes
from hpcdl.studies.microbatch.common.workloads import (
    DEEPBENCH_TRAINING_3X3_5X5,
    alexnet,
    deepbench,
    network,
    resnet18,
)
from hpcdl.studies.microbatch.cudnn import alignment, engine_table
from hpcdl.studies.microbatch.cudnn import plan as cudnn_plan

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def _block(**over) -> dict:
    return {"studies": ["microbatch"], "microbatch": {"device": "cuda", **over}}


# -------------------------------------------------------------------------------- the configs


def test_gpu_yaml_runs_mu_cudnn_at_the_papers_settings():
    b = load_config(ROOT / "configs" / "gpu.yaml")["microbatch"]
    # AlexNet's mini-batch is 256; ResNet-18's is not stated in the text read, so 256 too (the issue's choice)
    assert b["batch_size"] == 256 and b["image_size"] == 224
    assert paper.PUBLISHED["resnet18_p100"]["mini_batch"] == paper.NOT_STATED
    assert paper.PUBLISHED["deepbench_p100_limits"]["mini_batch"] == 256
    assert b["networks"] == ["alexnet", "resnet18"]  # PyTorch's algorithm choice: DeepBench left out there
    assert cudnn_plan.cudnn_networks(b) == ["alexnet", "resnet18", "deepbench"]
    assert b["deepbench_layers"] == "training_3x3_5x5" and b["deepbench_scale"] == 1.0
    for net in ("alexnet", "resnet18"):
        assert cudnn_plan.network_limits_mib(b, net) == [8, 64, 512]
    assert cudnn_plan.network_limits_mib(b, "deepbench") == [128, 256, 512]  # the README's
    assert b["cudnn"]["tf32"] is False and b["cudnn"]["screen_ratio"] == 1.5
    assert b["repeats"] == 3 and b["exec_repeats"] == 5  # time was cut by the screen, not by rounds
    points = sweep.cudnn_points({"microbatch": b}, "cuda")
    assert [(p["network_name"], p["limits_mib"], p["batch_size"]) for p in points] == [
        ("alexnet", [8, 64, 512], 256), ("resnet18", [8, 64, 512], 256), ("deepbench", [128, 256, 512], 256)]
    assert all(p["deepbench_layers"] == "training_3x3_5x5" and p["screen_ratio"] == 1.5 for p in points)
    # every limit is planned with its mode: the DP per kernel (WR), the ILP's pooled budget (WD)
    assert [label for _, label in cudnn_plan.limit_settings(points[2]["limits_mib"])] == [
        "default (64 MiB)", "128 MiB", "256 MiB", "512 MiB"]


def test_the_engine_table_driver_measures_what_the_gpu_study_plans():
    s = engine_table.setting(load_config(ROOT / "configs" / "gpu.yaml"))
    assert s["networks"] == ["alexnet", "resnet18", "deepbench"] and s["batch_size"] == 256
    assert s["sizes"] == policy_sizes("powerOfTwo", 256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert s["max_workspace_bytes"] == 512 * MiB and s["screen_ratio"] == 1.5 and s["tf32"] is False
    assert s["network_max_workspace_bytes"] == {"alexnet": 512 * MiB, "resnet18": 512 * MiB,
                                                "deepbench": 512 * MiB}
    layers = engine_table.layers_of(s)
    assert len(layers) == 5 + 11 + 29
    assert layers[16] == ("deepbench", deepbench(1.0, "training_3x3_5x5")[0])


def test_paper_yaml_plans_mu_cudnn_where_it_has_a_gpu():
    b = load_config(ROOT / "configs" / "paper.yaml")["microbatch"]
    assert b["batch_size"] == 256 and b["deepbench_layers"] == "training_3x3_5x5" and b["device"] == "auto"
    assert b["cudnn"]["engines"] is True and b["cudnn"]["screen_ratio"] is None  # every engine timed fully
    assert cudnn_plan.cudnn_networks(b) == ["alexnet", "resnet18", "deepbench"]
    assert cudnn_plan.network_limits_mib(b, "deepbench") == [128, 256, 512]
    assert sweep.cudnn_points({"microbatch": b}, "cpu") == []  # a CPU host ignores it


def test_the_other_configs_keep_their_settings():
    for name in ("default.yaml", "test.yaml"):
        b = load_config(ROOT / "configs" / name)["microbatch"]
        assert b["deepbench_layers"] == "subset" and b["cudnn"]["engines"] is False
        assert cudnn_plan.cudnn_networks(b) == b["networks"]
        assert cudnn_plan.network_limits_mib(b, "deepbench") == [8, 64, 512]


def test_the_about_page_names_each_networks_limits_and_both_modes():
    from hpcdl.studies.microbatch import _setting

    text = _setting(load_config(ROOT / "configs" / "gpu.yaml"))
    for words in ("batch 256", "DeepBench training_3x3_5x5", "deepbench (64/128/256/512 MiB)",
                  "alexnet (8/64/512 MiB)", "WR, the DP", "WD (the ILP)"):
        assert words in text, (words, text)


# ------------------------------------------------------------------------ the keys' validation


@pytest.mark.parametrize("over, key", [
    ({"deepbench_layers": "all_of_them"}, "microbatch.deepbench_layers"),
    ({"cudnn": {"networks": []}}, "microbatch.cudnn.networks"),
    ({"cudnn": {"networks": ["alexnet", "alexnet"]}}, "microbatch.cudnn.networks"),
    ({"cudnn": {"networks": ["vgg16"]}}, "microbatch.cudnn.networks[0]"),
    ({"cudnn": {"deepbench_limits_mib": []}}, "microbatch.cudnn.deepbench_limits_mib"),
    ({"cudnn": {"deepbench_limits_mib": [-1]}}, "microbatch.cudnn.deepbench_limits_mib[0]"),
    ({"cudnn": {"screen_ratio": 1.0}}, "microbatch.cudnn.screen_ratio"),
    ({"cudnn": {"screen_ratio": "fast"}}, "microbatch.cudnn.screen_ratio"),
    # DeepBench's limits where μ-cuDNN's experiment runs no DeepBench: a setting the run would not have
    ({"networks": ["alexnet"], "cudnn": {"deepbench_limits_mib": [128]}},
     "microbatch.cudnn.deepbench_limits_mib"),
    ({"networks": ["deepbench"], "cudnn": {"networks": ["alexnet"], "deepbench_limits_mib": [128]}},
     "microbatch.cudnn.deepbench_limits_mib"),
    # a network only μ-cuDNN's experiment runs must still build at the image size
    ({"networks": ["deepbench"], "image_size": 20, "cudnn": {"networks": ["resnet18"]}},
     "microbatch.image_size"),
])
def test_bad_values_of_the_new_keys_name_the_key(over, key):
    with pytest.raises(ConfigError) as err:
        validate_config(_block(**over))
    assert err.value.key == key, (over, str(err.value))
    assert f"config key '{key}'" in str(err.value)


def test_the_new_keys_validate_and_default():
    b = validate_config(_block(networks=["alexnet"], cudnn={"networks": ["deepbench"],
                                                             "deepbench_limits_mib": [128, 256],
                                                             "screen_ratio": 2}))["microbatch"]
    assert cudnn_plan.cudnn_networks(b) == ["deepbench"] and b["deepbench_layers"] == "subset"
    assert cudnn_plan.network_limits_mib(b, "deepbench") == [128, 256]
    assert cudnn_plan.network_limits_mib(b, "alexnet") == [8, 64, 512]
    assert sweep.cudnn_points({"microbatch": {**b, "cudnn": {**b["cudnn"], "engines": True}}},
                              "cuda")[0]["screen_ratio"] == 2


# -------------------------------------------------------------------- DeepBench's training layers

# spcl/ucudnn test/bench/deepbench_conv_train_mb256.csv (commit 0b4663f), every row with a 3x3 or 5x5
# filter, as written there: W, H, C_in, N, C_out, kernel_w, kernel_h, pad_w, pad_h, stride_w, stride_h
UCUDNN_ROWS = """\
480,48,1,256,16,3,3,1,1,1,1
240,24,16,256,32,3,3,1,1,1,1
120,12,32,256,64,3,3,1,1,1,1
60,6,64,256,128,3,3,1,1,1,1
108,108,3,256,64,3,3,1,1,2,2
54,54,64,256,64,3,3,1,1,1,1
27,27,128,256,128,3,3,1,1,1,1
14,14,128,256,256,3,3,1,1,1,1
7,7,256,256,512,3,3,1,1,1,1
224,224,3,256,64,3,3,1,1,1,1
112,112,64,256,128,3,3,1,1,1,1
56,56,128,256,256,3,3,1,1,1,1
28,28,256,256,512,3,3,1,1,1,1
14,14,512,256,512,3,3,1,1,1,1
7,7,512,256,512,3,3,1,1,1,1
224,224,3,256,64,3,3,1,1,1,1
112,112,64,256,128,3,3,1,1,1,1
56,56,128,256,256,3,3,1,1,1,1
28,28,256,256,512,3,3,1,1,1,1
14,14,512,256,512,3,3,1,1,1,1
7,7,512,256,512,3,3,1,1,1,1
28,28,192,256,32,5,5,2,2,1,1
14,14,512,256,48,5,5,2,2,1,1
7,7,832,256,128,5,5,2,2,1,1
56,56,64,256,64,3,3,1,1,1,1
28,28,128,256,128,3,3,1,1,1,1
14,14,256,256,256,3,3,1,1,1,1
56,56,64,256,64,3,3,1,1,1,1
28,28,128,256,128,3,3,1,1,1,1
14,14,256,256,256,3,3,1,1,1,1
700,161,1,256,64,5,5,1,1,2,2
350,80,64,256,64,3,3,1,1,1,1
350,80,64,256,128,5,5,1,1,2,2
175,40,128,256,128,3,3,1,1,1,1
175,40,128,256,256,5,5,1,1,2,2
84,20,256,256,256,3,3,1,1,1,1
84,20,256,256,512,5,5,1,1,2,2
42,10,512,256,512,3,3,1,1,1,1
7,7,512,256,512,3,3,1,1,1,1
7,7,512,256,512,3,3,1,1,1,1
"""


def test_deepbench_training_layers_are_ucudnns_3x3_and_5x5_rows_with_their_repeats():
    rows = [tuple(map(int, r.split(","))) for r in UCUDNN_ROWS.split()]
    assert len(rows) == 40 and {r[3] for r in rows} == {256}
    want: dict[tuple, int] = {}
    for w, h, c, _, k, fw, fh, pw, ph, sw, sh in rows:
        assert fw == fh in (3, 5) and pw == ph and sw == sh
        shape = (c, k, h, w, fh, fw, sh, ph, pw)
        want[shape] = want.get(shape, 0) + 1
    layers = deepbench(1.0, "training_3x3_5x5")
    got = {(ly.cin, ly.cout, ly.height, ly.width, ly.kh, ly.kw, ly.stride, ly.pad_h, ly.pad_w): ly.count
           for ly in layers}
    assert got == want and len(layers) == 29 == len(DEEPBENCH_TRAINING_3X3_5X5)
    assert len({ly.name for ly in layers}) == 29
    names = {ly.name for ly in layers}
    assert {"vision_112x112_c64_k128_3x3", "vision_7x7_c512_k512_3x3", "speaker_700x161_c1_k64_5x5_s2",
            "vision_28x28_c192_k32_5x5"} <= names
    assert next(ly for ly in layers if ly.name == "vision_7x7_c512_k512_3x3").count == 4
    # scaled like the subset (the name keeps the benchmark's own sizes); the subset is unchanged
    small = {ly.name: ly for ly in deepbench(0.25, "training_3x3_5x5")}
    assert (small["vision_224x224_c3_k64_3x3"].height, small["vision_7x7_c512_k512_3x3"].height) == (56, 2)
    assert network("deepbench", 224, 0.25) == deepbench(0.25) == deepbench(0.25, "subset")
    with pytest.raises(ValueError, match="unknown DeepBench layer set 'vgg'"):
        deepbench(1.0, "vgg")


def test_every_layer_at_batch_256_is_aligned_at_every_micro_batch_offset():
    """The carried cuDNN frontend (1.32) cannot declare an alignment below 16 bytes (cudnn.engines):
    a layer some micro-batch offset leaves misaligned would lose those sizes' engines. None does here,
    so every engine of the GPU run's layers can run at every size it is timed at."""
    sizes = policy_sizes("powerOfTwo", 256)
    for layers in (alexnet(224), resnet18(224), deepbench(1.0, "training_3x3_5x5")):
        for ly in layers:
            assert alignment.fully_aligned_sizes(ly, 256, sizes) == sizes, ly


def test_the_task_bodies_take_the_deepbench_layers():
    from hpcdl.studies.microbatch import compute
    from hpcdl.studies.microbatch.cudnn import study as cudnn_study

    cfg = load_config(ROOT / "configs" / "gpu.yaml")
    point = sweep.network_points(cfg, "cuda")[0]
    assert point["deepbench_layers"] == "training_3x3_5x5"
    assert set(point) - {"network_name", "device"} <= set(inspect.signature(compute.run_network).parameters)
    for p in sweep.cudnn_points(cfg, "cuda"):
        assert set(p) <= set(inspect.signature(cudnn_study.run_network).parameters)
