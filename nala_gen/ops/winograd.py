"""3x3 convolutions of the inference graph by Winograd's F(2x2, 3x3) and F(4x4, 3x3): 16 multiply-adds per input and
output channel for each 2x2 block of outputs (36 for each 4x4 block) where the direct convolution needs 36 (144);
and its 1x1 convolutions on the same register tiles (:func:`conv1x1`).

Why: NaLaSR's and ESRT's convolutions have 16 to 32 input channels, which oneDNN's direct kernels run below their
rate on wide ones (``nala-bench peers --profile``, docs/results/peers.md), so fewer multiply-adds is where the time
is. The C++ kernels (``csrc/winograd.cpp``, built with the package) run on CPUs with AVX-512F or with AVX2 and FMA
(one source compiled for each, ``csrc/winograd_kernels.inc``: a CPU without AVX-512 would otherwise run oneDNN's
direct kernels, the path these kernels exist to beat); ``RuntimeOptions.winograd_isa`` caps which. F(2x2, 3x3)'s
transform matrices have entries 0, +-1 and +-1/2, so its results match the direct convolution to float32 rounding;
F(4x4, 3x3)'s (points 0, +-1, +-2) have entries up to 8 and round up to about ten times wider, still within the
graph's 1e-5 of the plain layers (tests pin both). F(4x4, 3x3) runs the 16- and 32-channel inputs, where the
products are most of the time (``LARGE_TILE_CHANNELS``; ``pack`` picks it).

:func:`conv3x3` uses them where they apply, and ``F.conv2d`` everywhere else: float32 CPU tensors outside autograd,
autocast and tracing (an ONNX export or ``torch.compile`` sees ``conv2d``), 16, 32, 48, 64, 80 or 144 input
channels and a multiple of 16 output channels, and not under a dispatch mode (``torch.utils.flop_counter`` counts
the direct convolution's FLOPs, the network's own arithmetic); :func:`conv1x1` likewise for 32 or 144 input
channels. ``NALA_GEN_WINOGRAD=0`` (``RuntimeOptions.winograd``) turns them off.

Which kernel runs a convolution: by default the fixed rule above (:func:`static_algorithm`); a caller may name one
of :func:`algorithms` (``algorithm=``, and ``isa=``), which is how the SR networks' fast form runs the one that timed
fastest on this machine (:mod:`nala_gen.sr.archs.fast.conv_choice`) and how the tests force each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import handle_torch_function, has_torch_function
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .options import ISAS, RuntimeOptions, runtime_options
from .tracing import tracing

try:
    from nala_gen.ops import _winograd as _op
except ImportError as error:  # not built (a pure-Python install), or built against another torch
    _op, _WHY_NOT = None, f"the Winograd convolution is not importable ({error})"
else:
    _WHY_NOT = None if _op.available() else "this CPU has neither AVX-512F nor AVX2 with FMA"

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
# Which kernel runs a convolution: the Winograd tiles (by their output block), the 1x1 kernel, or ``F.conv2d``
WINOGRAD_4X4, WINOGRAD_2X2, POINTWISE, DIRECT = "winograd4", "winograd2", "pointwise", "direct"
_POSITIONS = {WINOGRAD_4X4: 36, WINOGRAD_2X2: 16}  # of each tile's transformed weight (:func:`pack`)


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here (None: they can)."""
    return _WHY_NOT


def instruction_sets(runtime: RuntimeOptions | None = None) -> tuple[str, ...]:
    """The instruction sets the kernels may run with here, widest first: those this CPU runs (``avx512``, ``avx2``)
    from the options' cap (``RuntimeOptions.winograd_isa``) down; empty where they do not run at all (not built,
    another CPU, ``winograd`` off, or capped at ``baseline``)."""
    options = runtime or runtime_options()
    if _WHY_NOT is not None or not options.winograd:
        return ()
    runs = tuple(_op.instruction_sets())
    cap = options.winograd_isa
    return runs if cap is None else tuple(isa for isa in runs if ISAS.index(isa) >= ISAS.index(cap))


def instruction_set(runtime: RuntimeOptions | None = None) -> str | None:
    """The instruction set the kernels run with under ``runtime`` (the options in force by default); None where they
    do not run."""
    isas = instruction_sets(runtime)
    return isas[0] if isas else None


def enabled(runtime: RuntimeOptions | None = None) -> bool:
    """The kernels run here and the options (those in force by default) let them."""
    return bool(instruction_sets(runtime))


def pack(weight: Tensor, algorithm: str | None = None) -> Tensor:
    """A (Co, Ci, 3, 3) weight -> its transform G g G^T, position-major float32 (computed in float64): (36, Ci, Co)
    for F(4x4, 3x3), (16, Ci, Co) for F(2x2, 3x3); ``algorithm`` (``winograd4`` or ``winograd2``) says which, by
    default the static rule's (:func:`static_algorithm`). The kernel runs the one the transform's size says."""
    if algorithm is None:
        algorithm = WINOGRAD_4X4 if weight.shape[1] in LARGE_TILE_CHANNELS else WINOGRAD_2X2
    rows = {WINOGRAD_4X4: _G4, WINOGRAD_2X2: _G}[algorithm]
    g = torch.tensor(rows, dtype=torch.float64, device=weight.device)
    packed = torch.einsum("ik,ockl,jl->ijco", g, weight.detach().double(), g)
    return packed.reshape(len(rows) ** 2, weight.shape[1], weight.shape[0]).float().contiguous()


def _eligible(x: Tensor, weight: Tensor, kernel: int, runtime: RuntimeOptions | None) -> bool:
    """Whether any kernel may run this convolution of ``kernel`` x ``kernel`` weights under ``runtime`` (the options
    in force by default), its channels aside: float32 CPU maps outside autograd, autocast, tracing and dispatch
    modes, a multiple of 16 output channels."""
    return (
        enabled(runtime)
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 4
        and tuple(weight.shape[1:]) == (x.shape[1], kernel, kernel)
        and weight.shape[0] % OUTPUT_CHANNEL_MULTIPLE == 0
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and not torch.is_autocast_enabled("cpu")
        and not tracing()
        and not is_in_torch_dispatch_mode()  # a FLOP counter or tracer sees the convolution it computes
    )


def algorithms(x: Tensor, weight: Tensor, runtime: RuntimeOptions | None = None) -> tuple[str, ...]:
    """The kernels that can run this convolution (a (Co, Ci, 3, 3) or (Co, Ci, 1, 1) weight) here, in the static
    rule's order of preference, ``direct`` (``F.conv2d``) always last: ``winograd4`` for 16 or 32 input channels,
    ``winograd2`` for ``INPUT_CHANNELS``, ``pointwise`` (1x1) for ``POINTWISE_INPUT_CHANNELS``; only ``direct``
    where none may run (see :func:`_eligible`)."""
    kernel = weight.shape[-1] if weight.dim() == 4 and weight.shape[-1] == weight.shape[-2] else 0
    found: list[str] = []
    if kernel in (1, 3) and _eligible(x, weight, kernel, runtime):
        channels = x.shape[1]
        if kernel == 3 and channels in LARGE_TILE_CHANNELS:
            found.append(WINOGRAD_4X4)
        if kernel == 3 and channels in INPUT_CHANNELS:
            found.append(WINOGRAD_2X2)
        if kernel == 1 and channels in POINTWISE_INPUT_CHANNELS:
            found.append(POINTWISE)
    return (*found, DIRECT)


def static_algorithm(x: Tensor, weight: Tensor, runtime: RuntimeOptions | None = None) -> str:
    """The fixed rule's kernel for this convolution: the first of :func:`algorithms` (F(4x4, 3x3) where it applies,
    then F(2x2, 3x3), the 1x1 kernel, the direct convolution), what runs when no caller names one."""
    return algorithms(x, weight, runtime)[0]


def applies(x: Tensor, weight: Tensor, runtime: RuntimeOptions | None = None) -> bool:
    """Whether :func:`conv3x3` runs the Winograd kernels for this input and (Co, Ci, 3, 3) weight."""
    return weight.shape[-1] == 3 and static_algorithm(x, weight, runtime) != DIRECT


def applies_1x1(x: Tensor, weight: Tensor, runtime: RuntimeOptions | None = None) -> bool:
    """Whether :func:`conv1x1` runs its kernel for this input and (Co, Ci, 1, 1) weight."""
    return weight.shape[-1] == 1 and static_algorithm(x, weight, runtime) != DIRECT


def _resolved(
    x: Tensor, weight: Tensor, runtime: RuntimeOptions | None, algorithm: str | None, isa: str | None
) -> tuple[str, str]:
    """The kernel and instruction set a call runs: those named (checked: a forced kernel that cannot run raises, so
    a test that forces one never compares the direct convolution with itself), else the static rule's and the
    widest allowed."""
    choices = algorithms(x, weight, runtime)
    if algorithm is None:
        algorithm = choices[0]
    elif algorithm not in choices:
        raise ValueError(f"{algorithm!r} cannot run this convolution here; these can: {choices}")
    if algorithm == DIRECT:
        return algorithm, ""
    isas = instruction_sets(runtime)
    if isa is not None and isa not in isas:
        raise ValueError(f"the kernels cannot run with {isa!r} here; they can with: {isas}")
    return algorithm, isa or isas[0]


def conv1x1(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    runtime: RuntimeOptions | None = None,
    algorithm: str | None = None,
    isa: str | None = None,
) -> Tensor:
    """``F.conv2d(x, weight, bias)`` for a (Co, Ci, 1, 1) weight: (B, Ci, H, W) -> (B, Co, H, W), channels-last where
    the kernel runs (the Winograd kernel's register tiles on the pixels' channels).

    ``algorithm``: ``pointwise`` or ``direct`` (:func:`algorithms`), the static rule's by default; ``isa``: the
    kernel's instruction set (the widest the options allow by default)."""
    algorithm, isa = _resolved(x, weight, runtime, algorithm, isa)
    if algorithm == DIRECT:
        return F.conv2d(x, weight, bias)
    if bias is None:
        bias = x.new_zeros(weight.shape[0])
    weight_t = weight.detach().flatten(1).t().contiguous()  # (Ci, Co): a few thousand floats
    x = x.contiguous(memory_format=torch.channels_last)
    return pointwise_conv(x, weight_t, bias.detach().float().contiguous(), isa)


def pointwise_conv(x: Tensor, weight_t: Tensor, bias: Tensor, isa: str = "") -> Tensor:
    """The 1x1 kernel itself: x (B, Ci, H, W) channels-last float32, ``weight_t`` (Ci, Co), ``bias`` (Co,) ->
    (B, Co, H, W) channels-last; ``isa``: ``avx512``, ``avx2`` or ``""`` (the widest this CPU runs). Seen by
    ``torch.profiler`` (as ``nala_gen::conv1x1``) and ``__torch_function__`` modes."""
    if has_torch_function((x,)):
        return handle_torch_function(pointwise_conv, (x,), x, weight_t, bias, isa)
    with torch.profiler.record_function("nala_gen::conv1x1"):
        return _op.conv1x1(x, weight_t, bias, isa)


def conv3x3(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    packed: Tensor | None = None,
    runtime: RuntimeOptions | None = None,
    algorithm: str | None = None,
    isa: str | None = None,
) -> Tensor:
    """``F.conv2d(x, weight, bias, padding=1)``: (B, Ci, H, W) -> (B, Co, H, W), channels-last where the kernels run.

    ``packed``: ``pack(weight)``, where the caller keeps it (a layer's fixed weight); made here otherwise (a few
    microseconds for these sizes), and for the other tile where ``algorithm`` names it (kept beside ``packed``:
    :func:`_packed_for`); ``runtime``: the options to follow (those in force by default); ``algorithm``:
    ``winograd4``, ``winograd2`` or ``direct`` (:func:`algorithms`), the static rule's by default; ``isa``: the
    kernels' instruction set (the widest the options allow by default)."""
    algorithm, isa = _resolved(x, weight, runtime, algorithm, isa)
    if algorithm == DIRECT:
        return F.conv2d(x, weight, bias, padding=1)
    packed = _packed_for(weight, packed, algorithm)
    if bias is None:
        bias = x.new_zeros(weight.shape[0])
    x = x.contiguous(memory_format=torch.channels_last)
    return winograd_conv3x3(x, packed, bias.detach().float().contiguous(), isa)


def _packed_for(weight: Tensor, packed: Tensor | None, algorithm: str) -> Tensor:
    """``pack(weight, algorithm)``, reusing ``packed`` (``pack(weight)`` for some tile, or None) where it is that
    tile's. A caller's packed weight is made for the static rule's tile; where a per-machine choice runs the other
    tile, its transform is kept on the ``packed`` tensor itself (until that tensor changes in place), so a layer's
    fixed weight is transformed once per tile rather than on every call, and no caller has to hold both."""
    if packed is not None and packed.shape[0] == _POSITIONS[algorithm]:
        return packed
    if packed is None:
        return pack(weight, algorithm)
    stamp = (algorithm, None if packed.is_inference() else packed._version)
    kept = packed.__dict__.get("_nala_gen_other_tile")
    if kept is None or kept[0] != stamp:
        kept = (stamp, pack(weight, algorithm))
        packed._nala_gen_other_tile = kept
    return kept[1]


def winograd_conv3x3(x: Tensor, packed: Tensor, bias: Tensor, isa: str = "") -> Tensor:
    """The kernels themselves: x (B, Ci, H, W) channels-last float32, ``packed`` (16 or 36, Ci, Co), ``bias`` (Co,) ->
    (B, Co, H, W) channels-last; ``isa``: ``avx512``, ``avx2`` or ``""`` (the widest this CPU runs). Seen by
    ``torch.profiler`` (as ``nala_gen::winograd_conv3x3``) and by ``__torch_function__`` modes, so a profile counts
    it among the convolutions."""
    if has_torch_function((x,)):
        return handle_torch_function(winograd_conv3x3, (x,), x, packed, bias, isa)
    with torch.profiler.record_function("nala_gen::winograd_conv3x3"):
        return _op.conv3x3(x, packed, bias, isa)


class WinogradConv3x3(nn.Module):
    """A trained ``nn.Conv2d`` (3x3, stride 1, padding 1, no groups or dilation; shared) run by :func:`conv3x3`, its
    transformed weight kept (made again when the weight changes).

    ``run``: the function with :func:`conv3x3`'s arguments ``(x, weight, bias, packed)`` that runs it, this module's
    by default (a caller that picks the kernel per machine passes its own)."""

    def __init__(self, conv: nn.Conv2d, run=None) -> None:
        super().__init__()
        if not is_plain_3x3(conv):
            raise ValueError(f"not a plain 3x3 convolution: {conv}")
        self.conv = conv
        self.run = run or conv3x3
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
        return self.run(x, self.conv.weight, self.conv.bias, self.packed())


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


def winograd_layer(conv: nn.Module, run=None) -> nn.Module:
    """``conv`` wrapped in :class:`WinogradConv3x3` (run by ``run``, see there) where it is a plain 3x3 convolution
    whose shape the kernels run (its own module otherwise)."""
    fits = is_plain_3x3(conv) and conv.in_channels in INPUT_CHANNELS
    fits = fits and conv.out_channels % OUTPUT_CHANNEL_MULTIPLE == 0
    return WinogradConv3x3(conv, run) if fits else conv
