"""Attention and transformer-block modules built on :func:`linear_attention`.

``NaLaAttention`` is the paper's NaLa block, laid out as the released NaLaFormer code lays it: one projection
to q, k, v and a gate g -> the kernel, with 2-D RoPE on the numerator features -> + LePE (a 5x5 depthwise conv
on v over the H x W grid) -> ``LayerNorm(o) * SiLU(g)`` -> output projection. Each part is a switch (``rope``,
``lepe``, ``gate``) so an ablation can take them away one at a time, and the kernel is one name, ``kernel``, from
YAML to feature map (``softmax`` gives the release's vanilla-attention twin of the same block). NaLaSR and NaLaDiT
both use this module.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .functional import linear_attention
from .kernels import feature_dim, kernel_names
from .rope import rope_2d

# norm_scale="tracked": gamma = this ratio times a head's median query norm, so the typical query sits at
# |q| / gamma = 0.5 (tanh' = 0.79 there) and doubling it still moves the power (to tanh 1 = 0.76 from 0.46).
TRACKED_NORM_RATIO = 2.0
# Weight of each training batch's median in the running average (a half-life of about 14 batches).
TRACKED_NORM_MOMENTUM = 0.05
# SiLU(b) = 1 at this b (b * sigmoid(b) = 1): a gate whose projection is zero but for this bias passes LN(o) as is.
GATE_OPEN_BIAS = 1.2784645427610738

Tensor = torch.Tensor
Grid = tuple[int, int]


def tokens_to_map(x: Tensor, hw: Grid) -> Tensor:
    """(B, N, C) tokens in row-major order -> (B, C, H, W), channels-last: a view of contiguous tokens, so a
    convolution reads them as they lie (an NCHW map would transpose all of them first)."""
    b, n, c = x.shape
    h, w = hw
    if n != h * w:
        raise ValueError(f"{n} tokens do not fill a {h}x{w} grid")
    return x.reshape(b, h, w, c).permute(0, 3, 1, 2)


def map_to_tokens(x: Tensor) -> Tensor:
    """(B, C, H, W) -> (B, H*W, C)."""
    return x.flatten(2).transpose(1, 2)


def kernel_from_alias(kernel, old_value, old_name: str, default="nala", new_name: str = "kernel"):
    """The kernel name (or, with ``new_name="kernel_options"``, its options), taking a deprecated argument
    (``attn_type``, ``attention_type``, ``attention_kernel``, ...) when only it is given."""
    if old_value is None:
        return kernel
    if kernel != default and kernel != old_value:
        raise ValueError(f"{new_name}={kernel!r} and the deprecated {old_name}={old_value!r} disagree")
    warnings.warn(f"{old_name}= is deprecated; it is called {new_name}= now", DeprecationWarning, 3)
    return old_value


# Earlier names of the kernel's config keys: NaLaSR's attn_type; NaLaDiT's attention_type, then attention_kernel
# and attention_kernel_options. Each still loads (with a DeprecationWarning) under today's name.
KERNEL_KEY_ALIASES = {
    "attn_type": "kernel",
    "attention_type": "kernel",
    "attention_kernel": "kernel",
    "attention_kernel_options": "kernel_options",
}
KERNEL_KEY_DEFAULTS = {"kernel": "nala", "kernel_options": None}


def with_kernel_keys(config: Mapping) -> dict:
    """A copy of a config mapping (a training YAML's ``model``, a card's or a folder's config) with every
    deprecated kernel key of :data:`KERNEL_KEY_ALIASES` moved to today's name (see :func:`kernel_from_alias`;
    an old key set to null is dropped)."""
    out = dict(config)
    for old, new in KERNEL_KEY_ALIASES.items():
        old_value = out.pop(old, None)
        if old_value is not None:
            default = KERNEL_KEY_DEFAULTS[new]
            out[new] = kernel_from_alias(out.get(new, default), old_value, old, default, new)
    return out


class FusedLinear(nn.Linear):
    """``nn.Linear`` over several projections fused into one weight, whose outputs can be made one part at a time.

    ``forward(x, rows)`` is ``F.linear(x, weight[rows], bias[rows])`` (all rows without ``rows``). Every use of the
    weight goes through the module's own forward, so hooks that wrap it see it: diffusers' layerwise casting
    (weights stored in fp8, cast for the call) and offloading. Same parameters and state dict as ``nn.Linear``.
    """

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        if rows is None:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight[rows], None if self.bias is None else self.bias[rows])


def _grid_rope(
    hw: Grid | None, rope_dim: int | None, device: torch.device, first_row: int = 0
) -> tuple[Tensor, Tensor] | None:
    """2-D RoPE tables for ``rope_dim`` features over the grid ``hw`` (None without either); with ``first_row``,
    rows ``first_row`` onwards of a taller grid's."""
    if rope_dim is None or hw is None:
        return None
    return rope_2d(hw[0], hw[1], rope_dim, device=device, first_row=first_row)


class NaLaAttention(nn.Module):
    """The NaLa block: multi-head kernelised self-attention over (B, N, C) tokens of an H x W grid.

    Args:
        dim: channels C (divisible by ``num_heads``).
        num_heads: attention heads.
        kernel: any name from :func:`~nala_gen.attention.kernel_names` (``nala``, ``nala_split``,
            ``relu``, ``elu1``, ``focused``, ``softmax``); ``attn_type`` is its deprecated name.
        out_dim: width of the output projection (default ``dim``; NaLaSR maps back to its token width).
        qkv_bias: bias in the q/k/v(/g) projection (the release: True).
        rope: 2-D RoPE on the numerator features (on q, k for softmax) when a grid is given. As in the paper, the
            denominator stays unrotated, so with RoPE some effective weights are negative and rows need not sum
            to one (see :func:`~nala_gen.attention.linear_attention`).
        lepe: locally-enhanced positional encoding, a ``lepe_kernel`` depthwise conv on v added to the output
            (needs a grid).
        lepe_kernel: LePE kernel size (the release: 5).
        gate: output gate ``LayerNorm(o) * SiLU(g)``, g projected with q, k, v.
        kernel_options: extra feature-map arguments, e.g. ``{"lam": 3.0, "tau": 0.5, "key_map": "raw"}``.
        norm_scale: ``nala`` only, our extension: ``gamma`` in the query power ``lam * (tau + tanh(|q| / gamma))``.
            None is the paper's gamma = 1; a positive number fixes it; ``"learned"`` learns one per head, positive
            by construction (``gamma = exp(rho)``). A learned gamma starts at each head's median query norm in the
            first training batch (so ``|q| / gamma`` starts in tanh's sensitive range, not in its saturation) and
            is then trained with the rest; ``lam`` stays fixed. Until that first batch (a model only ever
            evaluated) it is 1. ``"tracked"`` is not trained: gamma follows each head's median query norm times
            :data:`TRACKED_NORM_RATIO` (a running average over training batches, kept as a buffer and frozen in
            eval mode, like BatchNorm's statistics), so the typical query sits at ``|q| / gamma = 0.5`` however
            the norms drift in training, and a learned gamma's way out of the mechanism (queries growing into
            tanh's saturation) is closed.

    Forms that compute :meth:`mix` another way (:mod:`nala_gen.attention.inference`) read the block through
    :meth:`projection`, :meth:`rope_tables`, :meth:`head_norm_scale`, ``kernel``, ``kernel_options`` and two
    modules: ``lepe`` (the depthwise convolution on v, None without LePE) and ``out_norm`` (the gate's LayerNorm,
    None without the gate).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        kernel: str = "nala",
        out_dim: int | None = None,
        qkv_bias: bool = True,
        rope: bool = True,
        lepe: bool = True,
        lepe_kernel: int = 5,
        gate: bool = True,
        kernel_options: dict | None = None,
        norm_scale: float | str | None = None,
        attn_type: str | None = None,
    ) -> None:
        super().__init__()
        kernel = kernel_from_alias(kernel, attn_type, "attn_type")
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        if kernel not in kernel_names():
            raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(kernel_names())}")
        if lepe_kernel % 2 == 0:
            raise ValueError(f"lepe_kernel must be odd, got {lepe_kernel}")
        self.num_heads = num_heads
        self.kernel = kernel
        self.kernel_options = dict(kernel_options or {})
        if norm_scale is not None and kernel != "nala":
            raise ValueError(f"norm_scale is an option of the nala kernel, not of {kernel!r}")
        self.norm_scale_mode = norm_scale if norm_scale in ("learned", "tracked") else None
        if norm_scale == "learned":
            self.log_norm_scale = nn.Parameter(torch.zeros(num_heads))
        elif norm_scale == "tracked":
            self.register_buffer("log_norm_scale", torch.zeros(num_heads))
        else:
            self.log_norm_scale = None
            if isinstance(norm_scale, (int, float)) and not isinstance(norm_scale, bool) and 0 < norm_scale < math.inf:
                self.kernel_options["norm_scale"] = float(norm_scale)
            elif norm_scale is not None:
                raise ValueError(
                    f"norm_scale must be None, a positive number, 'learned' or 'tracked', got {norm_scale!r}"
                )
        if self.norm_scale_mode:
            self.register_buffer("norm_scale_started", torch.tensor(False))
        # Fixed by the config, so found once here rather than on every forward.
        self.use_rope = rope
        self.rope_dim = self._rope_dim(kernel, dim // num_heads, self.kernel_options)
        self.qkvg = FusedLinear(dim, (4 if gate else 3) * dim, bias=qkv_bias)
        self.lepe = nn.Conv2d(dim, dim, lepe_kernel, padding=lepe_kernel // 2, groups=dim) if lepe else None
        self.out_norm = nn.LayerNorm(dim) if gate else None
        self.proj = nn.Linear(dim, out_dim or dim)

    def start_parts_neutral(self) -> None:
        """Start the block's learned parts as if they were not there, the usual way to add parts to a network that
        trains well without them: LePE's weights and bias zero (it adds nothing until trained) and the gate open
        (g's projection rows zero, their bias :data:`GATE_OPEN_BIAS`, so ``SiLU(g) = 1`` for every token). Each
        part still gets gradients from the first step (LePE's through v, the gate's through ``LN(o)``). RoPE has
        no parameters; q, k, v and the output projection are left as they are. Without a q/k/v/g bias the gate's
        rows are left as initialised (a zero projection would close it)."""
        dim = self.qkvg.in_features
        with torch.no_grad():
            if self.lepe is not None:
                self.lepe.weight.zero_()
                if self.lepe.bias is not None:
                    self.lepe.bias.zero_()
            if self.out_norm is not None and self.qkvg.bias is not None:
                self.qkvg.weight[3 * dim :].zero_()
                self.qkvg.bias[3 * dim :].fill_(GATE_OPEN_BIAS)

    def _rope_dim(self, kernel: str, head_dim: int, options: dict) -> int | None:
        """Size of the features ``kernel`` rotates (None: no RoPE): linear kernels rotate their features (2d wide
        for the cosine/split maps), softmax rotates q, k; 2-D RoPE needs a size divisible by 4."""
        size = feature_dim(kernel, head_dim, **options)
        return size if self.use_rope and size % 4 == 0 else None

    @property
    def head_dim(self) -> int:
        return self.qkvg.in_features // self.num_heads

    def projection(self, part: str) -> tuple[Tensor, Tensor | None]:
        """One projection of the fused ``qkvg``: its weight (C, C) and bias (C,) (None without ``qkv_bias``), views
        of its rows. ``part``: ``"q"``, ``"k"``, ``"v"`` or, with the gate, ``"g"``; within a part each head's
        ``head_dim`` rows are consecutive, head 0 first (the order :meth:`mix` splits them in)."""
        parts = ("q", "k", "v", "g") if self.out_norm is not None else ("q", "k", "v")
        if part not in parts:
            raise ValueError(f"this block projects {', '.join(parts)}, not {part!r}")
        c = self.qkvg.in_features
        rows = slice(parts.index(part) * c, (parts.index(part) + 1) * c)
        return self.qkvg.weight[rows], None if self.qkvg.bias is None else self.qkvg.bias[rows]

    def rope_tables(self, hw: Grid | None, device: torch.device, first_row: int = 0) -> tuple[Tensor, Tensor] | None:
        """The RoPE tables (cos, sin), each (H*W, F/2), that :meth:`mix` uses on an H x W grid (None without RoPE or
        a grid); with ``first_row``, those of rows ``first_row`` onwards of a taller grid (a band of its rows)."""
        return _grid_rope(hw, self.rope_dim, device, first_row)

    def head_norm_scale(self) -> Tensor | None:
        """A learned or tracked norm scale's per-head gamma (heads,), as inference uses it; None where gamma is a
        number (it is in ``kernel_options`` then) or the paper's 1."""
        return None if self.log_norm_scale is None else self.log_norm_scale.exp()

    def _norm_scale(self, q: Tensor) -> Tensor:
        """Per-head gamma (heads, 1, 1). Learned: started from the median query norms of the first training batch.
        Tracked: those medians times TRACKED_NORM_RATIO, averaged over the training batches (in log space)."""
        tracked = self.norm_scale_mode == "tracked"
        if self.training and (tracked or not bool(self.norm_scale_started)):
            with torch.no_grad():
                norms = torch.linalg.vector_norm(q.detach().float(), dim=-1).transpose(0, 1).flatten(1)
                target = norms.median(dim=1).values.clamp_min(1e-3).log()
                if tracked:
                    target += math.log(TRACKED_NORM_RATIO)
                    if bool(self.norm_scale_started):
                        target = torch.lerp(self.log_norm_scale, target, TRACKED_NORM_MOMENTUM)
                self.log_norm_scale.copy_(target)
                self.norm_scale_started.fill_(True)
        return self.head_norm_scale().view(-1, 1, 1)

    def forward(self, x: Tensor, hw: Grid | None = None) -> Tensor:
        """x: (B, N, C); hw: the (H, W) grid of the N tokens (enables RoPE and LePE). Returns (B, N, out_dim)."""
        return self.proj(self.mix(x, hw))

    def mix(
        self, x: Tensor, hw: Grid | None = None, kernel: str | None = None, kernel_options: dict | None = None
    ) -> Tensor:
        """Everything before the output projection: (B, N, C) -> (B, N, C).

        ``kernel`` (with its ``kernel_options``) runs another kernel on the same weights, as a swapped attention
        processor does (NaLaDiT's ``set_attn_processor``); by default the module's own. A learned or tracked norm
        scale applies to the ``nala`` kernel only.

        Ordered for memory, since at an image's token count every (B, N, C) tensor is large: the gate's
        projection is made only after the attention, LePE runs before it, and the q/k/v projection is released
        before the output is laid out; without autograd the adds and the gate work in place. The projections
        are made by ``qkvg``'s own forward, a part at a time (see :class:`FusedLinear`)."""
        b, n, c = x.shape
        if hw is not None and hw[0] * hw[1] != n:
            raise ValueError(f"{n} tokens do not fill a {hw[0]}x{hw[1]} grid")
        heads = self.num_heads
        options, rope_dim = self.kernel_options, self.rope_dim
        if kernel is None:
            kernel = self.kernel
        elif kernel != self.kernel or (kernel_options or {}) != options:
            options = dict(kernel_options or {})
            rope_dim = self._rope_dim(kernel, c // heads, options)
        qkv = self.qkvg(x, slice(0, 3 * c))
        q, k, v = qkv.unflatten(-1, (3, heads, c // heads)).permute(2, 0, 3, 1, 4)  # each (B, h, N, d)
        local = None
        if self.lepe is not None and hw is not None:
            local = map_to_tokens(self.lepe(tokens_to_map(v.transpose(1, 2).reshape(b, n, c), hw)))
        if self.log_norm_scale is not None and kernel == "nala":
            options = {**options, "norm_scale": self._norm_scale(q)}
        out = linear_attention(q, k, v, kernel=kernel, rope=_grid_rope(hw, rope_dim, x.device), **options)
        del qkv, q, k, v  # without autograd, the projections go before the output's transposed copy is made
        out = out.transpose(1, 2).reshape(b, n, c)
        in_place = not torch.is_grad_enabled()
        if local is not None:
            out = out.add_(local) if in_place else out + local
            del local
        if self.out_norm is not None:
            out = self.out_norm(out)  # before g is made: the unnormalised output is gone by then
            g = self.qkvg(x, slice(3 * c, 4 * c))
            out = out.mul_(F.silu(g, inplace=True)) if in_place else out * F.silu(g)  # in the norm's dtype
        return out


class ConvFFN(nn.Module):
    """Linear -> 3x3 depthwise conv over the grid (skipped without one) -> GELU -> Linear."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: Tensor, hw: Grid | None = None) -> Tensor:
        x = self.fc1(x)
        if hw is not None:
            x = x + map_to_tokens(self.dwconv(tokens_to_map(x, hw)))
        return self.fc2(F.gelu(x))


class NaLaBlock(nn.Module):
    """Pre-norm transformer block: ``x + attn(LN(x))`` then ``x + ConvFFN(LN(x))``.

    Args:
        dim, num_heads, kernel: as in :class:`NaLaAttention`.
        mlp_ratio: hidden width of the FFN relative to ``dim``.
        **attn_kwargs: forwarded to :class:`NaLaAttention`.
    """

    def __init__(self, dim: int, num_heads: int, kernel: str = "nala", mlp_ratio: float = 2.0, **attn_kwargs) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = NaLaAttention(dim, num_heads, kernel=kernel, **attn_kwargs)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = ConvFFN(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor, hw: Grid | None = None) -> Tensor:
        """x: (B, N, C) -> (B, N, C)."""
        x = x + self.attn(self.norm1(x), hw)
        return x + self.ffn(self.norm2(x), hw)
