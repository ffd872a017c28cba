"""Building blocks shared by ESRT and NaLaSR (Lu et al., "Transformer for Single Image Super-Resolution",
CVPRW 2022), written from the paper.

* Lightweight CNN backbone: High Preserving Blocks (HPB). An HPB keeps the high-frequency part of the
  features at full resolution (HFM: x minus its blurred copy), processes a half-resolution copy with an
  Adaptive Residual Feature Block (ARFB) repeated with shared weights, and fuses both with channel attention.
* Lightweight transformer backbone: the Efficient Transformer (ET) unfolds 3x3 neighbourhoods into tokens
  (32 channels -> 288-d), reduces them to half width, attends, expands back and folds to a feature map.
  ESRT's efficient multi-head attention (EMHA) splits the tokens into segments and runs softmax inside each,
  so its memory is still quadratic (~N^2 / segments). NaLaSR replaces that by global attention over every
  LR pixel with any kernel of :mod:`nala_gen.attention`; nothing else changes, so parameters are equal.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.attention import feature_dim, kernel_names, linear_attention, report_queries_keys, rope_2d

Tensor = torch.Tensor

# `emha` is ESRT's split softmax; every other name is a global kernel of nala_gen.attention.
SR_ATTENTION_TYPES = ("emha", *kernel_names())


class AdaptiveResidual(nn.Module):
    """``w_x * x + w_res * f(x)`` with two learned scalars (ESRT's adaptive residual)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.weight_x = nn.Parameter(torch.ones(1))
        self.weight_res = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight_x * x + self.weight_res * self.body(x)


def residual_unit(channels: int) -> AdaptiveResidual:
    """RU: 1x1 reduction to half the channels, LeakyReLU, 1x1 expansion, adaptive residual."""
    return AdaptiveResidual(
        nn.Sequential(
            nn.Conv2d(channels, channels // 2, 1),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(channels // 2, channels, 1),
        )
    )


class ARFB(nn.Module):
    """Adaptive Residual Feature Block: two RUs, concat, 1x1 then 3x3 conv, adaptive residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.ru1 = residual_unit(channels)
        self.ru2 = residual_unit(channels)
        self.fuse = nn.Sequential(
            nn.Conv2d(2 * channels, 2 * channels, 1),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(2 * channels, channels, 3, padding=1),
        )
        self.weight_x = nn.Parameter(torch.ones(1))
        self.weight_res = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor) -> Tensor:
        r1 = self.ru1(x)
        r2 = self.ru2(r1)
        return self.weight_x * x + self.weight_res * self.fuse(torch.cat((r1, r2), dim=1))


def high_frequency(x: Tensor, kernel: int = 2) -> Tensor:
    """HFM: x minus its low-pass copy (average pooling, then nearest upsampling back to x's size)."""
    low = F.avg_pool2d(x, kernel, ceil_mode=True)
    return x - F.interpolate(low, scale_factor=kernel, mode="nearest")[..., : x.shape[-2], : x.shape[-1]]


class ChannelAttention(nn.Module):
    """Squeeze-and-excitation channel attention."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(channels, max(channels // reduction, 4), 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(max(channels // reduction, 4), channels, 1),
            nn.Sigmoid(),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x * self.body(x)


class HPB(nn.Module):
    """High Preserving Block.

    Args:
        channels: feature channels.
        num_shared: times the shared-weight ARFB runs on the half-resolution branch (ESRT: 5).
    """

    def __init__(self, channels: int, num_shared: int = 5) -> None:
        super().__init__()
        self.entry = ARFB(channels)
        self.high = ARFB(channels)
        self.shared = ARFB(channels)
        self.num_shared = num_shared
        self.attention = ChannelAttention(2 * channels)
        self.reduce = nn.Conv2d(2 * channels, channels, 1)
        self.exit = ARFB(channels)

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        feat = self.entry(x)
        high = self.high(high_frequency(feat))
        low = F.interpolate(feat, scale_factor=0.5, mode="bilinear", align_corners=False)
        for _ in range(self.num_shared):
            low = self.shared(low)
        low = F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)
        fused = self.reduce(self.attention(torch.cat((high, low), dim=1)))
        return self.exit(fused) + x


def split_softmax_attention(q: Tensor, k: Tensor, v: Tensor, num_splits: int) -> Tensor:
    """ESRT's EMHA core: tokens split into ``num_splits`` segments, explicit softmax inside each.

    The (N / s) x (N / s) score matrices are materialised, as in ESRT, so memory grows as N^2 / s.
    q, k, v: (B, heads, N, d) -> (B, heads, N, d).
    """
    outputs = []
    for qs, ks, vs in zip(*(t.tensor_split(num_splits, dim=-2) for t in (q, k, v))):
        scores = (qs @ ks.transpose(-2, -1)) * qs.shape[-1] ** -0.5
        outputs.append(torch.softmax(scores, dim=-1) @ vs)
    return torch.cat(outputs, dim=-2)


class TokenAttention(nn.Module):
    """EMHA layout (reduction -> q/k/v -> attention -> expansion) with the attention chosen by name.

    Args:
        dim: token width (ESRT: 288 = 32 channels x 3 x 3).
        num_heads: heads after the reduction (ESRT: 8).
        attn_type: ``emha`` (ESRT's split softmax) or a kernel of :mod:`nala_gen.attention`, global over
            every token: ``nala``, ``nala_split``, ``softmax`` (fused SDPA), ``relu``, ``elu1``, ``focused``.
        num_splits: token segments for ``emha`` (ESRT: 4).
        use_rope: 2-D RoPE on the features of the global kernels (no parameters).
    """

    def __init__(self, dim: int, num_heads: int, attn_type: str, num_splits: int = 4, use_rope: bool = True) -> None:
        super().__init__()
        if attn_type not in SR_ATTENTION_TYPES:
            raise ValueError(f"unknown attn_type {attn_type!r}; choose one of {', '.join(SR_ATTENTION_TYPES)}")
        inner = dim // 2
        if inner % num_heads:
            raise ValueError(f"reduced width {inner} is not divisible by num_heads {num_heads}")
        self.attn_type = attn_type
        self.num_heads = num_heads
        self.num_splits = num_splits
        # 2-D RoPE on the kernel's features (size found once here, not per forward); it needs a multiple of 4.
        rope_dim = None if attn_type == "emha" else feature_dim(attn_type, inner // num_heads)
        self.rope_dim = rope_dim if use_rope and rope_dim is not None and rope_dim % 4 == 0 else None
        self.reduce = nn.Linear(dim, inner)
        self.qkv = nn.Linear(inner, 3 * inner, bias=False)
        self.expand = nn.Linear(inner, dim)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, hw: tuple[int, int]) -> Tensor:
        """The parameter-free part: (B, heads, N, d) q, k, v -> (B, heads, N, d)."""
        if self.attn_type == "emha":
            report_queries_keys(q, k)  # for diagnostics; a no-op unless record_queries_keys() is open
            return split_softmax_attention(q, k, v, self.num_splits)
        rope = None if self.rope_dim is None else rope_2d(*hw, self.rope_dim, device=q.device)
        return linear_attention(q, k, v, kernel=self.attn_type, rope=rope)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, dim) tokens of an H x W grid -> (B, N, dim)."""
        b, n, _ = x.shape
        x = self.reduce(x)
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        out = self.attend(q, k, v, hw).transpose(1, 2).reshape(b, n, -1)
        return self.expand(out)


class EfficientTransformer(nn.Module):
    """ET: 3x3 unfold -> LN -> attention -> residual -> LN -> MLP -> residual -> fold. (B, C, H, W) in/out."""

    def __init__(
        self,
        channels: int,
        num_heads: int = 8,
        attn_type: str = "emha",
        mlp_ratio: float = 0.25,
        num_splits: int = 4,
        use_rope: bool = True,
    ) -> None:
        super().__init__()
        dim = channels * 9
        self.norm1 = nn.LayerNorm(dim)
        self.attn = TokenAttention(dim, num_heads, attn_type, num_splits, use_rope)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        tokens = F.unfold(x, 3, padding=1).transpose(1, 2)  # (B, H*W, 9C)
        tokens = tokens + self.attn(self.norm1(tokens), (h, w))
        tokens = tokens + self.mlp(self.norm2(tokens))
        return F.fold(tokens.transpose(1, 2), (h, w), 3, padding=1)


class Upsampler(nn.Sequential):
    """Conv + PixelShuffle stages: x2 and x3 in one stage, powers of two in several."""

    def __init__(self, scale: int, channels: int, out_channels: int) -> None:
        layers: list[nn.Module] = []
        if scale in (2, 3):
            layers += [nn.Conv2d(channels, channels * scale**2, 3, padding=1), nn.PixelShuffle(scale)]
        elif scale & (scale - 1) == 0:
            for _ in range(int(math.log2(scale))):
                layers += [nn.Conv2d(channels, channels * 4, 3, padding=1), nn.PixelShuffle(2)]
        else:
            raise ValueError(f"upscale must be 2, 3 or a power of two, got {scale}")
        layers.append(nn.Conv2d(channels, out_channels, 3, padding=1))
        super().__init__(*layers)


class ESRTBackbone(nn.Module):
    """Head conv, HPBs (CNN backbone), ETs (transformer backbone), two upsampling tails summed.

    Works on any input size (no padding needed); the output is exactly ``upscale`` times the input.
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
        attn_type: str = "emha",
        num_splits: int = 4,
        use_rope: bool = True,
        img_range: float = 1.0,
    ) -> None:
        super().__init__()
        self.upscale = upscale
        self.img_range = img_range
        self.head = nn.Conv2d(num_in_ch, num_feat, 3, padding=1)
        self.cnn = nn.Sequential(*(HPB(num_feat) for _ in range(num_block)))
        self.transformer = nn.Sequential(
            *(
                EfficientTransformer(num_feat, num_heads, attn_type, num_splits=num_splits, use_rope=use_rope)
                for _ in range(num_et)
            )
        )
        self.tail = Upsampler(upscale, num_feat, num_out_ch)
        self.skip = Upsampler(upscale, num_feat, num_out_ch)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C_in, H, W) in [0, img_range] -> (B, C_out, H*upscale, W*upscale)."""
        shallow = self.head(x)
        deep = self.transformer(self.cnn(shallow))
        return self.tail(deep) + self.skip(shallow)
