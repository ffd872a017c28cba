"""The NaLa block's inference form: :meth:`NaLaAttention.mix <nala_gen.attention.NaLaAttention.mix>` computed a group
of heads at a time, or a band of grid rows at a time, for large token maps in inference.

:class:`HeadGroupedMix` mirrors the block's ``mix`` (the same function: tests hold it to the block's output for each
of RoPE, LePE and the gate on and off) and reads the block only through its documented parts
(:meth:`~nala_gen.attention.NaLaAttention.projection`, :meth:`~nala_gen.attention.NaLaAttention.rope_tables`,
:meth:`~nala_gen.attention.NaLaAttention.head_norm_scale`, ``lepe``, ``out_norm``, ``kernel``, ``kernel_options``).
Why a second form: at an image's token count every (B, N, C) tensor is large, and the block in one piece holds q, k
and v of all heads at once; run in head groups, or streamed a band of rows at a time through the fused op's key
state, the pass holds a fraction of that. NaLaSR's inference graph (:mod:`nala_gen.sr.archs.fast`) runs it.

Its input is either the (B, N, C) tokens or an object that stands for them and is only ever projected
(:class:`ProjectedTokens`): a caller that can make any projection of the tokens more cheaply than the tokens
themselves (NaLaSR's transformer composes them with its reduction) never makes them whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.ops import tracing

from . import fused
from .functional import linear_attention
from .kernels import RAW_KEY_LIMIT, resolve_key_map
from .kernels import kernel as kernel_spec
from .modules import NaLaAttention, map_to_tokens, tokens_to_map

Tensor = torch.Tensor
Grid = tuple[int, int]
# conv1x1(x (B, K, H, W), weight (out, K, 1, 1), bias) -> (B, out, H, W): F.conv2d, or a faster kernel of the caller's
Conv1x1 = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]

# A head group's q/k/v projection is kept within this many bytes (HeadGroupedMix): at 1 MP out at x4 (62,500 tokens
# of NaLaSR-light, 108 MB for all eight heads) two groups of four: as fast as one group there, with a lower peak
# (docs/results/peers.md). Larger maps stream the attention in bands instead (see BAND_BYTES).
QKV_GROUP_BYTES = 64 * 2**20
# Large maps run their per-token steps in bands of whole rows whose widest temporaries stay within this many bytes
# (row_bands): the block's norm and gate here, and NaLaSR's transformer around the block
# (nala_gen.sr.archs.fast.transformer), one budget for both: one band at 1 MP out at x4 (250 rows of 250 px), four
# at 4 MP, where the whole maps (144 to 160 floats per LR pixel each, three or four held at once) were the pass's
# peak. With more than one band the transformer streams the block's attention too (HeadGroupedMix.key_state, .rows):
# what is held whole is x and per-token scalars. At 1 MP the whole-map attention (one band) ran about a tenth faster
# than two bands streamed; at 4 MP four streamed bands ran about a twentieth faster than the whole-map attention a
# head at a time.
BAND_BYTES = 96 * 2**20


class ProjectedTokens(Protocol):
    """(B, N, C) tokens of an H x W grid that are never made whole, only projected: ``project(weight, bias, start,
    stop)``, ``weight`` (K, C, 1, 1), gives the projection (B, n, K) of the tokens of grid rows [start, stop)
    (``stop`` None: all). ``shape``, ``dtype``, ``device`` and ``element_size()`` are those of the tensor they stand
    for."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    def element_size(self) -> int: ...

    def project(
        self, weight: Tensor, bias: Tensor | None = None, start: int = 0, stop: int | None = None
    ) -> Tensor: ...


Tokens = Tensor | ProjectedTokens


def row_bands(height: int, row_bytes: int, budget: int | None = None) -> list[tuple[int, int | None]]:
    """Bands ``[start, stop)`` of whole rows covering ``height`` rows, as few as keep a band's temporaries
    (``row_bytes`` per row) within ``budget`` bytes (default :data:`BAND_BYTES`), of near-equal heights;
    ``[(0, None)]``, the whole map, where one band holds it, and while the pass is traced (export to ONNX: sizes
    are symbols there)."""
    if tracing():
        return [(0, None)]
    count = min(-(-height * row_bytes // (budget or BAND_BYTES)), height)
    if count <= 1:
        return [(0, None)]
    edges = [round(i * height / count) for i in range(count + 1)]
    return list(zip(edges, edges[1:]))


def pointwise(t: Tensor, hw: Grid, weight: Tensor, bias: Tensor | None = None, conv1x1: Conv1x1 = F.conv2d) -> Tensor:
    """A Linear on (B, N, K) tokens of an H x W grid, ``weight`` (out, K, 1, 1), as a 1x1 convolution of their
    channels-last map -> (B, N, out). Why: oneDNN's convolution ran these shapes (tens of thousands of tokens, 100
    to 400 wide) about twice as fast as the Linear's GEMM on this project's CPUs, and without its bias copy. A
    caller with a faster 1x1 kernel for its shapes passes it as ``conv1x1`` (NaLaSR's graph: the project's own,
    :func:`~nala_gen.ops.winograd.conv1x1`)."""
    b, n, _ = t.shape
    return conv1x1(tokens_to_map(t, hw), weight, bias).permute(0, 2, 3, 1).reshape(b, n, -1)


class HeadGroupedMix(nn.Module):
    """The NaLa block's ``mix`` (:meth:`~nala_gen.attention.NaLaAttention.mix`) a group of heads at a time, in
    inference (eval mode, no autograd).

    Heads are independent until the output LayerNorm, and LePE is depthwise, so each group's q/k/v projection,
    attention and LePE run alone and write their channels of one (B, N, C) output, the attention and LePE in one
    pass of the fused op (``linear_attention(..., out=, add=)``). The groups are as few as keep a group's q/k/v
    within ``QKV_GROUP_BYTES``: two at NaLaSR-light's 1 MP out, more at larger inputs, where all three at full
    width would be most of the network's memory (fewer, larger convolutions and op calls run faster, down to
    groups of this size). Then the gate, over all channels, as in the block.

    On maps a caller runs in bands it streams instead (:meth:`streams`): :meth:`key_state` sums the attention's
    key state over all tokens a band at a time, then :meth:`rows` makes any band's output (queries through that
    state, LePE, norm, gate) as the caller needs it.

    Args:
        block: a trained :class:`~nala_gen.attention.NaLaAttention` (shared, in eval mode).
        conv1x1: runs the per-token projections (see :func:`pointwise`).
    """

    def __init__(self, block: NaLaAttention, conv1x1: Conv1x1 = F.conv2d) -> None:
        super().__init__()
        self.block = block
        self.conv1x1 = conv1x1
        heads, d = block.num_heads, block.head_dim
        self.head_dim = d

        def part(name: str) -> tuple[Tensor, Tensor]:
            weight, bias = (t.detach() if t is not None else None for t in block.projection(name))
            return weight, weight.new_zeros(weight.shape[0]) if bias is None else bias

        (w_q, b_q), (w_k, b_k), (w_v, b_v) = (part(name) for name in ("q", "k", "v"))
        # q and k rows head by head, each head's q and k side by side, so that any run of consecutive heads is a
        # contiguous block of rows whatever the grouping; v apart (its rows are already head by head), so that its
        # projection is the dense map LePE convolves, not a strided slice to copy first.
        qk_weight = torch.stack([w_q.unflatten(0, (heads, d)), w_k.unflatten(0, (heads, d))], 1).flatten(0, 2)
        qk_bias = torch.stack([b_q.view(heads, d), b_k.view(heads, d)], 1).flatten()
        # 1x1 conv weights, (2C or C, C, 1, 1): 4-D, so that .to(memory_format=...) takes the graph
        self.register_buffer("qk_weight", qk_weight[..., None, None], persistent=False)
        self.register_buffer("qk_bias", qk_bias, persistent=False)
        self.register_buffer("v_weight", w_v[..., None, None].clone(), persistent=False)
        self.register_buffer("v_bias", b_v.clone(), persistent=False)
        if block.out_norm is not None:
            w_g, b_g = part("g")
            self.register_buffer("gate_weight", w_g[..., None, None].clone(), persistent=False)
            self.register_buffer("gate_bias", b_g.clone(), persistent=False)
        # the streamed attention's projections (key_state, rows): [k | v] for the keys' pass, q for a band's queries
        self.register_buffer("kv_weight", torch.cat([w_k, w_v])[..., None, None], persistent=False)
        self.register_buffer("kv_bias", torch.cat([b_k, b_v]), persistent=False)
        self.register_buffer("q_weight", w_q[..., None, None].clone(), persistent=False)
        self.register_buffer("q_bias", b_q.clone(), persistent=False)

    def _project(self, x: Tokens, hw: Grid, weight: Tensor, bias: Tensor | None = None, rows=(0, None)) -> Tensor:
        """``weight`` (K, C, 1, 1) on the (B, N, C) tokens ``x`` of an H x W grid, rows [start, stop) -> (B, n, K)."""
        start, stop = rows
        if not isinstance(x, Tensor):
            return x.project(weight, bias, start, stop)
        if stop is None:
            return pointwise(x, hw, weight, bias, self.conv1x1)
        return pointwise(x[:, start * hw[1] : stop * hw[1]], (stop - start, hw[1]), weight, bias, self.conv1x1)

    def groups(self, tokens: int, itemsize: int) -> int:
        """The fewest head groups (a divisor of the heads) whose q/k/v projection of ``tokens`` (batch included)
        fits ``QKV_GROUP_BYTES``; one group per head at worst."""
        heads = self.block.num_heads
        per_head = tokens * 3 * self.head_dim * itemsize
        fitting = (g for g in range(1, heads + 1) if heads % g == 0 and per_head * (heads // g) <= QKV_GROUP_BYTES)
        return next(fitting, heads)

    def streams(self, x: Tokens) -> bool:
        """Whether the block's attention can run a band of rows at a time on ``x`` (:meth:`key_state`, then
        :meth:`rows`): the fused op's inference path, float32 on a CPU (no autocast), with no gradient and no
        tracer."""
        block = self.block
        # under autocast the projections come out in bf16, which the op's entries do not write
        return (
            block.kernel == "nala"
            and fused.streamable(x.dtype, x.device, block.kernel_options)
            and not torch.is_autocast_enabled("cpu")
        )

    def _options(self) -> dict:
        """The kernel's options with the block's per-head norm scale (when it has one)."""
        block, scale = self.block, self.block.head_norm_scale()
        return block.kernel_options if scale is None else {**block.kernel_options, "norm_scale": scale}

    def _rope_rows(self, start: int, stop: int, width: int, device: torch.device) -> tuple[Tensor, Tensor] | None:
        """The RoPE tables of grid rows [start, stop) (the whole grid's rows, not the whole grid's tables)."""
        return self.block.rope_tables((stop - start, width), device, first_row=start)

    def key_state(self, x: Tokens, hw: Grid, bands) -> Tensor | None:
        """The attention's key state over all of x's tokens (:func:`~nala_gen.attention.fused.key_state`), summed
        band by band (``bands`` of rows ``[start, stop)`` covering the grid): only one band's k and v are made at a
        time. None when a key is too large for the raw key map as it stands (rare): the rescaling that needs
        takes all the keys at once, so the caller attends the whole map instead."""
        width, c, heads, d = hw[1], x.shape[-1], self.block.num_heads, self.head_dim
        options, state = self._options(), None
        raw_keys = resolve_key_map(options.get("key_map")) == "raw"
        for start, stop in bands:
            kv = self._project(x, hw, self.kv_weight, self.kv_bias, (start, stop))  # (B, n, 2C): [k | v]
            k, v = (part.unflatten(-1, (heads, d)).transpose(1, 2) for part in kv.split(c, -1))  # (B, h, n, d)
            part, key_max = fused.key_state(k, v, self._rope_rows(start, stop, width, x.device), **options)
            if raw_keys and bool((key_max > RAW_KEY_LIMIT).any()):
                return None
            state = part if state is None else state.add_(part)
        return state

    def rows(self, x: Tokens, hw: Grid, state: Tensor, start: int, stop: int) -> Tensor:
        """The block's output before its projection for the tokens of rows [start, stop) -> (B, n, C): their
        queries through ``state`` (:meth:`key_state` of all tokens), plus LePE (from v on those rows and the
        kernel's reach beyond them), the norm and the gate."""
        block, b, (height, width) = self.block, x.shape[0], hw
        c, heads, d = x.shape[-1], block.num_heads, self.head_dim
        q = self._project(x, hw, self.q_weight, self.q_bias, (start, stop))  # (B, n, C)
        n = q.shape[1]
        out = torch.empty(b, n, c, dtype=q.dtype, device=q.device)
        local = None
        if block.lepe is not None:
            lepe, reach = block.lepe, block.lepe.padding[0]
            first, last = max(start - reach, 0), min(stop + reach, height)
            v_tokens = self._project(x, hw, self.v_weight, self.v_bias, (first, last))
            v_map = tokens_to_map(v_tokens, (last - first, width))
            local = F.conv2d(v_map, lepe.weight, lepe.bias, padding=lepe.padding, groups=c)
            local = map_to_tokens(local[..., start - first : stop - first, :]).unflatten(-1, (heads, d)).transpose(1, 2)
        eps_total = kernel_spec(block.kernel).denominator_eps * height * width
        fused.query_into(
            q.unflatten(-1, (heads, d)).transpose(1, 2),
            state,
            self._rope_rows(start, stop, width, q.device),
            eps_total,
            out.unflatten(-1, (heads, d)).transpose(1, 2),
            local,
            **self._options(),
        )
        if block.out_norm is None:
            return out
        gate = self._project(x, hw, self.gate_weight, self.gate_bias, (start, stop))
        return block.out_norm(out).mul_(F.silu(gate, inplace=True))

    def forward(self, x: Tokens, hw: Grid) -> Tensor:
        """x: (B, N, C) tokens of an H x W grid (or :class:`ProjectedTokens` standing for them) -> (B, N, C), the
        block's output before its projection."""
        block = self.block
        rope = block.rope_tables(hw, x.device)
        scale = block.head_norm_scale()
        scale = None if scale is None else scale.view(-1, 1, 1)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        groups = 1 if tracing() else self.groups(x.shape[0] * x.shape[1], x.element_size())
        for g in range(groups):
            self._attend(x, block.num_heads // groups, g, out, hw, rope, scale)
        if block.out_norm is None:
            return out
        bands = row_bands(hw[0], x.shape[0] * hw[1] * 2 * x.shape[-1] * x.element_size())
        if len(bands) == 1 or out.dtype != block.out_norm.weight.dtype:  # (under autocast the norm's is float32)
            out = block.out_norm(out)  # before the gate's projection: the unnormalised output is gone by then
            return out.mul_(F.silu(self._project(x, hw, self.gate_weight, self.gate_bias), inplace=True))
        # Large maps: the norm and gate a band of rows at a time, in place, so that no second and third (B, N, C)
        # map is held beside x and out (the attention's output is each token's own from here on).
        for start, stop in bands:
            tokens = slice(start * hw[1], stop * hw[1])
            gate = self._project(x, hw, self.gate_weight, self.gate_bias, (start, stop))
            out[:, tokens] = block.out_norm(out[:, tokens]).mul_(F.silu(gate, inplace=True))
        return out

    def _attend(
        self,
        x: Tokens,
        per_group: int,
        g: int,
        out: Tensor,
        hw: Grid,
        rope,
        scale: Tensor | None,
    ) -> None:
        """Group ``g`` (of ``per_group`` heads)'s attention and LePE into its channels of ``out``; its
        temporaries die on return."""
        block, (b, n, _), d = self.block, x.shape, self.head_dim
        width = per_group * d
        rows = slice(2 * width * g, 2 * width * (g + 1))
        picked = slice(width * g, width * (g + 1))
        if not isinstance(x, Tensor):  # one projection for q, k and v: wider, so faster than two
            weight = torch.cat([self.qk_weight[rows], self.v_weight[picked]])
            qkv = x.project(weight, torch.cat([self.qk_bias[rows], self.v_bias[picked]]))
            qk, v_tokens = qkv[..., : 2 * width], qkv[..., 2 * width :]
        else:
            qk = pointwise(x, hw, self.qk_weight[rows], self.qk_bias[rows], self.conv1x1)  # (B, N, per_group * 2 * d)
            v_tokens = pointwise(x, hw, self.v_weight[picked], self.v_bias[picked], self.conv1x1)  # (B, N, width)
        q, k = qk.unflatten(-1, (per_group, 2, d)).permute(3, 0, 2, 1, 4)  # each (B, h_g, N, d)
        v = v_tokens.view(b, n, per_group, d).transpose(1, 2)
        options = block.kernel_options
        if scale is not None:
            options = {**options, "norm_scale": scale[g * per_group : (g + 1) * per_group]}
        # (B, h_g, N, d): the group's channels of out, where the attention (plus LePE) is written in one pass
        channels = out[..., g * width : (g + 1) * width].view(b, n, per_group, d).transpose(1, 2)
        local = None
        if block.lepe is not None:
            lepe = block.lepe
            v_map = tokens_to_map(v_tokens, hw)  # channels-last, no copy
            local = F.conv2d(v_map, lepe.weight[picked], lepe.bias[picked], padding=lepe.padding, groups=width)
            local = map_to_tokens(local).reshape(b, n, per_group, d).transpose(1, 2)  # (B, h_g, N, d)
        if tracing():  # an exported graph has no out= writes into strided views: the result is copied in
            result = linear_attention(q, k, v, kernel=block.kernel, rope=rope, add=local, **options)
            out[..., g * width : (g + 1) * width] = result.transpose(1, 2).reshape(b, n, width)
            return
        linear_attention(q, k, v, kernel=block.kernel, rope=rope, out=channels, add=local, **options)
