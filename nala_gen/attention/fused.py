"""The fused CPU path of ``linear_attention(kernel="nala")``: a C++ op built with the package, and its autograd.

The eager map is a dozen elementwise passes over (N, 2d) buffers; the op (``csrc/nala_fused.cpp``) maps, rotates
(RoPE) and multiplies tiles of 64 tokens while they sit in cache, forward and backward, with the same math: exp/log
for the norm-aware power, ``tanh`` from one exp, cos/sin of the angle (always within pi/4) by short polynomials,
and the keys' integer power by products. Results match the eager path to float rounding (tests pin 1e-5).

It is used whenever it can be: CPU tensors, float32 math (half/bf16 are upcast as on the eager path), the ``nala``
kernel, a norm scale that is a number or one value per head, and not while tracing or compiling (``torch.export``,
ONNX, ``torch.compile`` see the PyTorch ops). ``NALA_GEN_FUSED=0`` turns it off. Without the built op (a pure-Python
install, or a torch whose ABI differs from the one it was built against) the eager path runs and
:func:`unavailable_reason` says why.
"""

from __future__ import annotations

import inspect
import os
import sys

import torch
from torch.autograd.function import once_differentiable

from .kernels import (
    RAW_KEY_LIMIT,
    check_norm_scale,
    nala_features,
    resolve_angle_scale,
    resolve_key_map,
    safe_keys,
    upcast,
)

try:
    from nala_gen.attention import _nala_fused as _op
except ImportError as error:  # not built, or built against another torch
    _op = None
    _WHY_NOT = f"the fused NaLa op is not importable ({error}); reinstall with `pip install --no-build-isolation .`"
else:
    _WHY_NOT = None

Tensor = torch.Tensor
# The NaLa map's options and defaults, read from the map itself (one source for both paths).
NALA_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(nala_features).parameters.items()
    if p.default is not inspect.Parameter.empty
}
OPTIONS = frozenset(NALA_DEFAULTS)
MAX_HEAD_DIM = 512


def available() -> bool:
    """The op is built and importable (it may still be switched off by ``NALA_GEN_FUSED=0``)."""
    return _op is not None


def unavailable_reason() -> str | None:
    return _WHY_NOT


def instruction_set() -> str | None:
    """The widest compiled variant this CPU runs (``avx512``, ``avx2`` or ``baseline``); None without the op.

    The 16-float AVX-512 kernels take a head unless their padding to 16 floats (d and dv) makes its products more
    vector work than the 8-float AVX2 kernels' (heads of 8 floats, say), which then run it.
    ``NALA_GEN_FUSED_ISA=avx2`` (or ``baseline``), set before the first call, caps the choice."""
    return None if _op is None else _op.isa()


def enabled() -> bool:
    return _op is not None and os.environ.get("NALA_GEN_FUSED", "1").lower() not in ("0", "false", "no")


def new_output(shape: tuple[int, ...]) -> Tensor:
    """An uninitialised float32 CPU tensor for the op's inference output.

    A large tensor from PyTorch's allocator is page-faulted in afresh on every call (glibc returns blocks above
    its mmap threshold to the system when they are freed, and the kernel clears each page again), which was a
    third of the op's time at 71,680 tokens. Outputs of 1 MiB or more therefore come from the op, as do its
    backward's gradients: freed blocks are kept (three at most, the last freed) for the next outputs of up to twice
    their size, so layers that call the op one after another, a training step's gradients once applied, or a
    benchmark's repeats reuse them. The trade is those blocks' memory, held between calls
    (:func:`kept_output_bytes`); :func:`release_output_blocks` frees them; ``NALA_GEN_OUTPUT_BLOCKS=0`` takes
    PyTorch's allocator for both (``csrc/output_blocks.h`` reads it on every call). Tensors on such a block cannot
    be resized in place (``resize_``)."""
    return torch.empty(shape) if _op is None else _op.new_output(list(shape))


def release_output_blocks() -> int:
    """Frees the blocks the op keeps for its next outputs; returns the bytes they held (0 without the op)."""
    return 0 if _op is None else int(_op.release_output_blocks())


def kept_output_bytes() -> int:
    """Bytes held by the blocks the op keeps for its next outputs."""
    return 0 if _op is None else int(_op.kept_output_bytes())


def streams_output(out: Tensor) -> bool:
    """Whether the op's query pass writes ``out`` (B, H, N, dv) by non-temporal stores, which bypass the caches.

    It does when the output is larger than the last-level cache (:func:`stream_threshold_bytes`; no reader after
    the op could find it there) and its rows are whole 64-byte cache lines (each starts on one, dv a multiple of 16
    floats): each line is then written whole, without first being read from memory, and the inputs the op reads
    next stay in the cache. A cache-sized or smaller output is written as usual, so the next layer reads it from the
    cache. False without the op."""
    return False if _op is None else bool(_op.streams_output(out))


def stream_threshold_bytes() -> int:
    """Output bytes above which the op streams its output (:func:`streams_output`): the size of the highest-level
    cache Linux lists for CPU 0 (sysfs), or 32 MiB where it lists none. 0 without the op."""
    return 0 if _op is None else int(_op.stream_threshold_bytes())


def tracing() -> bool:
    """Whether the code runs under a tracer (torch.compile, torch.export, torch.onnx.export, torch.jit.trace) rather
    than eagerly: the fused op is then not called, and Python loops over sizes must not be, since a traced graph
    keeps the trip count of the size it was traced at."""
    # torch.onnx is imported lazily, and importing it costs a tenth of a second: an export has imported it already.
    onnx = sys.modules.get("torch.onnx")
    exporting = torch.compiler.is_exporting() or (onnx is not None and onnx.is_in_onnx_export())
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or exporting


def eligible(q: Tensor, k: Tensor, v: Tensor, options: dict) -> bool:
    """Whether ``linear_attention(q, k, v, kernel="nala", **options)`` can take the fused op."""
    if not enabled() or tracing() or not OPTIONS.issuperset(options):
        return False
    tensors = (q, k, v)
    if any(t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float16, torch.bfloat16) for t in tensors):
        return False
    if q.shape[:2] != k.shape[:2] or q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return False
    scale = options.get("norm_scale")
    if isinstance(scale, Tensor) and (scale.device.type != "cpu" or scale.numel() not in (1, q.shape[1])):
        return False
    return all(type(t) in (Tensor, torch.nn.Parameter) for t in tensors)  # no fake/functional tensor subclasses


class _FusedNaLa(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total):
        """-> out (B, heads, N_q, dv) and key_max (B * heads,): each head's largest |key component|."""
        out, den, state, key_max = _op.forward(q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total)
        ctx.save_for_backward(q, k, v, cos, sin, gamma, out, den, state)
        ctx.options = (lam, tau, angle_scale, key_raw, eps_total)
        ctx.mark_non_differentiable(key_max)
        return out, key_max

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _key_max_grad):
        q, k, v, cos, sin, gamma, out, den, state = ctx.saved_tensors
        gq, gk, gv, g_gamma = _op.backward(grad, q, k, v, cos, sin, gamma, out, den, state, *ctx.options)
        g_gamma = g_gamma.view(q.shape[0], q.shape[1]).sum(0)  # per (batch, head) -> per head
        grads = (gq, gk, gv, None, None, g_gamma) + (None,) * 5
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def streamable(dtype: torch.dtype, device: torch.device, options: dict) -> bool:
    """Whether :func:`key_state` and :func:`query_into` can run on tensors of ``dtype`` on ``device`` with these
    map options: the op built and enabled, no tracer, no gradient to track, float32 on a CPU (they write float32
    results in place)."""
    return (
        enabled()
        and not tracing()
        and not torch.is_grad_enabled()
        and OPTIONS.issuperset(options)
        and dtype == torch.float32
        and device.type == "cpu"
    )


def _per_head(norm_scale: float | Tensor, heads: int) -> Tensor:
    """gamma as one float32 per head (differentiable when it is a tensor)."""
    if isinstance(norm_scale, Tensor):
        flat = norm_scale.float().reshape(-1)
        return (flat.expand(heads) if flat.numel() == 1 else flat).contiguous()
    return torch.full((heads,), check_norm_scale(norm_scale))


def _tracks_grad(*tensors) -> bool:
    """Whether autograd would record a call on these (tensors among them; other arguments are passed over)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors if isinstance(t, Tensor))


def writes_into(out: Tensor, add: Tensor | None, *inputs: Tensor) -> bool:
    """Whether the op can write its output (plus ``add``) straight into ``out``: float32 CPU tensors with a
    contiguous last dimension, and no gradient to track (the path keeps nothing for a backward)."""
    if _tracks_grad(*inputs, out):
        return False
    written = (out,) if add is None else (out, add)
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1 for t in written)


def nala_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rope: tuple[Tensor, Tensor] | None,
    eps_total: float = 0.0,
    out: Tensor | None = None,
    add: Tensor | None = None,
    **options,
) -> Tensor:
    """The fused op; see the module.

    q, k: (B, heads, N, d); v: (B, heads, N_k, dv); rope: (cos, sin) tables (N, d) for the 2d features, or None;
    options: those of :func:`~nala_gen.attention.kernels.nala_features`, with its defaults.
    Returns (B, heads, N_q, dv) in v's dtype. With ``out`` (inference, see :func:`writes_into`) the result plus
    ``add`` (optional, same shape) is written into ``out``, whatever its strides, and ``out`` is returned: a head
    group's channels of a wider (B, N, C) map take the attention and LePE's output in one pass, with no
    intermediate (B, heads, N, dv) tensor. ``out`` must not overlap q, k, v or ``add``.

    Keys whose raw power could overflow are rescaled as the PyTorch path rescales them
    (:func:`~nala_gen.attention.kernels.safe_keys`), but the check costs no pass of its own: the op reports each
    head's largest key component from its key pass, and only when one exceeds the limit (rare: trained keys are
    small) does the call run again on the rescaled keys.
    """
    dtype = v.dtype
    q, v = upcast(q), upcast(v)
    arguments = _op_arguments(q.shape[1], q.shape[-1], rope, options)
    gamma, key_raw = arguments[2], arguments[-1]
    arguments = (*arguments, eps_total)
    empty = torch.empty(0)

    # Without a gradient to track, the inference entry: it keeps nothing for a backward and, for heads that a vector
    # does not divide (NaLaSR's 18 floats), runs the kernels with the tokens in the lanes.
    into = out
    if into is None and not _tracks_grad(q, k, v, gamma):
        into = new_output((*q.shape[:-1], v.shape[-1]))

    def run(keys: Tensor) -> tuple[Tensor, Tensor]:
        if into is None:
            return _FusedNaLa.apply(q, upcast(keys), v, *arguments)
        with torch.profiler.record_function("_FusedNaLa"):  # named in profiles as the autograd path's op is
            return into, _op.forward_into(q, upcast(keys), v, *arguments, into, empty if add is None else add)

    result, key_max = run(k)
    if key_raw and bool((key_max > RAW_KEY_LIMIT).any()):  # with out, every row of it is written again
        result, _ = run(safe_keys("nala", k, **options))
    return result if out is not None or result.dtype == dtype else result.to(dtype)


def _op_arguments(heads: int, head_dim: int, rope: tuple[Tensor, Tensor] | None, options: dict) -> tuple:
    """The op's arguments (cos, sin, gamma, lam, tau, angle_scale, key_raw) for ``options`` (the map's, with its
    defaults)."""
    o = {**NALA_DEFAULTS, **options}
    empty = torch.empty(0)
    cos, sin = (empty, empty) if rope is None else (rope[0].float().contiguous(), rope[1].float().contiguous())
    key_raw = resolve_key_map(o["key_map"]) == "raw"
    scale = resolve_angle_scale(o["angle_scale"], head_dim)
    return cos, sin, _per_head(o["norm_scale"], heads), float(o["lam"]), float(o["tau"]), scale, key_raw


def key_state(k: Tensor, v: Tensor, rope: tuple[Tensor, Tensor] | None, **options) -> tuple[Tensor, Tensor]:
    """The keys' and values' part of the fused op, for some of the tokens (inference only): ``(state, key_max)``.

    The attention over N tokens can then run without holding all of them: the states of disjoint runs of tokens
    (each with its own rows of the RoPE tables) add up to the state of all of them, and :func:`query_into` maps
    queries through the sum, a run at a time. ``key_max`` is each (batch, head)'s largest key component: with the
    raw key map, a value above :data:`~nala_gen.attention.kernels.RAW_KEY_LIMIT` means the keys need rescaling
    (:func:`~nala_gen.attention.kernels.safe_keys`), which needs them all, so the caller runs the whole op instead.

    k: (B, heads, n, d), v: (B, heads, n, dv), any float dtype (computed in float32); rope: tables for these n
    tokens or None. Returns a float32 state whose layout is the op's, and key_max (B * heads,)."""
    arguments = _op_arguments(k.shape[1], k.shape[-1], rope, options)
    return tuple(_op.key_state(upcast(k), upcast(v), *arguments))


def query_into(
    q: Tensor,
    state: Tensor,
    rope: tuple[Tensor, Tensor] | None,
    eps_total: float,
    out: Tensor,
    add: Tensor | None = None,
    **options,
) -> Tensor:
    """The queries' part of the fused op on a :func:`key_state` summed over every key: the attention of q (B,
    heads, n, d) plus ``add`` written into ``out`` (B, heads, n, dv), as :func:`nala_attention` writes it
    (:func:`writes_into` must hold). ``rope``: the tables' rows of these n queries; ``eps_total``: the kernel's
    denominator offset for all N keys; the options as the state's. Returns ``out``."""
    arguments = _op_arguments(q.shape[1], q.shape[-1], rope, options)
    _op.query_into(upcast(q), state, *arguments, eps_total, out, torch.empty(0) if add is None else add)
    return out
