"""The study's network: an MLP with batch normalisation.

The paper's networks (ResNets) normalise by per-rank batch statistics, and DDP evaluates
with rank 0's running statistics; that is the path by which a label-skewed partition
reaches a synchronously trained model, so the laptop-scale MLP keeps batch norm
(`kind: mlp` / `cnn` use hpcdl.common.models unchanged).
"""

from __future__ import annotations

from torch import nn

from hpcdl.common import models


def mlp_bn(width: int = 64, depth: int = 2, n_classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = 28 * 28
    for _ in range(depth):
        layers += [nn.Linear(fan_in, width), nn.BatchNorm1d(width), nn.ReLU()]
        fan_in = width
    layers.append(nn.Linear(fan_in, n_classes))
    return nn.Sequential(*layers)


def build(kind: str, width: int, depth: int) -> nn.Module:
    if kind == "mlp_bn":
        return mlp_bn(width, depth)
    return models.build(kind, width=width, depth=depth)
