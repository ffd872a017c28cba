"""The fast inference form of an ESRT-layout network (:class:`ESRTInferenceGraph`): its head, body and upsamplers
composed and folded (see :mod:`~nala_gen.sr.archs.fast`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import conv_choice
from .body import FoldedBody, _float32
from .upsampler import ComposedUpsampler

Tensor = torch.Tensor


class ESRTInferenceGraph(nn.Module):
    """An ESRT-layout network's forward, composed and folded (see :mod:`~nala_gen.sr.archs.fast`). Built by the
    network itself (:meth:`~nala_gen.sr.archs.esrt_arch.ESRTLayout.inference_form`).

    Args:
        net: a trained :class:`~nala_gen.sr.archs.esrt_arch.ESRTLayout` (NaLaSR or ESRT); the graph shares its head and
            upsamplers and the body's unfolded layers.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        channels = net.head.out_channels
        self.head = net.head
        self.upscale = net.upscale
        # The 3x3 ``reduce`` before the tail stays its own layer: composed in, it would widen the kernel from 5x5
        # to 7x7 (about twice the multiply-adds of the two apart).
        self.reduce = conv_choice.layer(net.reduce)
        self.tail = ComposedUpsampler(net.tail, channels, net.upscale)
        if not isinstance(net.skip[-1], nn.ReLU):
            raise TypeError("the skip upsampler is expected to end in a ReLU (ESRT's layout)")
        # The skip path reads the head's output, itself a 3x3 conv of the image: composed with the head it is one
        # 7x7 conv of the 3-channel input, about a fifth of the skip's multiply-adds as a 5x5 conv of 32 channels.
        self.skip = ComposedUpsampler(nn.Sequential(net.head, *list(net.skip)[:-1]), net.head.in_channels, net.upscale)
        self.body = FoldedBody(net.body, net.head)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C_in, H, W) in [0, 1] -> (B, C_out, H * upscale, W * upscale)."""
        if min(x.shape[-2:]) < 2:
            raise ValueError(f"input must be at least 2x2 pixels, got {tuple(x.shape[-2:])}")
        if not x.is_contiguous(memory_format=torch.channels_last):
            # The graph's convolutions run channels-last (oneDNN's NHWC kernels; the weights may stay as they are):
            # the 3-channel input costs one small copy, the output one copy back into the caller's layout, and a
            # plain NCHW pass takes about a third longer on this project's CPUs.
            return self(x.contiguous(memory_format=torch.channels_last)).contiguous()
        details = self.tail(self.reduce(self.body(x)))
        return F.pixel_shuffle(_float32(self.skip, x).relu_().add_(details), self.upscale)
