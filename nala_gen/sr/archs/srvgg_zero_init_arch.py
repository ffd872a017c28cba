"""``SRVGGNetCompactZeroInit``: BasicSR's SRVGGNetCompact (Real-ESRGAN's compact net), initialised to train.

The network is BasicSR's own, unchanged; only its initial weights differ. Trained from scratch at this project's
short equal-budget schedule with PyTorch's default init (what BasicSR and Real-ESRGAN use), it learned to add
nothing to its nearest-neighbour base: three seeds scored exactly the nearest-neighbour upscale, and short
checks with a variance-keeping init alone and with a lower learning rate ended the same way. Either init starts
the body adding random noise to the base, and the first steps remove it by driving the stack's signal to almost
nothing (mean |activation| 0.0008 before the last layer), from which it does not recover at this budget;
Real-ESRGAN trains the net far longer, and from pretrained weights. Here the hidden convolutions are
variance-keeping (Kaiming normal, fan-in, for a PReLU's initial slope of 0.25) and the last convolution starts
at zero (the usual zero-initialised residual branch): the network starts as its base, with no noise to remove,
a signal of unchanged size reaches the last layer, and that layer's gradients are alive from the first step.
Registered in BasicSR's ``ARCH_REGISTRY`` by :mod:`nala_gen.sr.basicsr`.

Args: those of ``basicsr.archs.srvgg_arch.SRVGGNetCompact``. (B, 3, H, W) -> (B, 3, sH, sW).
"""

from __future__ import annotations

from basicsr.archs.srvgg_arch import SRVGGNetCompact
from torch import nn

PRELU_INITIAL_SLOPE = 0.25  # nn.PReLU's default


class SRVGGNetCompactZeroInit(SRVGGNetCompact):
    """SRVGGNetCompact with a variance-keeping init of its hidden convolutions and a zero last convolution."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        convs = [m for m in self.body if isinstance(m, nn.Conv2d)]
        slope = PRELU_INITIAL_SLOPE if self.act_type == "prelu" else 0.1 if self.act_type == "leakyrelu" else 0.0
        for conv in convs[:-1]:
            nn.init.kaiming_normal_(conv.weight, a=slope, mode="fan_in", nonlinearity="leaky_relu")
            nn.init.zeros_(conv.bias)
        nn.init.zeros_(convs[-1].weight)
        nn.init.zeros_(convs[-1].bias)
