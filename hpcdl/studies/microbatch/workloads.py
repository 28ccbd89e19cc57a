"""The convolution layers the study plans: AlexNet, ResNet-18 and a DeepBench subset, as plain data.

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


def deepbench(scale: float) -> list[ConvLayer]:
    """The DeepBench subset with its spatial sizes multiplied by `scale` (1 = the benchmark's own)."""
    out = []
    for name, w, h, c, k, fw, fh, pw, ph, stride in DEEPBENCH:
        # never below what the filter needs: a scaled layer still produces an output
        sw = max(round(w * scale), fw - 2 * pw, 1)
        sh = max(round(h * scale), fh - 2 * ph, 1)
        out.append(ConvLayer(name, c, k, sh, sw, fh, fw, stride, ph, pw))
    return out


def network(name: str, image: int, deepbench_scale: float) -> list[ConvLayer]:
    if name == "alexnet":
        return alexnet(image)
    if name == "resnet18":
        return resnet18(image)
    if name == "deepbench":
        return deepbench(deepbench_scale)
    raise ValueError(f"unknown network {name!r}; known: {', '.join(NETWORKS)}")
