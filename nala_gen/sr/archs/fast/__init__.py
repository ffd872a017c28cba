"""The fast inference form of ESRT-layout networks (NaLaSR, ESRT): the same function, fewer FLOPs and passes.

The network builds it itself (:meth:`ESRTLayout.inference_form <nala_gen.sr.archs.esrt_arch.ESRTLayout.inference_form>`)
from its trained layers in well under a second (no compilation), so a one-image ``nala-sr upscale`` gains from it,
and its own ``forward`` runs it in inference. What it changes, each exact in real arithmetic, by module:

* **Upsamplers as one LR convolution each** (:mod:`.upsampler`). ESRT's tail (conv + PixelShuffle stages, then a
  conv to RGB) and its skip upsampler (the same stages, then a bias-free conv and ReLU) are chains of linear maps,
  so each is one convolution of the LR features to ``3 * scale^2`` channels followed by one PixelShuffle (``ReLU``
  commutes with the shuffle). At x4 the two chains cost about 0.8 MFLOP per LR pixel, three quarters of it at 2x
  and 4x resolution; as LR convolutions they cost a fraction of that and never build a 2x or 4x feature map. The
  skip reads the head's output, itself a conv of the image, so the head goes into its chain too (one 7x7 conv of
  the 3 input channels instead of a 5x5 of 32). The composed kernel is read off the chain itself (its response to
  unit impulses), so it is right for any scale and any weights.
* **Borders recomputed** (:mod:`.upsampler`). The chain pads every intermediate map with zeros, the composed
  convolution only the input, so they differ within the composed kernel's radius ``R`` of an edge. Those bands
  (``R`` LR pixels on each side) are computed with the original chain on strips ``2R`` wide and pasted in; inputs
  too small for that run the original chain.
* **The Efficient Transformer without its 9C-wide tokens** (:mod:`.transformer`): the unfold, both LayerNorms, the
  reduction, the residual adds and the fold become 3x3 convolutions of the features, per-token Linears after the
  attention and two transposed convolutions; the attention itself runs as trained, and the NaLa block in its own
  inference form, a group of heads at a time where its q/k/v would be large
  (:class:`~nala_gen.attention.inference.HeadGroupedMix`), its attention and LePE written into the output by one
  pass of the fused op. Every per-token Linear runs as a 1x1 convolution of the tokens' channels-last map
  (oneDNN's kernels, about twice as fast as the GEMM here). On large maps (more than one band of rows, see
  :data:`~nala_gen.attention.inference.BAND_BYTES`) the attention streams: its key state is summed band by band,
  then each band's queries, LePE, norm and gate are made as the fold takes them
  (:meth:`~nala_gen.attention.inference.HeadGroupedMix.rows`), so neither q/k/v nor the attention's output is ever
  whole.
* **No concatenations, scalars folded** (:mod:`.body`): a 1x1 fusion of a concatenation is a sum of 1x1 convs of
  its parts, and a part that is itself ``conv(h) + s * x1`` takes the fusion into that conv; the HPB's fusion of
  the upsampled pooled branch runs before the (linear, per-channel) upsampling, at quarter resolution; the body's
  reduction of the HPBs' outputs is summed as each HPB finishes. The ARFBs' learned scales go into their
  convolutions' weights or onto the residual adds, and the channel attention's gate into the next convolution's
  weight, so no pass copies a map into a wider one or multiplies a whole feature map by a scalar or a per-channel
  gate.
* **3x3 convolutions by Winograd's F(4x4, 3x3) or F(2x2, 3x3)** (:mod:`~nala_gen.ops.winograd`) where the CPU
  has AVX-512F or AVX2 with FMA and the shape suits its kernels (a multiple of 16 output channels): 16 multiply-adds
  per channel pair for each 2x2 block of outputs instead of 36 (36 for a 4x4 block instead of 144); the same
  convolution to float32 rounding. The per-token Linears by the 1x1 kernel on the same register tiles.
* **Each convolution by the kernel fastest on this machine** (:mod:`.conv_choice`): every shape's kernels (each
  Winograd tile, the 1x1 kernel, each instruction set, oneDNN's direct convolution) are timed once per machine and
  the choice kept in the user's cache folder; ``NALA_GEN_CONV_CHOICE=static`` keeps the fixed rule instead.

:mod:`.graph` puts them together (:class:`ESRTInferenceGraph`). The graph shares the network's layers where it
runs them as they are and holds new ones where it folds weights (the network is never changed); the network builds
it again when its parameters change. Outputs match the plain forward to float32 rounding (tests hold them to 1e-5;
on the shipped weights the largest difference is a few 1e-6).
"""

from __future__ import annotations

import warnings

from torch import nn

from .body import FoldedARFB, FoldedBody, FoldedHPB, FoldedResidualUnit
from .graph import ESRTInferenceGraph
from .transformer import ComposedTransformer, ConvolvedTokens
from .upsampler import ComposedUpsampler, compose_chain, support_radius

__all__ = [
    "ComposedTransformer",
    "ComposedUpsampler",
    "ConvolvedTokens",
    "ESRTInferenceGraph",
    "FoldedARFB",
    "FoldedBody",
    "FoldedHPB",
    "FoldedResidualUnit",
    "compose_chain",
    "inference_graph",
    "support_radius",
]


def inference_graph(net: nn.Module) -> nn.Module:
    """Deprecated: ``net.inference_form()``, what an ESRT-layout network runs in inference; any other network as
    it is."""
    warnings.warn(
        "inference_graph(net) is deprecated; the network owns its inference form: net.inference_form(), or net(x)",
        DeprecationWarning,
        stacklevel=2,
    )
    form = getattr(net, "inference_form", None)
    return net if form is None else form()
