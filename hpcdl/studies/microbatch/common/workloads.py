"""The convolution layers the study plans: AlexNet, ResNet-18 and DeepBench layers (a subset, or the
training set's 3x3 and 5x5 layers μ-cuDNN benchmarks), as plain data.

A layer is a `ConvLayer` (one sample's input shape, the filter, stride and padding) with a
`count`: how many times the network runs that exact shape (ResNet-18 repeats its 3x3 blocks), so
a network's time and workspace are count-weighted sums over its distinct shapes. Only the conv
layers are planned and timed (pooling, ReLU and normalisation are outside μ-cuDNN's scope too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hpcdl.common.layers import conv_out

NETWORKS = ("alexnet", "resnet18", "deepbench")


@dataclass(frozen=True)
class ConvLayer:
    name: str
    cin: int
    cout: int
    height: int
    width: int
    kh: int
    kw: int
    stride: int
    pad_h: int
    pad_w: int
    count: int = 1

    @property
    def out_hw(self) -> tuple[int, int]:
        return (
            conv_out(self.height, self.kh, self.stride, self.pad_h),
            conv_out(self.width, self.kw, self.stride, self.pad_w),
        )

    def as_dict(self) -> dict:
        return asdict(self)

    def flops(self, batch: int) -> float:
        """Forward multiply-adds x 2 for `batch` samples."""
        oh, ow = self.out_hw
        return 2.0 * batch * self.cin * self.cout * self.kh * self.kw * oh * ow


def _pool(n: int) -> int:
    return conv_out(n, 3, 2, 0)  # torchvision's MaxPool2d(3, 2)


def alexnet(image: int) -> list[ConvLayer]:
    """torchvision AlexNet's five conv layers on an image x image input."""
    s1 = conv_out(image, 11, 4, 2)
    s2 = _pool(s1)
    s3 = _pool(s2)
    if s3 < 1:
        raise ValueError(f"alexnet: image size {image} is too small (the third conv would be {s3}x{s3})")
    return [
        ConvLayer("conv1", 3, 64, image, image, 11, 11, 4, 2, 2),
        ConvLayer("conv2", 64, 192, s2, s2, 5, 5, 1, 2, 2),
        ConvLayer("conv3", 192, 384, s3, s3, 3, 3, 1, 1, 1),
        ConvLayer("conv4", 384, 256, s3, s3, 3, 3, 1, 1, 1),
        ConvLayer("conv5", 256, 256, s3, s3, 3, 3, 1, 1, 1),
    ]


def resnet18(image: int) -> list[ConvLayer]:
    """ResNet-18's distinct conv shapes (with their repeat counts) on an image x image input."""
    s = conv_out(image, 7, 2, 3)
    layers = [ConvLayer("conv1", 3, 64, image, image, 7, 7, 2, 3, 3)]
    s = conv_out(s, 3, 2, 1)  # max pool 3, stride 2, pad 1
    if s < 8:
        raise ValueError(
            f"resnet18: image size {image} is too small (layer1 would run at {s}x{s}; "
            "at least 8 keeps layer4 at 1x1)"
        )
    layers.append(ConvLayer("layer1.3x3", 64, 64, s, s, 3, 3, 1, 1, 1, count=4))
    cin = 64
    for stage, cout in ((2, 128), (3, 256), (4, 512)):
        half = conv_out(s, 3, 2, 1)
        layers += [
            ConvLayer(f"layer{stage}.0.conv1", cin, cout, s, s, 3, 3, 2, 1, 1),
            ConvLayer(f"layer{stage}.0.downsample", cin, cout, s, s, 1, 1, 2, 0, 0),
            ConvLayer(f"layer{stage}.3x3", cout, cout, half, half, 3, 3, 1, 1, 1, count=3),
        ]
        cin, s = cout, half
    return layers


# DeepBench conv_bench problems (w, h, c, k, filter_w, filter_h, pad_w, pad_h, stride): speech
# (DeepSpeech), vision (VGG-like), GoogLeNet 5x5 and 1x1, ResNet 1x1 layers.
DEEPBENCH = (
    ("speech_700x161", 700, 161, 1, 32, 20, 5, 0, 0, 2),
    ("speech_341x79", 341, 79, 32, 32, 10, 5, 0, 0, 2),
    ("vision_54x54", 54, 54, 64, 64, 3, 3, 1, 1, 1),
    ("googlenet_28x28_5x5", 28, 28, 192, 32, 5, 5, 2, 2, 1),
    ("googlenet_14x14_5x5", 14, 14, 512, 48, 5, 5, 2, 2, 1),
    ("resnet_28x28_1x1", 28, 28, 128, 512, 1, 1, 0, 0, 1),
)


# DeepBench's training set at μ-cuDNN's mini-batch: its 3x3 and 5x5 layers, the ones the spcl/ucudnn
# README's DeepBench figure shows ("DeepBench's 3x3 and 5x5 convolution layers ... We use a mini-batch
# of 256, and workspace limits of 128, 256, and 512 MiB"). Source: spcl/ucudnn
# test/bench/deepbench_conv_train_mb256.csv (commit 0b4663f: DeepBench's training layers as of its
# commit 9ab7a74 with N = 256), every row whose filter is 3x3 or 5x5; a shape listed more than once
# (the VGG block twice, ResNet's 7x7x512 3x3 twice more, three face-recognition layers twice) is one
# layer with that count, as ResNet-18's repeated blocks are. (app, w, h, c, k, filter, pad, stride, count)
DEEPBENCH_TRAINING_3X3_5X5 = (
    ("ocr", 480, 48, 1, 16, 3, 1, 1, 1),
    ("ocr", 240, 24, 16, 32, 3, 1, 1, 1),
    ("ocr", 120, 12, 32, 64, 3, 1, 1, 1),
    ("ocr", 60, 6, 64, 128, 3, 1, 1, 1),
    ("face", 108, 108, 3, 64, 3, 1, 2, 1),
    ("face", 54, 54, 64, 64, 3, 1, 1, 1),
    ("face", 27, 27, 128, 128, 3, 1, 1, 1),
    ("face", 14, 14, 128, 256, 3, 1, 1, 1),
    ("face", 7, 7, 256, 512, 3, 1, 1, 1),
    ("vision", 224, 224, 3, 64, 3, 1, 1, 2),
    ("vision", 112, 112, 64, 128, 3, 1, 1, 2),
    ("vision", 56, 56, 128, 256, 3, 1, 1, 2),
    ("vision", 28, 28, 256, 512, 3, 1, 1, 2),
    ("vision", 14, 14, 512, 512, 3, 1, 1, 2),
    ("vision", 7, 7, 512, 512, 3, 1, 1, 4),
    ("vision", 28, 28, 192, 32, 5, 2, 1, 1),
    ("vision", 14, 14, 512, 48, 5, 2, 1, 1),
    ("vision", 7, 7, 832, 128, 5, 2, 1, 1),
    ("face", 56, 56, 64, 64, 3, 1, 1, 2),
    ("face", 28, 28, 128, 128, 3, 1, 1, 2),
    ("face", 14, 14, 256, 256, 3, 1, 1, 2),
    ("speaker", 700, 161, 1, 64, 5, 1, 2, 1),
    ("speaker", 350, 80, 64, 64, 3, 1, 1, 1),
    ("speaker", 350, 80, 64, 128, 5, 1, 2, 1),
    ("speaker", 175, 40, 128, 128, 3, 1, 1, 1),
    ("speaker", 175, 40, 128, 256, 5, 1, 2, 1),
    ("speaker", 84, 20, 256, 256, 3, 1, 1, 1),
    ("speaker", 84, 20, 256, 512, 5, 1, 2, 1),
    ("speaker", 42, 10, 512, 512, 3, 1, 1, 1),
)
# which DeepBench layers a config runs (microbatch.deepbench_layers)
DEEPBENCH_LAYERS = ("subset", "training_3x3_5x5")


def _scaled(n: int, scale: float, filt: int, pad: int) -> int:
    # never below what the filter needs: a scaled layer still produces an output
    return max(round(n * scale), filt - 2 * pad, 1)


def deepbench(scale: float, layers: str = "subset") -> list[ConvLayer]:
    """DeepBench layers with their spatial sizes multiplied by `scale` (1 = the benchmark's own):
    `layers` "subset" (six layers: speech, vision, GoogLeNet 5x5, ResNet 1x1) or "training_3x3_5x5"
    (the training set's 29 distinct 3x3 and 5x5 shapes μ-cuDNN's README benchmarks, named
    app_WxH_cC_kK_FxF, "_s2" where the stride is 2; the name keeps the benchmark's own sizes)."""
    if layers == "subset":
        return [ConvLayer(name, c, k, _scaled(h, scale, fh, ph), _scaled(w, scale, fw, pw), fh, fw, stride,
                          ph, pw) for name, w, h, c, k, fw, fh, pw, ph, stride in DEEPBENCH]
    if layers == "training_3x3_5x5":
        return [ConvLayer(f"{app}_{w}x{h}_c{c}_k{k}_{f}x{f}" + ("_s2" if stride == 2 else ""), c, k,
                          _scaled(h, scale, f, pad), _scaled(w, scale, f, pad), f, f, stride, pad, pad, count)
                for app, w, h, c, k, f, pad, stride, count in DEEPBENCH_TRAINING_3X3_5X5]
    raise ValueError(f"unknown DeepBench layer set {layers!r}; known: {', '.join(DEEPBENCH_LAYERS)}")


def network(name: str, image: int, deepbench_scale: float,
            deepbench_layers: str = "subset") -> list[ConvLayer]:
    """A network's conv layers: AlexNet and ResNet-18 on image x image inputs, DeepBench's layers
    (`deepbench_layers`, scaled by `deepbench_scale`)."""
    if name == "alexnet":
        return alexnet(image)
    if name == "resnet18":
        return resnet18(image)
    if name == "deepbench":
        return deepbench(deepbench_scale, deepbench_layers)
    raise ValueError(f"unknown network {name!r}; known: {', '.join(NETWORKS)}")
