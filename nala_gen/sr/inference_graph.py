"""A faster inference graph for ESRT-layout networks (NaLaSR, ESRT): the same function, fewer FLOPs and passes.

Made by :func:`inference_graph` from a trained network in well under a second (no compilation), so a one-image
``nala-sr upscale`` gains from it. What it changes, each exact in real arithmetic:

* **Upsamplers as one LR convolution each.** ESRT's tail (``reduce`` conv -> conv + PixelShuffle stages -> conv to
  RGB) and its skip upsampler (the same stages, then a bias-free conv and ReLU) are chains of linear maps, so each
  is one convolution of the LR features to ``3 * scale^2`` channels followed by one PixelShuffle (``ReLU`` commutes
  with the shuffle). At x4 the two chains cost about 0.8 MFLOP per LR pixel, running three quarters of it at 2x
  and 4x resolution; as 7x7 and 5x5 LR convolutions they cost about 0.23 MFLOP and never build a 2x or 4x feature
  map. The composed kernel is read off the chain itself (its response to unit impulses, in float64), so it is
  right for any scale and any weights.
* **Borders recomputed.** The chain pads every intermediate map with zeros, the composed convolution only the
  input, so they differ within the composed kernel's radius ``R`` of an edge. Those bands (``R`` LR pixels on each
  side) are computed with the original chain on strips ``2R`` wide and pasted in; inputs too small for that run
  the original chain.

The graph shares the network's other modules (and so its weights): build it again after changing weights.
Outputs match the plain forward to float32 rounding (tests hold them to 1e-5).
"""

from __future__ import annotations

import copy
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .esrt_arch import ESRTLayout

Tensor = torch.Tensor


def _impulse_response(chain: nn.Module, in_ch: int, scale: int, probe: int) -> tuple[Tensor, Tensor]:
    """The chain's response, pixel-unshuffled to LR, to a unit impulse in each input channel at the centre of a
    ``probe`` x ``probe`` zero input, minus its response to zeros; and that zero response at the centre (the bias).
    Float64. Shapes: (in_ch, out_ch * scale^2, probe, probe) and (out_ch * scale^2,)."""
    chain64 = copy.deepcopy(chain).double().eval()
    centre = probe // 2
    x = torch.zeros(in_ch + 1, in_ch, probe, probe, dtype=torch.float64)
    x[torch.arange(in_ch), torch.arange(in_ch), centre, centre] = 1.0  # the last input stays zero
    with torch.no_grad():
        y = F.pixel_unshuffle(chain64(x), scale)
    zero = y[-1:]
    return y[:-1] - zero, zero[0, :, centre, centre]


def compose_chain(chain: nn.Module, in_ch: int, scale: int, max_radius: int = 5) -> tuple[Tensor, Tensor, int]:
    """Weight (out_ch * scale^2, in_ch, 2R+1, 2R+1), bias and radius R of the LR convolution that equals ``chain``
    (a linear LR (B, in_ch, H, W) -> (B, out_ch, sH, sW) map) followed by ``pixel_shuffle(scale)``, away from
    the borders. Raises if the chain reaches ``max_radius`` LR pixels or further (the probe's edge)."""
    # An impulse's response minus the zero response is the chain's linear part, which the probe's own zero
    # padding does not disturb until the response reaches the probe's edge.
    probe = 2 * max_radius + 1
    response, bias = _impulse_response(chain, in_ch, scale, probe)
    centre = probe // 2
    # (probe, probe): the LR offsets the chain reaches. Unreached taps differ from zero by rounding only (a float64
    # GEMM may sum batch entries in different orders), reached ones by a weight product.
    magnitude = response.abs().amax(dim=(0, 1))
    reach = magnitude > 1e-9 * magnitude.max()
    rows, cols = torch.nonzero(reach, as_tuple=True)
    radius = int(max((rows - centre).abs().max(), (cols - centre).abs().max()))
    if radius >= max_radius:
        raise ValueError(f"the chain reaches {radius} LR pixels, max_radius={max_radius} is too small to see it all")
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
        weight, bias, radius = compose_chain(chain, in_ch, scale)
        like = next(chain.parameters())
        self.register_buffer("weight", weight.to(like), persistent=False)
        self.register_buffer("bias", bias.to(like), persistent=False)
        self.chain = chain
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


class ESRTInferenceGraph(nn.Module):
    """An ESRT-layout network's forward with its two upsamplers composed (see the module docstring).

    Args:
        net: a trained :class:`~nala_gen.sr.esrt_arch.ESRTLayout` (NaLaSR or ESRT); its modules are shared.
    """

    def __init__(self, net: ESRTLayout) -> None:
        super().__init__()
        channels = net.head.out_channels
        self.head = net.head
        self.body = net.body
        self.upscale = net.upscale
        self.tail = ComposedUpsampler(nn.Sequential(net.reduce, *net.tail), channels, net.upscale)
        if not isinstance(net.skip[-1], nn.ReLU):
            raise TypeError("the skip upsampler is expected to end in a ReLU (ESRT's layout)")
        self.skip = ComposedUpsampler(nn.Sequential(*list(net.skip)[:-1]), channels, net.upscale)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C_in, H, W) in [0, 1] -> (B, C_out, H * upscale, W * upscale)."""
        if min(x.shape[-2:]) < 2:
            raise ValueError(f"input must be at least 2x2 pixels, got {tuple(x.shape[-2:])}")
        shallow = self.head(x)
        out = self.tail(self.body(shallow)).add_(self.skip(shallow).relu_())
        return F.pixel_shuffle(out, self.upscale)


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
        cached = _GRAPHS[net] = (state, ESRTInferenceGraph(net))
    return cached[1]
