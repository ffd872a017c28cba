"""ESRT's body with its learned scales folded and without its concatenations (see :mod:`~nala_gen.sr.archs.fast`,
the fourth item): :class:`FoldedBody` of :class:`FoldedHPB` of :class:`FoldedARFB`, its transformers composed
(:class:`~nala_gen.sr.archs.fast.transformer.ComposedTransformer`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.ops import winograd

from ..esrt_layers import upsample_to
from . import conv_choice
from .transformer import ComposedTransformer

Tensor = torch.Tensor


def _scalar(scale: nn.Module) -> float:
    """The value of a LearnedScale."""
    return float(scale.scale.detach())


def _scaled_conv(conv: nn.Conv2d, out_scale: Tensor | float = 1.0, in_scale: Tensor | None = None) -> nn.Conv2d:
    """A new convolution computing ``out_scale * conv(in_scale * x)`` (scales per channel or scalar); ``conv``, the
    network's, keeps its weights. (The graph shares the network's other layers, so it makes no copy of the body: a
    deep copy of a module tree costs tens of milliseconds of Python, a one-image ``nala-sr upscale`` pays it.)

    Made on the meta device (no initialisation of weights that are replaced at once), its parameters then set:
    ``nn.utils.skip_init`` would do the same, but its ``to_empty`` goes through torch's Python references, whose
    first use imports sympy, a third of a second of a one-image upscale."""
    scaled = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
        device="meta",
        dtype=conv.weight.dtype,
    )
    with torch.no_grad():
        weight = conv.weight * torch.as_tensor(out_scale).reshape(-1, 1, 1, 1)  # keeps the weight's memory format
        if in_scale is not None:
            weight = weight * in_scale.reshape(1, -1, 1, 1)
        scaled.weight = nn.Parameter(weight, requires_grad=conv.weight.requires_grad)
        if conv.bias is not None:
            bias = conv.bias * torch.as_tensor(out_scale).reshape(-1)
            scaled.bias = nn.Parameter(bias, requires_grad=conv.bias.requires_grad)
    return scaled


class Float32PReLU(nn.Module):
    """A trained ``nn.PReLU`` (shared) that computes in float32 on a CPU for bf16/fp16 inputs, rounding once: under
    bf16 autocast, PyTorch's bf16 PReLU on channels-last maps ran many times slower than its float32 kernel with the
    casts around it (here), and ESRT's layout has 48 of them."""

    def __init__(self, act: nn.PReLU) -> None:
        super().__init__()
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 or x.device.type != "cpu":
            return self.act(x)
        with torch.autocast("cpu", enabled=False):  # CPU autocast runs prelu in bf16
            return F.prelu(x.float(), self.act.weight.float()).to(x.dtype)


def _float32_prelu(act: nn.Module) -> nn.Module:
    return Float32PReLU(act) if isinstance(act, nn.PReLU) else act


class FoldedResidualUnit(nn.Module):
    """ESRT's residual unit with its two learned scales folded: ``conv2`` carries ``s_res`` and ``s_x`` rides on
    the residual add, so no pass multiplies a whole feature map by a scalar."""

    def __init__(self, unit: nn.Module) -> None:
        super().__init__()
        conv1, act, conv2 = unit.body
        conv2 = _scaled_conv(conv2, unit.scale_res.scale.detach())
        self.body = nn.Sequential(conv_choice.layer(conv1), _float32_prelu(act), conv_choice.layer(conv2))
        self.scale_x = _scalar(unit.scale_x)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x).add_(x, alpha=self.scale_x)


class FoldedARFB(nn.Module):
    """ESRT's ARFB with its learned scales folded and without its concatenation.

    The ARFB fuses ``[s2 * x2, s1 * x1]`` by a bias-free 1x1 conv ``[W_a | W_b]``, and ``x2 = conv2(h) + s * x1`` is
    its second residual unit (``h`` that unit's hidden map), so the fusion's input is ``(W_a conv2)(h) + (s W_a +
    W_b) x1`` (scales folded in): one 3x3 conv of ``h`` (``W_a`` composed into ``conv2``: the same size as
    ``conv2``) plus a 1x1 conv of ``x1`` half the fusion's width. Neither ``x2`` nor the 2C-wide concatenation is
    made. The channel attention's gate goes into the next conv's weight (batch 1). The first unit is
    :class:`FoldedResidualUnit`; ``s_res`` goes into the last conv (``s * ReLU(t) = ReLU(s
    * t)`` needs ``s >= 0``; a negative one stays a multiplication), ``s_x`` onto the residual add.
    """

    def __init__(self, arfb: nn.Module) -> None:
        super().__init__()
        channels = arfb.fuse[0].out_channels
        self.ru1 = FoldedResidualUnit(arfb.ru1)
        conv1, act, conv2 = arfb.ru2.body
        if not winograd.is_plain_3x3(conv2) or not winograd.is_plain_3x3(arfb.conv[0]):
            raise TypeError("the ARFB's convolutions are expected to be 3x3 with padding 1 (ESRT's layout)")
        self.ru2_hidden = nn.Sequential(conv_choice.layer(conv1), _float32_prelu(act))
        like = conv2.weight

        def f64(t: Tensor) -> Tensor:
            return t.detach().double()

        fuse = f64(arfb.fuse[0].weight)[:, :, 0, 0]  # (C, 2C): [x2 part | x1 part]
        w_a, w_b = fuse[:, :channels] * _scalar(arfb.scale_x2), fuse[:, channels:] * _scalar(arfb.scale_x1)
        unit_res = _scalar(arfb.ru2.scale_res)
        hidden_weight = torch.einsum("om,mikl->oikl", w_a, f64(conv2.weight) * unit_res)
        hidden_bias = w_a @ (f64(conv2.bias) * unit_res)
        x1_weight = (_scalar(arfb.ru2.scale_x) * w_a + w_b)[..., None, None]
        for name, value in (("hidden_weight", hidden_weight), ("hidden_bias", hidden_bias), ("x1_weight", x1_weight)):
            self.register_buffer(name, value.to(like), persistent=False)
        self.register_buffer("hidden_packed", winograd.pack(self.hidden_weight), persistent=False)
        self.attention = arfb.attention
        scale_res = _scalar(arfb.scale_res)
        folds = scale_res > 0
        conv = self.gated = _scaled_conv(arfb.conv[0], scale_res if folds else 1.0)
        self.conv = nn.Sequential(conv_choice.layer(conv), arfb.conv[1])
        # the conv's transformed weight, which the channel attention's gate scales per input channel (batch 1)
        self.register_buffer("conv_packed", winograd.pack(conv.weight), persistent=False)
        self.out_scale = None if folds else scale_res
        self.scale_x = _scalar(arfb.scale_x)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, H, W) -> (B, C, H, W)."""
        x1 = self.ru1(x)
        # x1's hidden map, then its 1x1 part, so that x1 is gone before the 3x3 conv's output is made: at most x, the
        # part, the (half-width) hidden map and the output are held, not x, x1, the output and the part
        hidden = self.ru2_hidden(x1)
        part = conv_choice.conv1x1(x1, self.x1_weight)
        del x1
        fused = conv_choice.conv3x3(hidden, self.hidden_weight, self.hidden_bias, self.hidden_packed)
        del hidden
        fused = fused.add_(part).relu_()
        del part
        gate = self.attention.gate(fused)  # (B, C, 1, 1): the channel attention's per-channel weights
        if fused.shape[0] == 1:  # they scale the conv's input channels: fold them into its small weight, not the map
            conv = self.gated
            packed = self.conv_packed * gate.view(1, -1, 1).to(self.conv_packed.dtype)
            y = conv_choice.conv3x3(fused, conv.weight * gate.view(1, -1, 1, 1), conv.bias, packed).relu_()
        else:
            y = self.conv(fused.mul_(gate))
        if self.out_scale is not None:
            y = y * self.out_scale
        return y.add_(x, alpha=self.scale_x)


class FoldedHPB(nn.Module):
    """ESRT's HPB with folded ARFBs (:class:`FoldedARFB`) and without its concatenation: the bias-free 1x1 fusion
    of ``[up(low), high]`` is ``up(W_a low) + W_b high`` (a 1x1 conv commutes with the per-channel bilinear
    upsampling), so ``W_a`` runs at the pooled branch's quarter resolution and no 2C-wide map is made."""

    def __init__(self, hpb: nn.Module) -> None:
        super().__init__()
        self.entry, self.low, self.high, self.exit = (
            FoldedARFB(getattr(hpb, n)) for n in ("entry", "low", "high", "exit")
        )
        self.num_shared = hpb.num_shared
        weight = hpb.fuse[0].weight.detach()
        channels = weight.shape[0]
        self.register_buffer("low_weight", weight[:, :channels].clone(), persistent=False)
        self.register_buffer("high_weight", weight[:, channels:].clone(), persistent=False)
        self.attention = hpb.attention

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, H, W) -> (B, C, H, W)."""
        hw = x.shape[-2:]
        feat = self.entry(x)
        low = F.avg_pool2d(feat, 2)
        high = self.high(feat.sub_(upsample_to(low, hw)))  # HFM: the detail the pooled copy loses
        del feat
        for _ in range(self.num_shared):
            low = self.low(low)
        fused = upsample_to(conv_choice.conv1x1(low, self.low_weight), hw).add_(
            conv_choice.conv1x1(high, self.high_weight)
        )
        fused = fused.relu_()
        return self.exit(self.attention(fused)).add_(x)


class FoldedBody(nn.Module):
    """ESRT's body (:class:`~nala_gen.sr.archs.esrt_arch.ESRTBody`) with folded HPBs, composed transformers and no
    concatenation: the 3x3 reduction of the HPBs' concatenated outputs is the sum of one 3x3 conv per output,
    each added as its HPB finishes, so only the running sum and the latest output are held. The learned scales
    go into the last conv (``s_res``) and onto the residual add (``s_x``). It takes the image and runs the network's
    head itself, twice: the head's output is the first HPB's input and the body's long residual, and is made again
    for the residual rather than held through the body (a 3x3 conv of the 3-channel image, about 1 % of the body's
    time; one C-wide map less held at the pass's peak, 32 MB at 4 MP out).

    Args:
        body: a trained ESRT body; its layers are shared, the folded ones made anew (it is not changed).
        head: the network's head (shared).
    """

    def __init__(self, body: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.head = head
        self.hpbs = nn.ModuleList(FoldedHPB(hpb) for hpb in body.hpbs)
        weight = body.reduce.weight.detach()
        # (num_block * C, C, 3, 3): HPB i's part is rows i * C to (i + 1) * C (4-D, as .to(memory_format=) needs)
        self.register_buffer("reduce_weight", torch.cat(weight.chunk(len(self.hpbs), dim=1)), persistent=False)
        self.register_buffer("reduce_bias", body.reduce.bias.detach().clone(), persistent=False)
        if not winograd.is_plain_3x3(body.reduce):
            raise TypeError("the body's reduction is expected to be a 3x3 convolution with padding 1 (ESRT's layout)")
        # their transforms, (num_block * P, C, C), P = 16 or 36 positions (winograd.pack): 3-D, so that
        # .to(memory_format=) leaves them contiguous
        self.register_buffer(
            "reduce_packed",
            torch.cat([winograd.pack(w) for w in self.reduce_weight.chunk(len(self.hpbs))]),
            persistent=False,
        )
        self.transformer = nn.Sequential(*(ComposedTransformer(et) for et in body.transformer))
        self.conv = conv_choice.layer(_scaled_conv(body.conv, _scalar(body.scale_res)))
        self.scale_x = _scalar(body.scale_x)

    def forward(self, image: Tensor) -> Tensor:
        """image: (B, C_in, H, W) -> (B, C, H, W), the body's output (its residual added) on the head's features."""
        feat, merged = _float32(self.head, image), None
        parts = zip(self.hpbs, self.reduce_weight.chunk(len(self.hpbs)), self.reduce_packed.chunk(len(self.hpbs)))
        for hpb, weight, packed in parts:
            feat = hpb(feat)
            if merged is None:
                merged = conv_choice.conv3x3(feat, weight, self.reduce_bias, packed)
            else:
                merged = merged.add_(conv_choice.conv3x3(feat, weight, packed=packed))
        del feat
        return self.conv(self.transformer(merged)).add_(_float32(self.head, image), alpha=self.scale_x)


def _float32(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)`` in float32 under autocast (bf16/fp16), as it is without. For the two layers that read the image:
    the skip path carries the picture itself (values up to 1, where bf16's steps are 1/128, coarser than 8-bit
    colour) and the head's features are the body's long residual; rounded to bf16, both left an error that does not
    average out on smooth photos (a mean shift of the output). Both are convs of the 3-channel image, about 1 % of
    the network's multiply-adds."""
    if not torch.is_autocast_enabled(x.device.type):
        return layer(x)
    with torch.autocast(x.device.type, enabled=False):
        return layer(x.float())
