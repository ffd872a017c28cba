"""ESRT (Lu et al., "Transformer for Single Image Super-Resolution", CVPRW 2022), written from the paper and its
published design. Registered in BasicSR's ``ARCH_REGISTRY`` as ``ESRT`` by :mod:`nala_gen.sr.basicsr`.

Layout (the published one; its parameter count differs from the release's by 12 unused scalars, see
docs/differences.md):

* head: 3x3 conv to ``num_feat`` channels;
* body, with an adaptive (two learned scalars) residual around it:
  ``num_block`` High Preserving Blocks (HPB) -> concatenation of their outputs -> 3x3 reduction conv ->
  Efficient Transformer (3x3 unfold to ``9 * num_feat``-wide tokens, efficient multi-head attention, ReLU MLP)
  -> fold -> 3x3 conv;
* a 3x3 conv, then a conv + PixelShuffle upsampler and a 3x3 conv to RGB, plus a second upsampler from the head
  (its last conv without bias and followed by ReLU, as published).

An HPB keeps the high-frequency part of its features (x minus a bilinear upsampling of its 2x2 average pool),
refines the half-resolution part with one Adaptive Residual Feature Block (ARFB) applied five times with shared
weights, and fuses both with a 1x1 conv and channel attention. An ARFB is two residual units (3x3 convs, PReLU,
learned residual scales), a 1x1 fusion, channel attention and a 3x3 conv, with learned scales again.

EMHA reduces the tokens to half width, splits them into four segments of ``N // 4`` tokens and runs softmax
attention inside each, so its memory is quadratic (about N^2 / 4 scores per head).

:class:`ESRTLayout` is this network with the transformer's attention given as a module; ``ESRT`` gives it EMHA
and NaLaSR (``nalasr_arch``) the NaLa block. It owns its fast inference form (:mod:`~nala_gen.sr.archs.fast`):
:meth:`ESRTLayout.forward` is where inference chooses between it and the layers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.attention import report_queries_keys
from nala_gen.ops import tracing

from .esrt_layers import LearnedScale, conv3x3, upsample_to, upsampler
from .fast import ESRTInferenceGraph
from .hub import HubMixin

Tensor = torch.Tensor
Grid = tuple[int, int]
# attention(dim) -> module called as module(tokens (B, N, dim), hw) -> (B, N, dim)
AttentionFactory = Callable[[int], nn.Module]


class ResidualUnit(nn.Module):
    """RU: ``s_x * x + s_res * conv3x3(PReLU(conv3x3(x)))``, halving the channels in between."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv3x3(channels, channels // 2), nn.PReLU(channels // 2), conv3x3(channels // 2, channels)
        )
        self.scale_x = LearnedScale()
        self.scale_res = LearnedScale()

    def forward(self, x: Tensor) -> Tensor:
        return self.scale_x(x) + self.scale_res(self.body(x))


class ChannelAttention(nn.Module):
    """Squeeze-and-excitation: global average, 1x1 down by ``reduction``, ReLU, 1x1 up, sigmoid gate."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(channels, channels // reduction, 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels // reduction, channels, 1),
            nn.Sigmoid(),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(x)


def fuse_1x1(in_ch: int, out_ch: int) -> nn.Sequential:
    """1x1 conv without bias, then ReLU (ESRT's ``BasicConv`` with kernel 1)."""
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, bias=False), nn.ReLU(inplace=True))


class ARFB(nn.Module):
    """Adaptive Residual Feature Block.

    ``x1 = RU(x)``, ``x2 = RU(x1)``; ``y = ReLU(conv3x3(CA(fuse([s2 * x2, s1 * x1]))))``;
    out ``s_x * x + s_res * y``. (B, C, H, W) in and out.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.ru1 = ResidualUnit(channels)
        self.ru2 = ResidualUnit(channels)
        self.scale_x1 = LearnedScale()
        self.scale_x2 = LearnedScale()
        self.fuse = fuse_1x1(2 * channels, channels)
        self.attention = ChannelAttention(channels)
        self.conv = nn.Sequential(conv3x3(channels, channels, bias=False), nn.ReLU(inplace=True))
        self.scale_x = LearnedScale()
        self.scale_res = LearnedScale()

    def forward(self, x: Tensor) -> Tensor:
        x1 = self.ru1(x)
        x2 = self.ru2(x1)
        y = self.conv(self.attention(self.fuse(torch.cat((self.scale_x2(x2), self.scale_x1(x1)), dim=1))))
        return self.scale_x(x) + self.scale_res(y)


class HPB(nn.Module):
    """High Preserving Block. (B, C, H, W) in and out, any H, W >= 2.

    Args:
        channels: feature channels.
        num_shared: times the shared-weight ARFB refines the half-resolution branch (ESRT: 5).
    """

    def __init__(self, channels: int, num_shared: int = 5) -> None:
        super().__init__()
        self.entry = ARFB(channels)
        self.low = ARFB(channels)  # applied num_shared times, one set of weights
        self.num_shared = num_shared
        self.high = ARFB(channels)
        self.fuse = fuse_1x1(2 * channels, channels)
        self.attention = ChannelAttention(channels)
        self.exit = ARFB(channels)

    def forward(self, x: Tensor) -> Tensor:
        hw = x.shape[-2:]
        feat = self.entry(x)
        low = F.avg_pool2d(feat, 2)
        high = self.high(feat - upsample_to(low, hw))  # HFM: the detail the pooled copy loses
        for _ in range(self.num_shared):
            low = self.low(low)
        fused = self.attention(self.fuse(torch.cat((upsample_to(low, hw), high), dim=1)))
        return self.exit(fused) + x


def split_softmax_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, num_splits: int = 4) -> Tensor:
    """EMHA's core: tokens cut into segments of ``N // num_splits`` (at least 1), explicit softmax inside each.

    As published, the segment length is ``N // num_splits``, so N not divisible by ``num_splits`` gives one more,
    shorter segment. The score matrices are materialised, so memory grows as N^2 / num_splits.
    q, k, v: (B, heads, N, d) -> (B, heads, N, d).
    """
    size = max(q.shape[-2] // num_splits, 1)
    outputs = []
    for qs, ks, vs in zip(q.split(size, dim=-2), k.split(size, dim=-2), v.split(size, dim=-2)):
        outputs.append(torch.softmax((qs @ ks.transpose(-2, -1)) * scale, dim=-1) @ vs)
    return torch.cat(outputs, dim=-2)


class EMHA(nn.Module):
    """Efficient multi-head attention: reduction to ``dim // 2`` -> q, k, v -> split softmax -> projection.

    Args:
        dim: token width (ESRT: 288 = 32 channels x 3 x 3).
        num_heads: heads (ESRT: 8).
        num_splits: token segments (ESRT: 4).

    As published the reduction and q/k/v layers have no bias and the softmax scale is ``(dim // num_heads)^-0.5``
    (36^-0.5 at 288), computed from the unreduced width although each head is ``dim // 2 // num_heads`` wide.
    """

    def __init__(self, dim: int, num_heads: int = 8, num_splits: int = 4) -> None:
        super().__init__()
        inner = dim // 2
        if inner % num_heads:
            raise ValueError(f"reduced width {inner} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.num_splits = num_splits
        self.scale = (dim // num_heads) ** -0.5
        self.reduce = nn.Linear(dim, inner, bias=False)
        self.qkv = nn.Linear(inner, 3 * inner, bias=False)
        self.proj = nn.Linear(inner, dim)

    def forward(self, x: Tensor, hw: Grid | None = None) -> Tensor:
        """x: (B, N, dim) -> (B, N, dim); ``hw`` is accepted for a common signature and not used."""
        return self.proj(self.mix(self.reduce(x), hw))

    def mix(self, x: Tensor, hw: Grid | None = None) -> Tensor:
        """Reduced tokens (B, N, dim // 2) -> the attention's output before its projection, (B, N, dim // 2)."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        report_queries_keys(q, k)  # for diagnostics; a no-op unless record_queries_keys() is open
        out = split_softmax_attention(q, k, v, self.scale, self.num_splits)
        return out.transpose(1, 2).reshape(b, n, -1)


class EfficientTransformer(nn.Module):
    """ET: 3x3 unfold -> ``x + attn(LN(x))`` -> ``x + MLP(LN(x))`` (ReLU, hidden dim / 4) -> fold.

    (B, C, H, W) in and out; the fold sums the nine overlapping copies of each pixel, as published.
    """

    def __init__(self, channels: int, attention: AttentionFactory, mlp_ratio: float = 0.25) -> None:
        super().__init__()
        dim = channels * 9
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attention(dim)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        hw = x.shape[-2:]
        tokens = F.unfold(x, 3, padding=1).transpose(1, 2)  # (B, H*W, 9C)
        tokens = tokens + self.attn(self.norm1(tokens), (hw[0], hw[1]))
        tokens = tokens + self.mlp(self.norm2(tokens))
        return F.fold(tokens.transpose(1, 2), hw, 3, padding=1)


class ESRTBody(nn.Module):
    """HPBs -> concat -> 3x3 reduction -> Efficient Transformer(s) -> 3x3 conv, adaptive residual around it all."""

    def __init__(self, channels: int, num_block: int, num_et: int, attention: AttentionFactory) -> None:
        super().__init__()
        self.hpbs = nn.ModuleList(HPB(channels) for _ in range(num_block))
        self.reduce = conv3x3(num_block * channels, channels)
        self.transformer = nn.Sequential(*(EfficientTransformer(channels, attention) for _ in range(num_et)))
        self.conv = conv3x3(channels, channels)
        self.scale_x = LearnedScale()
        self.scale_res = LearnedScale()

    def forward(self, x: Tensor) -> Tensor:
        outs, feat = [], x
        for hpb in self.hpbs:
            feat = hpb(feat)
            outs.append(feat)
        merged = self.reduce(torch.cat(outs, dim=1))
        del outs, feat  # not held through the transformer, the pass's high-water mark (autograd keeps its own)
        out = self.conv(self.transformer(merged))
        return self.scale_x(x) + self.scale_res(out)


# network -> (the state of its parameters its fast form was built from, the fast form). Not an attribute of the
# network: as a submodule the fast form would join its state dict, parameters and deep copies (BasicSR's EMA).
_FAST_FORMS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, nn.Module]] = weakref.WeakKeyDictionary()


def _parameter_state(net: nn.Module) -> tuple:
    # Storage and in-place version of every parameter: .to() changes the first, load_state_dict the second.
    return tuple((p.data_ptr(), p._version) for p in net.parameters())


class ESRTLayout(nn.Module):
    """ESRT's network with the transformer's attention given as a module (see the module docstring).

    Works on any input of at least 2x2 pixels (no padding); the output is exactly ``upscale`` times the input.

    Args:
        num_in_ch, num_out_ch: image channels in and out.
        num_feat: feature channels (tokens are ``9 * num_feat`` wide).
        num_block: HPBs in the body.
        num_et: Efficient Transformers in the body.
        upscale: 2, 3 or a power of two.
        attention: ``attention(token_dim)`` builds each transformer's attention module.
        fast_inference: run the fast inference form in inference (see :meth:`forward`); False runs the layers one
            by one there too.
    """

    def __init__(
        self,
        num_in_ch: int,
        num_out_ch: int,
        num_feat: int,
        num_block: int,
        num_et: int,
        upscale: int,
        attention: AttentionFactory,
        fast_inference: bool = True,
    ) -> None:
        super().__init__()
        self.upscale = upscale
        self.head = conv3x3(num_in_ch, num_feat)
        self.body = ESRTBody(num_feat, num_block, num_et, attention)
        self.reduce = conv3x3(num_feat, num_feat)
        self.tail = nn.Sequential(*upsampler(upscale, num_feat), conv3x3(num_feat, num_out_ch))
        self.skip = nn.Sequential(
            *upsampler(upscale, num_feat), conv3x3(num_feat, num_out_ch, bias=False), nn.ReLU(inplace=True)
        )
        self.fast_inference = fast_inference

    @property
    def fast_inference(self) -> bool:
        """Whether inference runs the fast form (the default) or the layers one by one: a constructor argument,
        or set on the network later; either way saved with its config (``save_pretrained``)."""
        return self._fast_inference

    @fast_inference.setter
    def fast_inference(self, value: bool) -> None:
        self._fast_inference = bool(value)
        config = getattr(self, "_hub_mixin_config", None)  # what save_pretrained writes (HubMixin)
        if config is not None:  # a network switched off after construction loads switched off
            config["fast_inference"] = self._fast_inference

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C_in, H, W) in [0, 1] -> (B, C_out, H * upscale, W * upscale).

        In inference (eval mode, and no autograd graph to build: under ``torch.no_grad()`` or
        ``torch.inference_mode()``, or with frozen parameters and an input that needs no gradient) this runs
        :meth:`inference_form`: the fast form unless ``fast_inference`` is off. Otherwise, and while being traced,
        compiled or exported, :meth:`forward_layers`. Tests hold the two equal to float32 rounding.
        """
        form = self if self._records_or_traces(x) else self.inference_form()
        return self.forward_layers(x) if form is self else form(x)

    def forward_layers(self, x: Tensor) -> Tensor:
        """The network layer by layer, as trained (autograd, tracing and export run this)."""
        if min(x.shape[-2:]) < 2:
            raise ValueError(f"input must be at least 2x2 pixels, got {tuple(x.shape[-2:])}")
        shallow = self.head(x)
        return self.tail(self.reduce(self.body(shallow))) + self.skip(shallow)

    def inference_form(self) -> nn.Module:
        """What this network runs in inference: its fast form (:class:`~nala_gen.sr.archs.fast.ESRTInferenceGraph`,
        the same function with folded and composed layers, several times faster), or the network itself while
        training or with ``fast_inference`` off. The fast form is built on first use and again after the
        parameters change (moved, reloaded or trained in place), so callers that make an engine per request (the
        app) pay for it once. For callers that need the module itself (to export it, or to profile its layers);
        the rest call the network."""
        if self.training or not self.fast_inference:
            return self
        state = _parameter_state(self)
        cached = _FAST_FORMS.get(self)
        if cached is None or cached[0] != state:
            cached = _FAST_FORMS[self] = (state, ESRTInferenceGraph(self).eval())
        return cached[1]

    def _records_or_traces(self, x: Tensor) -> bool:
        """Whether this pass is traced or records an autograd graph, which only the layers serve."""
        # The fast form is Python over eager ops and the fused C++ NaLa op: graph capture sees the layers instead.
        if tracing():
            return True
        # Its weights are folded copies: where autograd would record the pass, run the layers that own the weights.
        return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))


class ESRT(ESRTLayout, HubMixin, hub_tags=("super-resolution", "esrt")):
    """ESRT with efficient multi-head attention (split softmax), the published layout less the release's 12 unused
    residual scalars (docs/differences.md: the parameter counts). ``save_pretrained`` / ``from_pretrained`` as
    :class:`NaLaSR`.

    Args:
        num_in_ch, num_out_ch: image channels in and out (3).
        num_feat: feature channels (32).
        num_block: High Preserving Blocks (3).
        num_et: Efficient Transformers (1).
        num_heads: EMHA heads (8).
        upscale: 2, 3 or 4.
        num_splits: EMHA token segments (4).
        fast_inference: run the fast inference form in inference (see :meth:`ESRTLayout.forward`).
    """

    def __init__(
        self,
        num_in_ch: int = 3,
        num_out_ch: int = 3,
        num_feat: int = 32,
        num_block: int = 3,
        num_et: int = 1,
        num_heads: int = 8,
        upscale: int = 4,
        num_splits: int = 4,
        fast_inference: bool = True,
    ) -> None:
        super().__init__(
            num_in_ch,
            num_out_ch,
            num_feat,
            num_block,
            num_et,
            upscale,
            attention=lambda dim: EMHA(dim, num_heads, num_splits),
            fast_inference=fast_inference,
        )
