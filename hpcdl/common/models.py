"""Small models for Fashion-MNIST studies: an MLP and a CNN, sized by arguments."""

from __future__ import annotations

from torch import nn


def mlp(width: int = 128, depth: int = 2, dropout: float = 0.0, n_classes: int = 10) -> nn.Module:
    """`depth` hidden layers of `width` units with ReLU and dropout, on flattened 28x28 input."""
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = 28 * 28
    for _ in range(depth):
        layers += [nn.Linear(fan_in, width), nn.ReLU(), nn.Dropout(dropout)]
        fan_in = width
    layers.append(nn.Linear(fan_in, n_classes))
    return nn.Sequential(*layers)


def small_cnn(width: int = 32, depth: int = 2, dropout: float = 0.0, n_classes: int = 10) -> nn.Module:
    """`depth` conv(3x3)-ReLU-maxpool blocks (channels width, 2*width, ...) then a linear head."""
    if not 1 <= depth <= 4:
        raise ValueError(f"small_cnn depth must be 1..4 (28x28 input halves per block), got {depth}")
    layers: list[nn.Module] = []
    channels, size = 1, 28
    for i in range(depth):
        out = width * (2 ** i)
        layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        channels, size = out, size // 2
    layers += [nn.Flatten(), nn.Dropout(dropout), nn.Linear(channels * size * size, n_classes)]
    return nn.Sequential(*layers)


def build(kind: str, **kwargs) -> nn.Module:
    builders = {"mlp": mlp, "cnn": small_cnn}
    if kind not in builders:
        raise ValueError(f"model kind must be one of {sorted(builders)}, got {kind!r}")
    return builders[kind](**kwargs)
