"""The small layers of ESRT's layout that both the network (:mod:`~nala_gen.sr.archs.esrt_arch`) and its fast
inference form (:mod:`~nala_gen.sr.archs.fast`) use: a leaf module, so that neither imports the other's."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor
Grid = tuple[int, int]


class LearnedScale(nn.Module):
    """Multiplies by one learned scalar (ESRT's ``Scale``), initialised to 1."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


def conv3x3(in_ch: int, out_ch: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=bias)


def upsample_to(x: Tensor, hw: Grid) -> Tensor:
    """ESRT's bilinear upsampling of the HPB's pooled branch (align_corners=True, as published)."""
    return F.interpolate(x, size=hw, mode="bilinear", align_corners=True)


def upsampler(scale: int, channels: int) -> list[nn.Module]:
    """EDSR's conv + PixelShuffle stages: one for x2 and x3, log2(scale) x2 stages for powers of two."""
    if scale in (2, 3):
        return [conv3x3(channels, channels * scale**2), nn.PixelShuffle(scale)]
    if scale >= 2 and scale & (scale - 1) == 0:
        layers: list[nn.Module] = []
        for _ in range(int(math.log2(scale))):
            layers += [conv3x3(channels, channels * 4), nn.PixelShuffle(2)]
        return layers
    raise ValueError(f"upscale must be 2, 3 or a power of two, got {scale}")
