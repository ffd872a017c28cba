"""ESRT's two upsamplers as one LR convolution each (see :mod:`~nala_gen.sr.archs.fast`, the first two items).

A chain of convolutions and PixelShuffles is linear, so it equals one convolution of its LR input to
``out_ch * scale^2`` channels followed by one PixelShuffle, away from the borders: :func:`compose_chain` reads that
convolution off the chain's responses to impulses (float64), and :class:`ComposedUpsampler` runs it, with the chain
itself on the border bands, where the chain's zero padding of every intermediate map differs from the composed
convolution's of the input.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from . import conv_choice

Tensor = torch.Tensor

REACH_PROBES = (3, 6, 12)  # max_radius tried in turn by ComposedUpsampler


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
        self.chain = nn.Sequential(*map(conv_choice.layer, chain)) if isinstance(chain, nn.Sequential) else chain
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
