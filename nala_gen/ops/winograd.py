"""3x3 convolutions of the inference graph by Winograd's F(2x2, 3x3) and F(4x4, 3x3): 16 multiply-adds per input and
output channel for each 2x2 block of outputs (36 for each 4x4 block) where the direct convolution needs 36 (144);
and its 1x1 convolutions on the same register tiles (:func:`conv1x1`).

Why: NaLaSR's and ESRT's convolutions have 16 to 32 input channels, which oneDNN's direct kernels run below their
rate on wide ones (``nala-bench peers --profile``, docs/results/peers.md), so fewer multiply-adds is where the time
is. The C++ kernels (``csrc/winograd.cpp``, built with the package) run on CPUs with AVX-512F. F(2x2, 3x3)'s
transform matrices have entries 0, +-1 and +-1/2, so its results match the direct convolution to float32 rounding;
F(4x4, 3x3)'s (points 0, +-1, +-2) have entries up to 8 and round up to about ten times wider, still within the
graph's 1e-5 of the plain layers (tests pin both). F(4x4, 3x3) runs the 16- and 32-channel inputs, where the
products are most of the time (``LARGE_TILE_CHANNELS``; ``pack`` picks it).

:func:`conv3x3` uses them where they apply, and ``F.conv2d`` everywhere else: float32 CPU tensors outside autograd,
autocast and tracing (an ONNX export or ``torch.compile`` sees ``conv2d``), 16, 32, 48, 64, 80 or 144 input
channels and a multiple of 16 output channels, and not under a dispatch mode (``torch.utils.flop_counter`` counts
the direct convolution's FLOPs, the network's own arithmetic); :func:`conv1x1` likewise for 32 or 144 input
channels. ``NALA_GEN_WINOGRAD=0`` (``RuntimeOptions.winograd``) turns them off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import handle_torch_function, has_torch_function
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .options import RuntimeOptions, runtime_options
from .tracing import tracing

try:
    from nala_gen.ops import _winograd as _op
except ImportError as error:  # not built (a pure-Python install), or built against another torch
    _op, _WHY_NOT = None, f"the Winograd convolution is not importable ({error})"
else:
    _WHY_NOT = None if _op.available() else "this CPU has no AVX-512F"

Tensor = torch.Tensor
INPUT_CHANNELS = (16, 32, 48, 64, 80, 144)  # compiled as constants (csrc/winograd.cpp)
POINTWISE_INPUT_CHANNELS = (32, 144)  # the 1x1 kernel's, compiled as constants
OUTPUT_CHANNEL_MULTIPLE = 16  # one 16-float vector of output channels: register tiles of 32 where they divide
# G of F(2x2, 3x3): the weight's transform G g G^T (rows: g0; (g0 + g1 + g2) / 2; (g0 - g1 + g2) / 2; g2)
_G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
# G of F(4x4, 3x3), interpolation points 0, +-1, +-2 and infinity (the kernel's B^T and A^T match them)
_G4 = (
    (1 / 4, 0.0, 0.0),
    (-1 / 6, -1 / 6, -1 / 6),
    (-1 / 6, 1 / 6, -1 / 6),
    (1 / 24, 1 / 12, 1 / 6),
    (1 / 24, -1 / 12, 1 / 6),
    (0.0, 0.0, 1.0),
)
LARGE_TILE_CHANNELS = (16, 32)  # input channels run by F(4x4, 3x3); the others by F(2x2, 3x3)


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here (None: they can)."""
    return _WHY_NOT


def enabled(runtime: RuntimeOptions | None = None) -> bool:
    """The kernels run here and the options (those in force by default) let them."""
    return _WHY_NOT is None and (runtime or runtime_options()).winograd


def pack(weight: Tensor) -> Tensor:
    """A (Co, Ci, 3, 3) weight -> its transform G g G^T, position-major float32 (computed in float64): (36, Ci, Co)
    for F(4x4, 3x3) where Ci is in ``LARGE_TILE_CHANNELS``, (16, Ci, Co) for F(2x2, 3x3) otherwise; the kernel
    runs the one the transform's size says."""
    rows = _G4 if weight.shape[1] in LARGE_TILE_CHANNELS else _G
    g = torch.tensor(rows, dtype=torch.float64, device=weight.device)
    packed = torch.einsum("ik,ockl,jl->ijco", g, weight.detach().double(), g)
    return packed.reshape(len(rows) ** 2, weight.shape[1], weight.shape[0]).float().contiguous()


def _kernels_run(
    x: Tensor, weight: Tensor, channels: tuple[int, ...], kernel: int, runtime: RuntimeOptions | None
) -> bool:
    """Whether a kernel compiled for ``channels`` input channels and ``kernel`` x ``kernel`` weights runs this
    convolution under ``runtime`` (the options in force by default): float32 CPU maps outside autograd, autocast,
    tracing and dispatch modes."""
    return (
        enabled(runtime)
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 4
        and x.shape[1] in channels
        and tuple(weight.shape[1:]) == (x.shape[1], kernel, kernel)
        and weight.shape[0] % OUTPUT_CHANNEL_MULTIPLE == 0
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and not torch.is_autocast_enabled("cpu")
        and not tracing()
        and not is_in_torch_dispatch_mode()  # a FLOP counter or tracer sees the convolution it computes
    )


def applies(x: Tensor, weight: Tensor, runtime: RuntimeOptions | None = None) -> bool:
    """Whether :func:`conv3x3` runs the Winograd kernels for this input and (Co, Ci, 3, 3) weight."""
    return _kernels_run(x, weight, INPUT_CHANNELS, 3, runtime)


def applies_1x1(x: Tensor, weight: Tensor, runtime: RuntimeOptions | None = None) -> bool:
    """Whether :func:`conv1x1` runs its kernel for this input and (Co, Ci, 1, 1) weight."""
    return _kernels_run(x, weight, POINTWISE_INPUT_CHANNELS, 1, runtime)


def conv1x1(x: Tensor, weight: Tensor, bias: Tensor | None = None, runtime: RuntimeOptions | None = None) -> Tensor:
    """``F.conv2d(x, weight, bias)`` for a (Co, Ci, 1, 1) weight: (B, Ci, H, W) -> (B, Co, H, W), channels-last where
    the kernel runs (the Winograd kernel's register tiles on the pixels' channels: 5-15 % faster than oneDNN on the
    graph's 144-wide token maps, about twice on its 32-channel ones at the pooled resolution)."""
    if not applies_1x1(x, weight, runtime):
        return F.conv2d(x, weight, bias)
    if bias is None:
        bias = x.new_zeros(weight.shape[0])
    weight_t = weight.detach().flatten(1).t().contiguous()  # (Ci, Co): a few thousand floats
    return pointwise_conv(x.contiguous(memory_format=torch.channels_last), weight_t, bias.detach().float().contiguous())


def pointwise_conv(x: Tensor, weight_t: Tensor, bias: Tensor) -> Tensor:
    """The 1x1 kernel itself: x (B, Ci, H, W) channels-last float32, ``weight_t`` (Ci, Co), ``bias`` (Co,) ->
    (B, Co, H, W) channels-last; seen by ``torch.profiler`` (as ``nala_gen::conv1x1``) and ``__torch_function__``
    modes."""
    if has_torch_function((x,)):
        return handle_torch_function(pointwise_conv, (x,), x, weight_t, bias)
    with torch.profiler.record_function("nala_gen::conv1x1"):
        return _op.conv1x1(x, weight_t, bias)


def conv3x3(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    packed: Tensor | None = None,
    runtime: RuntimeOptions | None = None,
) -> Tensor:
    """``F.conv2d(x, weight, bias, padding=1)``: (B, Ci, H, W) -> (B, Co, H, W), channels-last where the kernels run.

    ``packed``: ``pack(weight)``, where the caller keeps it (a layer's fixed weight); made here otherwise (a few
    microseconds for these sizes); ``runtime``: the options to follow (those in force by default)."""
    if not applies(x, weight, runtime):
        return F.conv2d(x, weight, bias, padding=1)
    if packed is None:
        packed = pack(weight)
    if bias is None:
        bias = x.new_zeros(weight.shape[0])
    return winograd_conv3x3(x.contiguous(memory_format=torch.channels_last), packed, bias.detach().float().contiguous())


def winograd_conv3x3(x: Tensor, packed: Tensor, bias: Tensor) -> Tensor:
    """The kernels themselves: x (B, Ci, H, W) channels-last float32, ``packed`` (16 or 36, Ci, Co), ``bias`` (Co,) ->
    (B, Co, H, W) channels-last. Seen by ``torch.profiler`` (as ``nala_gen::winograd_conv3x3``) and by
    ``__torch_function__`` modes, so a profile counts it among the convolutions."""
    if has_torch_function((x,)):
        return handle_torch_function(winograd_conv3x3, (x,), x, packed, bias)
    with torch.profiler.record_function("nala_gen::winograd_conv3x3"):
        return _op.conv3x3(x, packed, bias)


class WinogradConv3x3(nn.Module):
    """A trained ``nn.Conv2d`` (3x3, stride 1, padding 1, no groups or dilation; shared) run by :func:`conv3x3`, its
    transformed weight kept (made again when the weight changes)."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        if not is_plain_3x3(conv):
            raise ValueError(f"not a plain 3x3 convolution: {conv}")
        self.conv = conv
        self._packed: tuple[tuple, Tensor] | None = None

    def packed(self) -> Tensor:
        weight = self.conv.weight
        # an inference tensor (a layer made under torch.inference_mode) has no version counter to read
        key = (weight.data_ptr(), None if weight.is_inference() else weight._version, weight.device)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, pack(weight))
        return self._packed[1]

    def forward(self, x: Tensor) -> Tensor:
        if not applies(x, self.conv.weight):
            return self.conv(x)
        return conv3x3(x, self.conv.weight, self.conv.bias, self.packed())


def is_plain_3x3(conv: nn.Module) -> bool:
    """A 3x3 ``nn.Conv2d`` with stride 1, zero padding 1, no dilation and no groups."""
    return (
        isinstance(conv, nn.Conv2d)
        and conv.kernel_size == (3, 3)
        and conv.stride == (1, 1)
        and conv.padding == (1, 1)
        and conv.dilation == (1, 1)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
    )


def winograd_layer(conv: nn.Module) -> nn.Module:
    """``conv`` wrapped in :class:`WinogradConv3x3` where it is a plain 3x3 convolution whose shape the kernels run
    (its own module otherwise)."""
    fits = is_plain_3x3(conv) and conv.in_channels in INPUT_CHANNELS
    fits = fits and conv.out_channels % OUTPUT_CHANNEL_MULTIPLE == 0
    return WinogradConv3x3(conv) if fits else conv
