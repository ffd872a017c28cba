"""A faster inference graph for ESRT-layout networks (NaLaSR, ESRT): the same function, fewer FLOPs and passes.

Made by :func:`inference_graph` from a trained network in well under a second (no compilation), so a one-image
``nala-sr upscale`` gains from it. What it changes, each exact in real arithmetic:

* **Upsamplers as one LR convolution each.** ESRT's tail (conv + PixelShuffle stages, then a conv to RGB) and
  its skip upsampler (the same stages, then a bias-free conv and ReLU) are chains of linear maps, so each is one
  convolution of the LR features to ``3 * scale^2`` channels followed by one PixelShuffle (``ReLU`` commutes with
  the shuffle). At x4 the two chains cost about 0.8 MFLOP per LR pixel, three quarters of it at 2x and 4x
  resolution; as LR convolutions they cost a fraction of that and never build a 2x or 4x feature map. The skip
  reads the head's output, itself a conv of the image, so the head goes into its chain too (one 7x7 conv of the
  3 input channels instead of a 5x5 of 32). The composed kernel is read off the chain itself (its response to
  unit impulses), so it is right for any scale and any weights.
* **Borders recomputed.** The chain pads every intermediate map with zeros, the composed convolution only the
  input, so they differ within the composed kernel's radius ``R`` of an edge. Those bands (``R`` LR pixels on each
  side) are computed with the original chain on strips ``2R`` wide and pasted in; inputs too small for that run
  the original chain.
* **The Efficient Transformer without its 9C-wide tokens** (:class:`ComposedTransformer`): the unfold, both
  LayerNorms, the reduction, the residual adds and the fold become 3x3 convolutions of the features, per-token
  Linears after the attention and two transposed convolutions; the attention itself runs as trained, and the NaLa
  block a group of heads at a time where its q/k/v would be large (:class:`HeadGroupedMix`), its attention and
  LePE written into the output by one pass of the fused op.
  Every per-token Linear runs as a 1x1 convolution of the tokens' channels-last map (oneDNN's kernels, about
  twice as fast as the GEMM here). On large maps (more than one band of rows, see ``TRANSFORMER_BAND_BYTES``) the
  attention streams: its key state is summed band by band, then each band's queries, LePE, norm and gate are made
  as the fold takes them (:meth:`HeadGroupedMix.rows`), so neither q/k/v nor the attention's output is ever whole.
* **No concatenations, scalars folded** (:class:`FoldedARFB`, :class:`FoldedHPB`, :class:`FoldedBody`): a 1x1
  fusion of a concatenation is a sum of 1x1 convs of its parts, and a part that is itself ``conv(h) + s * x1``
  takes the fusion into that conv; the HPB's fusion of the upsampled pooled branch runs before the (linear,
  per-channel) upsampling, at quarter resolution; the body's reduction of the HPBs' outputs is summed as each
  HPB finishes. The ARFBs' learned scales go into their convolutions' weights or onto the residual adds, and the
  channel attention's gate into the next convolution's weight, so no pass copies a map into a wider one or
  multiplies a whole feature map by a scalar or a per-channel gate.
* **3x3 convolutions by Winograd's F(2x2, 3x3)** (:mod:`~nala_gen.sr.archs.winograd`) where the CPU has AVX-512F
  and the shape suits its kernels (32 or more output channels): 16 multiply-adds per channel pair for each 2x2
  block of outputs instead of 36; the same convolution to float32 rounding.

The graph shares the network's layers where it runs them as they are and holds new ones where it folds weights
(the network is never changed); :func:`inference_graph` builds it again when the network's parameters change.
Outputs match the plain forward to float32 rounding (tests hold them to 1e-5; on the shipped weights the largest
difference is a few 1e-6).
"""

from __future__ import annotations

import copy
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.attention import NaLaAttention, fused, linear_attention, map_to_tokens, tokens_to_map
from nala_gen.attention.fused import tracing
from nala_gen.attention.kernels import RAW_KEY_LIMIT, resolve_key_map
from nala_gen.attention.kernels import kernel as kernel_spec
from nala_gen.attention.rope import rope_2d

from . import winograd
from .esrt_arch import ESRTLayout, upsample_to

Tensor = torch.Tensor


REACH_PROBES = (3, 6, 12)  # max_radius tried in turn by ComposedUpsampler
# A head group's q/k/v projection is kept within this many bytes (HeadGroupedMix): at 1 MP out at x4 (62,500 tokens
# of NaLaSR-light, 108 MB for all eight heads) two groups of four: as fast as one group there, with a lower peak
# (docs/results/peers.md). Larger maps stream the attention in bands instead (see TRANSFORMER_BAND_BYTES).
QKV_GROUP_BYTES = 64 * 2**20
# The transformer runs its token maps around the attention in bands of whole LR rows whose widest temporaries stay
# within this many bytes (ComposedTransformer): one band at 1 MP out at x4 (250 rows of 250 px), four at 4 MP, where
# the whole maps (144 to 160 floats per LR pixel each, three or four held at once) were the pass's peak. With more
# than one band the NaLa block's attention streams too (HeadGroupedMix.key_state, .rows): what is held whole is x
# and per-token scalars. At 1 MP the whole-map attention (one band) ran about a tenth faster than two bands
# streamed; at 4 MP four streamed bands ran about a twentieth faster than the whole-map attention a head at a time.
TRANSFORMER_BAND_BYTES = 96 * 2**20
# Where the attention streams, its bands are smaller: each holds its q, v (with LePE's halo), the attention's output,
# its norm and gate beside the fold's temporaries. At 4 MP out eight bands instead of four had a lower live peak
# (282 vs 311 MiB, then the body's) at the same speed.
STREAMED_BAND_BYTES = 48 * 2**20


def _impulse_response(chain: nn.Module, in_ch: int, scale: int, probe: int) -> tuple[Tensor, Tensor]:
    """The chain's response, pixel-unshuffled to LR, to a unit impulse in each input channel at the centre of a
    ``probe`` x ``probe`` zero input, minus its response to zeros; and that zero response at the centre (the bias).
    Float64, on the CPU. Shapes: (in_ch, out_ch * scale^2, probe, probe) and (out_ch * scale^2,)."""
    chain64 = copy.deepcopy(chain).double().eval()
    device = next(chain.parameters()).device
    centre = probe // 2
    x = torch.zeros(in_ch + 1, in_ch, probe, probe, dtype=torch.float64, device=device)
    x[torch.arange(in_ch), torch.arange(in_ch), centre, centre] = 1.0  # the last input stays zero
    with torch.no_grad():
        y = F.pixel_unshuffle(chain64(x), scale).cpu()
    zero = y[-1:]
    return y[:-1] - zero, zero[0, :, centre, centre]


def support_radius(chain: nn.Module, scale: int, max_radius: int) -> int | None:
    """The LR radius that a chain of convolutions and PixelShuffles can reach, from its layers' shapes alone: one
    impulse through the chain's supports (one channel; a conv as a box of ones of its kernel's size, a shuffle as a
    nearest-neighbour upsampling), where nothing cancels, so every tap a weight could reach is non-zero. None for a
    chain with other layers (a stride, an activation) or another scale: the caller reads the reach off the
    response instead."""
    probe = 2 * max_radius + 1
    x = torch.zeros(1, 1, probe, probe)
    x[..., max_radius, max_radius] = 1.0
    factor = 1
    for layer in chain:
        if isinstance(layer, nn.PixelShuffle):
            x = F.interpolate(x, scale_factor=layer.upscale_factor, mode="nearest")
            factor *= layer.upscale_factor
        elif isinstance(layer, nn.Conv2d) and layer.stride == (1, 1):
            box = torch.ones(1, 1, *layer.kernel_size)
            x = F.conv2d(x, box, padding=layer.padding, dilation=layer.dilation)
        elif not isinstance(layer, nn.Identity):
            return None
    if factor != scale or x.shape[-2:] != (probe * scale, probe * scale):
        return None
    rows, cols = torch.nonzero(x[0, 0] > 0, as_tuple=True)
    return int(max((rows // scale - max_radius).abs().max(), (cols // scale - max_radius).abs().max()))


def _too_far(radius: int, max_radius: int) -> ValueError:
    return ValueError(f"the chain reaches {radius} LR pixels, max_radius={max_radius} is too small to see it all")


def compose_chain(chain: nn.Module, in_ch: int, scale: int, max_radius: int = 5) -> tuple[Tensor, Tensor, int]:
    """Weight (out_ch * scale^2, in_ch, 2R+1, 2R+1), bias and radius R of the LR convolution that equals ``chain``
    (a linear LR (B, in_ch, H, W) -> (B, out_ch, sH, sW) map) followed by ``pixel_shuffle(scale)``, away from
    the borders. Raises if the chain reaches ``max_radius`` LR pixels or further (the probe's edge)."""
    # An impulse's response minus the zero response is the chain's linear part, which the probe's own zero
    # padding does not disturb until the response reaches the probe's edge.
    radius = support_radius(chain, scale, max_radius)
    if radius is not None and radius >= max_radius:
        raise _too_far(radius, max_radius)
    # Known from the shapes, the reach sizes the probe: every intermediate map's response lies within it, so its
    # edge's zero padding changes nothing (float64 convolutions run on PyTorch's slow path: the x4 tail's pass on a
    # 5 px probe costs about half what it did on 7 px). Read in float32, the composed weights missed the graph's
    # 1e-5 tolerance on random weights.
    probe = 2 * (max_radius if radius is None else radius) + 1
    response, bias = _impulse_response(chain, in_ch, scale, probe)
    centre = probe // 2
    if radius is None:
        # (probe, probe): the LR offsets the chain reaches. Unreached taps differ from zero by rounding only (a
        # float64 GEMM may sum batch entries in different orders), reached ones by a weight product.
        magnitude = response.abs().amax(dim=(0, 1))
        reach = magnitude > 1e-9 * magnitude.max()
        rows, cols = torch.nonzero(reach, as_tuple=True)
        radius = int(max((rows - centre).abs().max(), (cols - centre).abs().max()))
        if radius >= max_radius:
            raise _too_far(radius, max_radius)
    window = response[:, :, centre - radius : centre + radius + 1, centre - radius : centre + radius + 1]
    # The output at offset (i, j) from an impulse is the kernel tap at (-i, -j) (convolution as correlation).
    weight = window.flip(-2, -1).transpose(0, 1).contiguous()
    return weight, bias, radius


class ComposedUpsampler(nn.Module):
    """A linear LR -> HR chain (convs and PixelShuffles) as one LR convolution to ``out_ch * scale^2`` channels,
    with the chain itself on the border bands. ``forward`` returns the *unshuffled* result, (B, out_ch * s^2, H, W)
    (the caller adds, activates and shuffles once).

    Args:
        chain: the modules, run in order by the border strips and by inputs too small for strips.
        in_ch: LR channels in.
        scale: the chain's upscale factor.
    """

    def __init__(self, chain: nn.Module, in_ch: int, scale: int) -> None:
        super().__init__()
        # The smallest probe that sees the whole reach: a float64 pass over a probe costs its area (0.1 s at 11 px
        # for ESRT's x4 tail, whose reach is 2), and a chain of another design may reach further.
        for max_radius in REACH_PROBES:
            try:
                weight, bias, radius = compose_chain(chain, in_ch, scale, max_radius)
                break
            except ValueError:
                if max_radius == REACH_PROBES[-1]:
                    raise
        like = next(chain.parameters())
        self.register_buffer("weight", weight.to(like), persistent=False)
        self.register_buffer("bias", bias.to(like), persistent=False)
        # the border strips' chain, its 3x3 convolutions by the Winograd kernels where they apply (shared layers)
        self.chain = nn.Sequential(*map(winograd.winograd_layer, chain)) if isinstance(chain, nn.Sequential) else chain
        self.scale = scale
        self.radius = radius

    def _chain(self, x: Tensor) -> Tensor:
        return F.pixel_unshuffle(self.chain(x), self.scale)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, in_ch, H, W) -> (B, out_ch * scale^2, H, W)."""
        h, w = x.shape[-2:]
        r = self.radius
        if min(h, w) < 4 * r:  # no interior worth composing: the strips would be the whole input
            return self._chain(x)
        out = F.conv2d(x, self.weight.to(x.dtype), self.bias.to(x.dtype), padding=r)
        if r == 0:
            return out
        out[..., :r, :] = self._chain(x[..., : 2 * r, :])[..., :r, :]
        out[..., h - r :, :] = self._chain(x[..., h - 2 * r :, :])[..., r:, :]
        out[..., :, :r] = self._chain(x[..., :, : 2 * r])[..., :, :r]
        out[..., :, w - r :] = self._chain(x[..., :, w - 2 * r :])[..., :, r:]
        return out


def _padded_rows(weight: Tensor, multiple: int = 16) -> Tensor:
    """``weight`` with zero rows appended up to a multiple of ``multiple`` outputs: GEMMs and convolutions to an
    odd width (218, 362) ran 20-30 % slower here than to the next multiple of 16."""
    extra = -weight.shape[0] % multiple
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])]) if extra else weight


def _row_bands(height: int, row_bytes: int, budget: int | None = None) -> list[tuple[int, int | None]]:
    """Bands ``[start, stop)`` of whole rows covering ``height`` rows, as few as keep a band's temporaries
    (``row_bytes`` per row) within ``budget`` bytes (default ``TRANSFORMER_BAND_BYTES``), of near-equal heights;
    ``[(0, None)]``, the whole map, where one band holds it, and while the graph is traced (export to ONNX: sizes
    are symbols there)."""
    if tracing():
        return [(0, None)]
    count = min(-(-height * row_bytes // (budget or TRANSFORMER_BAND_BYTES)), height)
    if count <= 1:
        return [(0, None)]
    edges = [round(i * height / count) for i in range(count + 1)]
    return list(zip(edges, edges[1:]))


def _rows_with_halo(x: Tensor, start: int, stop: int | None, halo: int) -> tuple[Tensor, slice]:
    """Rows ``[start, stop)`` (``stop`` None: to the end) of a (B, K, H, W) map with up to ``halo`` rows either
    side (fewer at its edges), and the rows of a same-size convolution of that slice that hold the band: rows a
    zero-padded convolution of the whole map computes alike, since every input row they read is in the slice or
    outside the map."""
    if start == 0 and stop is None:
        return x, slice(None)
    first, last = max(start - halo, 0), min(stop + halo, x.shape[-2])
    return x[..., first:last, :], slice(start - first, stop - first)


def _pointwise(t: Tensor, hw: tuple[int, int], weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """A Linear on (B, N, K) tokens of an H x W grid, ``weight`` (out, K, 1, 1), as a 1x1 convolution of their
    channels-last map -> (B, N, out). Why: oneDNN's convolution ran these shapes (tens of thousands of tokens, 100
    to 400 wide) about twice as fast as the Linear's GEMM on this project's CPUs, and without its bias copy; the
    project's 1x1 kernel (:func:`~nala_gen.sr.archs.winograd.conv1x1`) runs them where it applies."""
    b, n, _ = t.shape
    return winograd.conv1x1(tokens_to_map(t, hw), weight, bias).permute(0, 2, 3, 1).reshape(b, n, -1)


class ConvolvedTokens:
    """The attention's input of :class:`ComposedTransformer` at large maps, ``reduce(LN1(T))`` (B, N, R), never
    made whole: it is only ever projected (q/k/v and the gate, a head group or a band at a time), and a projection
    ``W`` of it is a 3x3 convolution of x with W composed into the reduction, shifted and scaled by each token's
    LN1 statistics: ``W reduce(LN1(T)) = rstd_T * (conv_{W w_r}(x) - mean_T * W w_r 1) + W beta_r``.
    Why: at 4 MP out the (B, N, R) map is 144 MB held through the whole attention, the largest thing in the pass;
    composed, each projection reads the C-wide x instead of the R-wide map, for about a third more multiply-adds in
    these convolutions.

    Args:
        x: (B, C, H, W) the transformer's input; weight: (R, C, 3, 3) the reduction after LN1's scale;
        reduce_sum, reduce_bias: (R,) its row sums and LN1's shift through it; sums: (B, N, 2) each token's
        [sum T | sum T^2]; dim: D, the unfolded token's width; eps: LN1's.
    """

    def __init__(
        self, x: Tensor, weight: Tensor, reduce_sum: Tensor, reduce_bias: Tensor, sums: Tensor, dim: int, eps: float
    ) -> None:
        self.x, self.weight, self.reduce_sum, self.reduce_bias = x, weight, reduce_sum, reduce_bias
        self.mean = sums[..., :1] / dim  # (B, N, 1)
        self.rstd = torch.rsqrt(sums[..., 1:] / dim - self.mean.square() + eps)
        b, _, height, width = x.shape
        self.hw = (height, width)
        self.shape = torch.Size((b, height * width, weight.shape[0]))
        self.dtype = torch.promote_types(x.dtype, reduce_bias.dtype)  # as the materialised map's
        self.device = x.device

    def element_size(self) -> int:
        return self.dtype.itemsize

    def project(self, weight: Tensor, bias: Tensor | None = None, start: int = 0, stop: int | None = None) -> Tensor:
        """``weight`` (K, R, 1, 1) applied to the tokens of rows [start, stop) (``stop`` None: all) -> (B, n, K)."""
        w = weight.flatten(1).to(self.weight.dtype)  # (K, R)
        composed = (w @ self.weight.flatten(1)).view(-1, *self.weight.shape[1:])
        offset = w @ self.reduce_bias if bias is None else torch.addmv(bias.to(w.dtype), w, self.reduce_bias)
        part, rows = _rows_with_halo(self.x, start, stop, 1)
        out = ComposedTransformer._tokens(winograd.conv3x3(part, composed)[..., rows, :])
        tokens = slice(start * self.hw[1], None if stop is None else stop * self.hw[1])
        return out.addcmul_(self.mean[:, tokens], w @ self.reduce_sum, value=-1).mul_(self.rstd[:, tokens]).add_(offset)


def _project(
    x: Tensor | ConvolvedTokens, hw: tuple[int, int], weight: Tensor, bias: Tensor | None = None, rows=(0, None)
) -> Tensor:
    """``weight`` (K, R, 1, 1) on the (B, N, R) tokens ``x`` of an H x W grid, rows [start, stop) -> (B, n, K)."""
    start, stop = rows
    if isinstance(x, ConvolvedTokens):
        return x.project(weight, bias, start, stop)
    if stop is None:
        return _pointwise(x, hw, weight, bias)
    return _pointwise(x[:, start * hw[1] : stop * hw[1]], (stop - start, hw[1]), weight, bias)


class HeadGroupedMix(nn.Module):
    """The NaLa block's ``mix`` (:meth:`~nala_gen.attention.NaLaAttention.mix`) a group of heads at a time.

    Heads are independent until the output LayerNorm, and LePE is depthwise, so each group's q/k/v projection,
    attention and LePE run alone and write their channels of one (B, N, C) output, the attention and LePE in one
    pass of the fused op (``linear_attention(..., out=, add=)``). The groups are as few as keep a group's q/k/v
    within ``QKV_GROUP_BYTES``: two at NaLaSR-light's 1 MP out, more at larger inputs, where all three at full
    width would be most of the network's memory (fewer, larger convolutions and op calls run faster, down to
    groups of this size). Then the gate, over all channels, as in the block.

    On maps the transformer runs in bands it streams instead (:meth:`streams`): :meth:`key_state` sums the
    attention's key state over all tokens a band at a time, then :meth:`rows` makes any band's output (queries
    through that state, LePE, norm, gate) as the fold needs it.

    Args:
        block: a trained :class:`~nala_gen.attention.NaLaAttention` (shared, in eval mode).
    """

    def __init__(self, block: NaLaAttention) -> None:
        super().__init__()
        self.block = block
        c, heads = block.qkvg.in_features, block.num_heads
        self.head_dim = c // heads
        weight = block.qkvg.weight.detach()
        bias = block.qkvg.bias.detach() if block.qkvg.bias is not None else torch.zeros(weight.shape[0]).to(weight)
        rows = torch.arange(self.head_dim, device=weight.device)
        # q and k rows head by head, each head's q and k side by side, so that any run of consecutive heads is a
        # contiguous block of rows whatever the grouping; v apart (its rows are already head by head), so that its
        # projection is the dense map LePE convolves, not a strided slice to copy first.
        index = torch.cat([part * c + h * self.head_dim + rows for h in range(heads) for part in range(2)])
        # 1x1 conv weights, (2C or C, C, 1, 1): 4-D, so that .to(memory_format=...) takes the graph
        self.register_buffer("qk_weight", weight[index][..., None, None], persistent=False)
        self.register_buffer("qk_bias", bias[index], persistent=False)
        self.register_buffer("v_weight", weight[2 * c : 3 * c, :, None, None].clone(), persistent=False)
        self.register_buffer("v_bias", bias[2 * c : 3 * c].clone(), persistent=False)
        if block.out_norm is not None:
            self.register_buffer("gate_weight", weight[3 * c :, :, None, None].clone(), persistent=False)
            self.register_buffer("gate_bias", bias[3 * c :].clone(), persistent=False)
        # the streamed attention's projections (key_state, rows): [k | v] for the keys' pass, q for a band's queries
        self.register_buffer("kv_weight", weight[c : 3 * c, :, None, None].clone(), persistent=False)
        self.register_buffer("kv_bias", bias[c : 3 * c].clone(), persistent=False)
        self.register_buffer("q_weight", weight[:c, :, None, None].clone(), persistent=False)
        self.register_buffer("q_bias", bias[:c].clone(), persistent=False)

    def groups(self, tokens: int, itemsize: int) -> int:
        """The fewest head groups (a divisor of the heads) whose q/k/v projection of ``tokens`` (batch included)
        fits ``QKV_GROUP_BYTES``; one group per head at worst."""
        heads = self.block.num_heads
        per_head = tokens * 3 * self.head_dim * itemsize
        fitting = (g for g in range(1, heads + 1) if heads % g == 0 and per_head * (heads // g) <= QKV_GROUP_BYTES)
        return next(fitting, heads)

    def streams(self, x: Tensor | ConvolvedTokens) -> bool:
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
        block = self.block
        if block.log_norm_scale is None:
            return block.kernel_options
        return {**block.kernel_options, "norm_scale": block.log_norm_scale.exp()}

    def _rope_rows(self, start: int, stop: int, width: int, device: torch.device) -> tuple[Tensor, Tensor] | None:
        """The RoPE tables of grid rows [start, stop) (the whole grid's rows, not the whole grid's tables)."""
        dim = self.block.rope_dim
        return None if dim is None else rope_2d(stop - start, width, dim, device=device, first_row=start)

    def key_state(self, x: Tensor | ConvolvedTokens, hw: tuple[int, int], bands) -> Tensor | None:
        """The attention's key state over all of x's tokens (:func:`~nala_gen.attention.fused.key_state`), summed
        band by band (``bands`` of rows ``[start, stop)`` covering the grid): only one band's k and v are made at a
        time. None when a key is too large for the raw key map as it stands (rare): the rescaling that needs
        takes all the keys at once, so the caller attends the whole map instead."""
        width, c, heads, d = hw[1], x.shape[-1], self.block.num_heads, self.head_dim
        options, state = self._options(), None
        raw_keys = resolve_key_map(options.get("key_map")) == "raw"
        for start, stop in bands:
            kv = _project(x, hw, self.kv_weight, self.kv_bias, (start, stop))  # (B, n, 2C): [k | v]
            k, v = (part.unflatten(-1, (heads, d)).transpose(1, 2) for part in kv.split(c, -1))  # (B, h, n, d)
            part, key_max = fused.key_state(k, v, self._rope_rows(start, stop, width, x.device), **options)
            if raw_keys and bool((key_max > RAW_KEY_LIMIT).any()):
                return None
            state = part if state is None else state.add_(part)
        return state

    def rows(self, x: Tensor | ConvolvedTokens, hw: tuple[int, int], state: Tensor, start: int, stop: int) -> Tensor:
        """The block's output before its projection for the tokens of rows [start, stop) -> (B, n, C): their
        queries through ``state`` (:meth:`key_state` of all tokens), plus LePE (from v on those rows and the
        kernel's reach beyond them), the norm and the gate."""
        block, b, (height, width) = self.block, x.shape[0], hw
        c, heads, d = x.shape[-1], block.num_heads, self.head_dim
        q = _project(x, hw, self.q_weight, self.q_bias, (start, stop))  # (B, n, C)
        n = q.shape[1]
        out = torch.empty(b, n, c, dtype=q.dtype, device=q.device)
        local = None
        if block.lepe is not None:
            lepe, reach = block.lepe, block.lepe.padding[0]
            first, last = max(start - reach, 0), min(stop + reach, height)
            v_map = tokens_to_map(_project(x, hw, self.v_weight, self.v_bias, (first, last)), (last - first, width))
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
        gate = _project(x, hw, self.gate_weight, self.gate_bias, (start, stop))
        return block.out_norm(out).mul_(F.silu(gate, inplace=True))

    def forward(self, x: Tensor | ConvolvedTokens, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) tokens of an H x W grid (or the :class:`ConvolvedTokens` they would be) -> (B, N, C), the
        block's output before its projection."""
        block = self.block
        rope = block._rope(hw, x.device)
        scale = None if block.log_norm_scale is None else block.log_norm_scale.exp().view(-1, 1, 1)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        groups = 1 if tracing() else self.groups(x.shape[0] * x.shape[1], x.element_size())
        for g in range(groups):
            self._attend(x, block.num_heads // groups, g, out, hw, rope, scale)
        if block.out_norm is None:
            return out
        bands = _row_bands(hw[0], x.shape[0] * hw[1] * 2 * x.shape[-1] * x.element_size())
        if len(bands) == 1 or out.dtype != block.out_norm.weight.dtype:  # (under autocast the norm's is float32)
            out = block.out_norm(out)  # before the gate's projection: the unnormalised output is gone by then
            return out.mul_(F.silu(_project(x, hw, self.gate_weight, self.gate_bias), inplace=True))
        # Large maps: the norm and gate a band of rows at a time, in place, so that no second and third (B, N, C)
        # map is held beside x and out (the attention's output is each token's own from here on).
        for start, stop in bands:
            tokens = slice(start * hw[1], stop * hw[1])
            gate = _project(x, hw, self.gate_weight, self.gate_bias, (start, stop))
            out[:, tokens] = block.out_norm(out[:, tokens]).mul_(F.silu(gate, inplace=True))
        return out

    def _attend(
        self,
        x: Tensor | ConvolvedTokens,
        per_group: int,
        g: int,
        out: Tensor,
        hw: tuple[int, int],
        rope,
        scale: Tensor | None,
    ) -> None:
        """Group ``g`` (of ``per_group`` heads)'s attention and LePE into its channels of ``out``; its
        temporaries die on return."""
        block, (b, n, _), d = self.block, x.shape, self.head_dim
        width = per_group * d
        rows = slice(2 * width * g, 2 * width * (g + 1))
        picked = slice(width * g, width * (g + 1))
        if isinstance(x, ConvolvedTokens):  # one convolution of x for q, k and v: wider, so faster than two
            weight = torch.cat([self.qk_weight[rows], self.v_weight[picked]])
            qkv = x.project(weight, torch.cat([self.qk_bias[rows], self.v_bias[picked]]))
            qk, v_tokens = qkv[..., : 2 * width], qkv[..., 2 * width :]
        else:
            qk = _pointwise(x, hw, self.qk_weight[rows], self.qk_bias[rows])  # (B, N, per_group * 2 * d)
            v_tokens = _pointwise(x, hw, self.v_weight[picked], self.v_bias[picked])  # (B, N, width)
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


class ComposedTransformer(nn.Module):
    """ESRT's Efficient Transformer (``EfficientTransformer``) without its ``9C``-wide tokens.

    The transformer unfolds x (B, C, H, W) into tokens T of width D = 9C, computes ``a = T + proj(mix(reduce(
    LN1(T))))`` and ``b = a + MLP(LN2(a))``, and folds b back. Every map around ``mix`` is linear or a LayerNorm,
    so with ``h = mix(...)`` (width R = D / 2) and the MLP's hidden ``z`` (width M):

    * ``reduce(LN1(T)) = rstd_T * (conv(x) - mean_T * rowsum) + reduce(beta1)``: a 3x3 convolution of x, the
      token's mean and variance from 3x3 box sums of the channel sum and sum of squares (the zero padding counted,
      as in unfold);
    * LN2's statistics of ``a = T + W_p h + b_p`` from ``sum T``, ``sum T^2``, ``T . W_p h`` (a convolution of x
      with ``W_p^T``, dotted with h) and ``|W_p h|^2 = h . (W_p^T W_p) h``; its product with ``fc1`` likewise;
    * ``fold(b) = count * x + conv_transpose(h, W_p) + conv_transpose(z, W_2) + fold(b_p + b_2)``, ``count`` the
      number of 3x3 windows covering a pixel.

    Convolutions of x (to R + 1 channels before the attention; after it to R + 1 for LN2's statistics, then to M
    for fc1, so that none is held while the attention runs and one part at a time after it) and Linears on h
    replace the unfold, both LayerNorms, the reduction and the two residual adds over D-wide tokens, and the fold;
    the attention (``mix``) and the MLP's second layer run as before. Per LR pixel it does about a third more
    multiply-adds than the plain module, all in convolutions and GEMMs, and moves several times fewer bytes.

    Args:
        et: a trained :class:`~nala_gen.sr.archs.esrt_arch.EfficientTransformer` whose attention has ``reduce`` (no
            bias), ``mix(tokens, hw)`` and ``proj`` (EMHA and NaLaSR's NaLa block both do); it is shared.
    """

    def __init__(self, et: nn.Module) -> None:
        super().__init__()
        attn = et.attn
        if attn.reduce.bias is not None:
            raise TypeError("the attention's reduction is expected to have no bias (ESRT's layout)")
        self.attention = attn
        block = getattr(attn, "block", None)  # NaLaSR's NaLaTokenAttention: its NaLa block, a head group at a time
        self.mix = HeadGroupedMix(block) if isinstance(block, NaLaAttention) else attn.mix
        like = attn.reduce.weight

        def f64(t: Tensor) -> Tensor:
            return t.detach().double().cpu()

        w_r = f64(attn.reduce.weight)  # (R, D)
        w_p, b_p = f64(attn.proj.weight), f64(attn.proj.bias)  # (D, R), (D,)
        w_1, b_1 = f64(et.mlp[0].weight), f64(et.mlp[0].bias)  # (M, D), (M,)
        w_2, b_2 = f64(et.mlp[2].weight), f64(et.mlp[2].bias)  # (D, M), (D,)
        w_r_g = w_r * f64(et.norm1.weight)  # reduce after LN1's scale
        w_1_g = w_1 * f64(et.norm2.weight)  # fc1 after LN2's scale
        dim = w_r.shape[1]
        channels, self.reduced, self.hidden = dim // 9, w_r.shape[0], w_1.shape[0]
        self.dim, self.eps1, self.eps2 = dim, et.norm1.eps, et.norm2.eps
        ones = torch.ones(1, dim, dtype=torch.float64)
        buffers = {
            # Convs of x: before the attention [reduce(g1 T) | sum T], R + 1 (+ zero rows to pad); after it, for
            # LN2's statistics [W_p^T T | b_p . T], R + 1, then for fc1 [fc1(g2 T)], M: made one after the other
            # (and the same split for the Linears on h), so that no conv output is held while the attention runs
            # and at most one part's outputs are held at a time after it.
            "x_weight_in": _padded_rows(torch.cat([w_r_g, ones])).view(-1, channels, 3, 3),
            "x_weight_proj": _padded_rows(torch.cat([w_p.T, b_p[None]])).view(-1, channels, 3, 3),
            "x_weight_fc1": _padded_rows(w_1_g).view(-1, channels, 3, 3),
            # Linears on h -> [W_p^T W_p h | sum W_p h | b_p . W_p h], R + 2, and [fc1(g2 W_p h)], M (+ pad)
            "h_weight_proj": _padded_rows(torch.cat([w_p.T @ w_p, w_p.sum(0, keepdim=True), (b_p @ w_p)[None]]))[
                ..., None, None
            ],
            "h_weight_fc1": _padded_rows(w_1_g @ w_p)[..., None, None],
            "reduce_sum": w_r_g.sum(1),
            "reduce_bias": w_r @ f64(et.norm1.bias),
            # fc1's per-token terms and its second layer's fold padded like x_weight_fc1 (zeros), so the padded
            # channels of z stay zero and z keeps its full, contiguous width
            "fc1_sum": _padded_rows(w_1_g.sum(1)),
            "fc1_inner": _padded_rows(w_1_g @ b_p),
            "fc1_bias": _padded_rows(w_1 @ f64(et.norm2.bias) + b_1),
            "proj_bias_sum": b_p.sum().view(1),
            "proj_bias_sq": (b_p @ b_p).view(1),
            # the fold's transposed convolutions of h and z as 3x3 convolutions (stride 1, padding 1: the same map
            # with conv_transpose2d's (in, out, 3, 3) weight swapped to (out, in) and flipped), so that they run by
            # the Winograd kernels too
            "fold_h": _as_convolution(w_p.T.reshape(self.reduced, channels, 3, 3)),
            "fold_z": _as_convolution(_padded_rows(w_2.T.reshape(self.hidden, channels, 3, 3))),
            "fold_bias": (b_p + b_2).view(1, channels, 3, 3),
            "fold_bias_inside": (b_p + b_2).view(channels, 9).sum(1),  # a pixel that all nine windows cover
            "box": torch.ones(1, 1, 3, 3, dtype=torch.float64),
        }
        for name, value in buffers.items():
            self.register_buffer(name, value.to(like), persistent=False)
        for name in ("x_weight_in", "x_weight_proj", "x_weight_fc1", "fold_h", "fold_z"):  # the 3x3 convolutions
            self.register_buffer(f"{name}_packed", winograd.pack(getattr(self, name)), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, H, W) -> (B, C, H, W), the Efficient Transformer's output.

        Around the attention, which is global, every step is local (3x3 convolutions of x, per-token products with
        h, a 3x3 fold): each runs a band of rows at a time (one band up to ``TRANSFORMER_BAND_BYTES``), reading its
        neighbours' rows of x, h and z as halos, so that only x, the attention's input and output and per-token
        scalars are held whole; at those sizes the NaLa block's input is not held either: its projections are
        convolutions of x (:class:`ConvolvedTokens`)."""
        b, _, height, width = x.shape
        # a band's widest temporaries per row: a convolution of x and a Linear on h, each R + 1 or 2 (+ pad) wide
        row_bytes = b * width * (self.x_weight_proj.shape[0] + self.h_weight_proj.shape[0]) * 4
        bands = _row_bands(height, row_bytes)
        square_sum = x.square().sum(1, keepdim=True)  # (B, 1, H, W): per pixel, for sum T^2
        # the attention's input (B, N, R), and each token's [sum T | sum T^2] (B, N, 2), kept for LN2
        if len(bands) == 1:
            reduced, sums = self._attention_input(x, square_sum, 0, None)
        elif isinstance(self.mix, HeadGroupedMix):  # large maps: the NaLa block projects convolutions of x instead
            stats = torch.cat([x.sum(1, keepdim=True), square_sum], 1)  # per pixel, box-summed over the token
            sums = self._tokens(F.conv2d(stats, self.box.expand(2, -1, -1, -1), padding=1, groups=2))
            r = self.reduced
            reduced = ConvolvedTokens(
                x, self.x_weight_in[:r], self.reduce_sum, self.reduce_bias, sums, self.dim, self.eps1
            )
        else:
            reduced = sums = None
            for start, stop in bands:
                band, band_sums = self._attention_input(x, square_sum, start, stop)
                if reduced is None:
                    reduced = band.new_empty(b, height * width, band.shape[-1])
                    sums = band_sums.new_empty(b, height * width, 2)
                tokens = slice(start * width, stop * width)
                reduced[:, tokens], sums[:, tokens] = band, band_sums
                del band, band_sums
        del square_sum
        hw = (height, width)
        # Large maps: the attention's key state band by band, then its output a band (and halo) at a time as the
        # fold takes it, so the (B, N, R) output is never whole either; else the whole output, then the bands.
        state = None
        if len(bands) > 1 and isinstance(self.mix, HeadGroupedMix) and self.mix.streams(reduced):
            bands = _row_bands(height, row_bytes, min(STREAMED_BAND_BYTES, TRANSFORMER_BAND_BYTES))  # still several
            state = self.mix.key_state(reduced, hw, bands)
        h = None
        if state is None:
            h = self.mix(reduced, hw)  # (B, N, R)
            reduced = None  # the fold needs only h from here on
        out = None
        for start, stop in bands:
            first, last = _fold_rows(start, stop, height)
            if h is None:
                band_h = self.mix.rows(reduced, hw, state, first, last)
            else:
                band_h = h if stop is None else h[:, first * width : last * width]
            band = self._fold_band(x, band_h, sums, start, stop)
            del band_h
            if stop is None:
                out = band
            else:
                if out is None:
                    out = torch.empty_like(x, dtype=band.dtype)
                out[..., start:stop, :] = band
            del band
        del reduced, h
        return self._add_fold_edges(out.add_(x, alpha=9), x)

    @staticmethod
    def _tokens(t: Tensor) -> Tensor:
        """(B, K, h, W) -> (B, h * W, K); a view for channels-last maps (batch 1)."""
        return t.permute(0, 2, 3, 1).reshape(t.shape[0], -1, t.shape[1])

    def _attention_input(self, x: Tensor, square_sum: Tensor, start: int, stop: int | None) -> tuple[Tensor, Tensor]:
        """Rows [start, stop) (``stop`` None: all from ``start`` = 0): reduce(LN1(T)) (B, n, R) and [sum T | sum T^2]
        (B, n, 2), n their tokens."""
        d, r = self.dim, self.reduced
        part, rows = _rows_with_halo(x, start, stop, 1)
        conv = self._tokens(winograd.conv3x3(part, self.x_weight_in, packed=self.x_weight_in_packed)[..., rows, :])
        part, rows = _rows_with_halo(square_sum, start, stop, 1)
        sums = torch.cat([conv[..., r : r + 1], self._tokens(F.conv2d(part, self.box, padding=1)[..., rows, :])], -1)
        mean_t = sums[..., :1] / d
        rstd_t = torch.rsqrt(sums[..., 1:] / d - mean_t.square() + self.eps1)
        centred = torch.addcmul(conv[..., :r], mean_t, self.reduce_sum, value=-1)  # one pass, no (B, n, R) product
        del conv
        return torch.addcmul(self.reduce_bias, centred, rstd_t), sums

    def _fold_band(self, x: Tensor, h: Tensor, sums: Tensor, start: int, stop: int | None) -> Tensor:
        """Rows [start, stop) (``stop`` None: the whole map) of ``fold(b) - count * x``, (B, C, stop - start, W)
        channels-last; ``h`` (B, n, R) the attention's output on rows :func:`_fold_rows` (the band and the rows
        the fold reads beyond it), ``sums`` each token's [sum T | sum T^2] (B, N, 2) of the whole map."""
        b, _, height, width = x.shape
        d, r = self.dim, self.reduced
        first, last = _fold_rows(start, stop, height)
        if stop is None:  # the whole map
            part, rows, hw = x, slice(None), (height, width)
        else:
            part, rows = _rows_with_halo(x, first, last, 1)
            sums, hw = sums[:, first * width : last * width], (last - first, width)
        conv = self._tokens(winograd.conv3x3(part, self.x_weight_proj, packed=self.x_weight_proj_packed)[..., rows, :])
        lin = _pointwise(h, hw, self.h_weight_proj)  # (B, n, R + 2 + pad)
        mean_a = (sums[..., :1] + lin[..., r : r + 1] + self.proj_bias_sum) / d
        t_dot_o = _row_dot(conv[..., :r], h) + conv[..., r : r + 1]
        o_sq = _row_dot(lin[..., :r], h) + 2 * lin[..., r + 1 : r + 2] + self.proj_bias_sq
        del conv, lin
        rstd_a = torch.rsqrt((sums[..., 1:] + 2 * t_dot_o + o_sq) / d - mean_a.square() + self.eps2)
        pre = self._tokens(winograd.conv3x3(part, self.x_weight_fc1, packed=self.x_weight_fc1_packed)[..., rows, :])
        pre.add_(_pointwise(h, hw, self.h_weight_fc1)).add_(self.fc1_inner)
        z = pre.addcmul_(mean_a, self.fc1_sum, value=-1).mul_(rstd_a).add_(self.fc1_bias).relu_()  # (B, n, M + pad)
        del pre  # the fold below holds only h and z

        def grid(t: Tensor) -> Tensor:  # (B, n, K) -> (B, K, last - first, W), channels-last strides
            return t.reshape(b, hw[0], width, -1).permute(0, 3, 1, 2)

        out = winograd.conv3x3(grid(h), self.fold_h, self.fold_bias_inside, self.fold_h_packed)
        out += winograd.conv3x3(grid(z), self.fold_z, packed=self.fold_z_packed)
        return out if stop is None else out[..., start - first : stop - first, :]

    def _add_fold_edges(self, out: Tensor, x: Tensor) -> Tensor:
        """``out`` holds the fold's bias and ``count * x`` as at a pixel covered by all nine 3x3 windows; fix the
        border rows and columns, covered by fewer. The fold of ones is constant inside, so only its edges (read off
        a fold of at most 3 x 3 ones) are added here, not a whole map of it. The windows covering a pixel are
        counted from the sizes alone (no tensor decides a branch: the graph also exports to ONNX)."""
        height, width = x.shape[-2:]
        probe = x.new_ones(1, 1, min(height, 3), min(width, 3))
        bias = F.conv_transpose2d(probe, self.fold_bias, padding=1)[0] - self.fold_bias_inside.view(-1, 1, 1)
        for row, rows, row_windows in _fold_positions(height):
            for col, cols, col_windows in _fold_positions(width):
                missing = row_windows * col_windows - 9
                if missing == 0:  # inside: nothing to fix
                    continue
                region = out[..., rows, cols]
                region.add_(x[..., rows, cols], alpha=missing).add_(bias[:, row, col, None, None])
        return out


def _fold_rows(start: int, stop: int | None, height: int) -> tuple[int, int]:
    """The rows of h the fold of rows [start, stop) reads (``stop`` None: the whole map): one beyond each side
    (within the map). z's LN2 statistics, convolutions of x, read one row beyond those (a halo of x)."""
    return (0, height) if stop is None else (max(start - 1, 0), min(stop + 1, height))


def _fold_positions(size: int) -> list[tuple[int, slice, int]]:
    """Positions along one side of a 3x3 fold of ``size`` pixels, grouped by how many windows cover them: (index
    into a fold of ``min(size, 3)`` ones, the positions it stands for, how many of the side's 3-wide windows
    cover them)."""
    if size <= 3:
        return [(i, slice(i, i + 1), 1 + (i > 0) + (i < size - 1)) for i in range(size)]
    return [(0, slice(0, 1), 2), (1, slice(1, size - 1), 3), (2, slice(size - 1, size), 2)]


ROW_DOT_CHUNK = 4096  # tokens per step of _row_dot: its product stays a few MB instead of a (B, N, R) tensor


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-token dot products of two (B, N, K) tensors -> (B, N, 1), a chunk of tokens at a time."""
    if tracing():  # a traced loop keeps the traced size's trip count: one step (see linear_attention)
        return (a * b).sum(-1, keepdim=True)
    out = a.new_empty(*a.shape[:-1], 1, dtype=torch.promote_types(a.dtype, b.dtype))  # as (a * b).sum would
    for start in range(0, a.shape[1], ROW_DOT_CHUNK):
        rows = slice(start, start + ROW_DOT_CHUNK)
        out[:, rows] = (a[:, rows] * b[:, rows]).sum(-1, keepdim=True)
    return out


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
        self.body = nn.Sequential(winograd.winograd_layer(conv1), _float32_prelu(act), winograd.winograd_layer(conv2))
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
        self.ru2_hidden = nn.Sequential(winograd.winograd_layer(conv1), _float32_prelu(act))
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
        self.conv = nn.Sequential(winograd.winograd_layer(conv), arfb.conv[1])
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
        part = winograd.conv1x1(x1, self.x1_weight)
        del x1
        fused = winograd.conv3x3(hidden, self.hidden_weight, self.hidden_bias, self.hidden_packed)
        del hidden
        fused = fused.add_(part).relu_()
        del part
        gate = self.attention.gate(fused)  # (B, C, 1, 1): the channel attention's per-channel weights
        if fused.shape[0] == 1:  # they scale the conv's input channels: fold them into its small weight, not the map
            conv = self.gated
            packed = self.conv_packed * gate.view(1, -1, 1).to(self.conv_packed.dtype)
            y = winograd.conv3x3(fused, conv.weight * gate.view(1, -1, 1, 1), conv.bias, packed).relu_()
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
        fused = upsample_to(winograd.conv1x1(low, self.low_weight), hw).add_(winograd.conv1x1(high, self.high_weight))
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
        self.conv = winograd.winograd_layer(_scaled_conv(body.conv, _scalar(body.scale_res)))
        self.scale_x = _scalar(body.scale_x)

    def forward(self, image: Tensor) -> Tensor:
        """image: (B, C_in, H, W) -> (B, C, H, W), the body's output (its residual added) on the head's features."""
        feat, merged = _float32(self.head, image), None
        parts = zip(self.hpbs, self.reduce_weight.chunk(len(self.hpbs)), self.reduce_packed.chunk(len(self.hpbs)))
        for hpb, weight, packed in parts:
            feat = hpb(feat)
            if merged is None:
                merged = winograd.conv3x3(feat, weight, self.reduce_bias, packed)
            else:
                merged = merged.add_(winograd.conv3x3(feat, weight, packed=packed))
        del feat
        return self.conv(self.transformer(merged)).add_(_float32(self.head, image), alpha=self.scale_x)


def _as_convolution(weight: Tensor) -> Tensor:
    """A stride-1 ``conv_transpose2d`` weight (in, out, k, k) -> the ``conv2d`` weight (out, in, k, k) of the same map
    (with padding k - 1 - p for the transposed convolution's p)."""
    return weight.transpose(0, 1).flip(-2, -1).contiguous()


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


class ESRTInferenceGraph(nn.Module):
    """An ESRT-layout network's forward with its two upsamplers composed (see the module docstring).

    Args:
        net: a trained :class:`~nala_gen.sr.archs.esrt_arch.ESRTLayout` (NaLaSR or ESRT); the graph shares its head and
            upsamplers and the body's unfolded layers.
    """

    def __init__(self, net: ESRTLayout) -> None:
        super().__init__()
        channels = net.head.out_channels
        self.head = net.head
        self.upscale = net.upscale
        # The 3x3 ``reduce`` before the tail stays its own layer: composed in, it would widen the kernel from 5x5
        # to 7x7 (about twice the multiply-adds of the two apart).
        self.reduce = winograd.winograd_layer(net.reduce)
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


# network -> (the state of its parameters the graph was built from, the graph)
_GRAPHS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, nn.Module]] = weakref.WeakKeyDictionary()


def _parameter_state(net: nn.Module) -> tuple:
    # Storage and in-place version of every parameter: .to() changes the first, load_state_dict the second.
    return tuple((p.data_ptr(), p._version) for p in net.parameters())


def inference_graph(net: nn.Module) -> nn.Module:
    """The faster inference graph of an ESRT-layout network in eval mode; any other network unchanged.

    Built once per network and reused while its parameters stay as they were (moved, reloaded or trained in
    place, it is built again), so callers that make an engine per request (the app) pay for it once."""
    if not isinstance(net, ESRTLayout) or net.training:
        return net
    state = _parameter_state(net)
    cached = _GRAPHS.get(net)
    if cached is None or cached[0] != state:
        cached = _GRAPHS[net] = (state, ESRTInferenceGraph(net).eval())
    return cached[1]
