"""ESRT's Efficient Transformer without its ``9C``-wide tokens (see :mod:`~nala_gen.sr.archs.fast`, the third item):
:class:`ComposedTransformer`, and :class:`ConvolvedTokens`, the attention's input it never makes whole on large maps.

The NaLa block inside it runs in its own inference form (:class:`~nala_gen.attention.inference.HeadGroupedMix`),
with this project's 1x1 kernel for its projections; the bands of rows that both run in share one budget
(:data:`~nala_gen.attention.inference.BAND_BYTES`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.attention import NaLaAttention
from nala_gen.attention import inference as block_inference
from nala_gen.attention.inference import HeadGroupedMix, row_bands
from nala_gen.ops import tracing, winograd

from . import conv_choice

Tensor = torch.Tensor
Grid = tuple[int, int]

# Where the attention streams, its bands are smaller: each holds its q, v (with LePE's halo), the attention's output,
# its norm and gate beside the fold's temporaries. At 4 MP out eight bands instead of four had a lower live peak
# (282 vs 311 MiB, then the body's) at the same speed.
STREAMED_BAND_BYTES = 48 * 2**20


def _pointwise(t: Tensor, hw: Grid, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """:func:`~nala_gen.attention.inference.pointwise` by the project's 1x1 kernel where it applies."""
    return block_inference.pointwise(t, hw, weight, bias, conv_choice.conv1x1)


def _padded_rows(weight: Tensor, multiple: int = 16) -> Tensor:
    """``weight`` with zero rows appended up to a multiple of ``multiple`` outputs: GEMMs and convolutions to an
    odd width (218, 362) ran 20-30 % slower here than to the next multiple of 16."""
    extra = -weight.shape[0] % multiple
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])]) if extra else weight


def _rows_with_halo(x: Tensor, start: int, stop: int | None, halo: int) -> tuple[Tensor, slice]:
    """Rows ``[start, stop)`` (``stop`` None: to the end) of a (B, K, H, W) map with up to ``halo`` rows either
    side (fewer at its edges), and the rows of a same-size convolution of that slice that hold the band: rows a
    zero-padded convolution of the whole map computes alike, since every input row they read is in the slice or
    outside the map."""
    if start == 0 and stop is None:
        return x, slice(None)
    first, last = max(start - halo, 0), min(stop + halo, x.shape[-2])
    return x[..., first:last, :], slice(start - first, stop - first)


class ConvolvedTokens:
    """The attention's input of :class:`ComposedTransformer` at large maps, ``reduce(LN1(T))`` (B, N, R), never
    made whole (:class:`~nala_gen.attention.inference.ProjectedTokens` to the NaLa block): it is only ever
    projected (q/k/v and the gate, a head group or a band at a time), and a projection ``W`` of it is a 3x3
    convolution of x with W composed into the reduction, shifted and scaled by each token's
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
        out = ComposedTransformer._tokens(conv_choice.conv3x3(part, composed)[..., rows, :])
        tokens = slice(start * self.hw[1], None if stop is None else stop * self.hw[1])
        return out.addcmul_(self.mean[:, tokens], w @ self.reduce_sum, value=-1).mul_(self.rstd[:, tokens]).add_(offset)


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
        self.mix = HeadGroupedMix(block, conv_choice.conv1x1) if isinstance(block, NaLaAttention) else attn.mix
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
        h, a 3x3 fold): each runs a band of rows at a time (one band up to
        :data:`~nala_gen.attention.inference.BAND_BYTES`), reading its neighbours' rows of x, h and z as halos, so
        that only x, the attention's input and output and per-token scalars are held whole; at those sizes the NaLa
        block's input is not held either: its projections are convolutions of x (:class:`ConvolvedTokens`)."""
        b, _, height, width = x.shape
        # a band's widest temporaries per row: a convolution of x and a Linear on h, each R + 1 or 2 (+ pad) wide
        row_bytes = b * width * (self.x_weight_proj.shape[0] + self.h_weight_proj.shape[0]) * 4
        bands = row_bands(height, row_bytes)
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
            bands = row_bands(height, row_bytes, min(STREAMED_BAND_BYTES, block_inference.BAND_BYTES))  # still several
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
        conv = self._tokens(conv_choice.conv3x3(part, self.x_weight_in, packed=self.x_weight_in_packed)[..., rows, :])
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
        conv = self._tokens(
            conv_choice.conv3x3(part, self.x_weight_proj, packed=self.x_weight_proj_packed)[..., rows, :]
        )
        lin = _pointwise(h, hw, self.h_weight_proj)  # (B, n, R + 2 + pad)
        mean_a = (sums[..., :1] + lin[..., r : r + 1] + self.proj_bias_sum) / d
        t_dot_o = _row_dot(conv[..., :r], h) + conv[..., r : r + 1]
        o_sq = _row_dot(lin[..., :r], h) + 2 * lin[..., r + 1 : r + 2] + self.proj_bias_sq
        del conv, lin
        rstd_a = torch.rsqrt((sums[..., 1:] + 2 * t_dot_o + o_sq) / d - mean_a.square() + self.eps2)
        pre = self._tokens(conv_choice.conv3x3(part, self.x_weight_fc1, packed=self.x_weight_fc1_packed)[..., rows, :])
        pre.add_(_pointwise(h, hw, self.h_weight_fc1)).add_(self.fc1_inner)
        z = pre.addcmul_(mean_a, self.fc1_sum, value=-1).mul_(rstd_a).add_(self.fc1_bias).relu_()  # (B, n, M + pad)
        del pre  # the fold below holds only h and z

        def grid(t: Tensor) -> Tensor:  # (B, n, K) -> (B, K, last - first, W), channels-last strides
            return t.reshape(b, hw[0], width, -1).permute(0, 3, 1, 2)

        out = conv_choice.conv3x3(grid(h), self.fold_h, self.fold_bias_inside, self.fold_h_packed)
        out += conv_choice.conv3x3(grid(z), self.fold_z, packed=self.fold_z_packed)
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


def _as_convolution(weight: Tensor) -> Tensor:
    """A stride-1 ``conv_transpose2d`` weight (in, out, k, k) -> the ``conv2d`` weight (out, in, k, k) of the same map
    (with padding k - 1 - p for the transposed convolution's p)."""
    return weight.transpose(0, 1).flip(-2, -1).contiguous()


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
