"""The fused CPU path of ``linear_attention(kernel="nala")``: when the C++ op applies, and its arguments.

The op itself (the extension, its autograd, its instruction sets) is :mod:`nala_gen.ops.nala_fused`; this module
turns the NaLa map's options (:func:`~nala_gen.attention.kernels.nala_features`) into its arguments and rescales
overflowing raw keys as the PyTorch path does.

It is used whenever it can be: CPU tensors, float32 math (half/bf16 are upcast as on the eager path), the ``nala``
kernel, a norm scale that is a number or one value per head, and not while tracing or compiling (``torch.export``,
ONNX, ``torch.compile`` see the PyTorch ops). ``NALA_GEN_FUSED=0`` (``RuntimeOptions.fused``) turns it off. Without
the built op (a pure-Python install, or a torch whose ABI differs from the one it was built against) the eager path
runs and :func:`unavailable_reason` says why.
"""

from __future__ import annotations

import inspect

import torch

from nala_gen.ops import nala_fused
from nala_gen.ops.nala_fused import (  # noqa: F401 - this module's public names since before the op moved
    MAX_HEAD_DIM,
    available,
    enabled,
    instruction_set,
    stream_threshold_bytes,
    streams_output,
    unavailable_reason,
)
from nala_gen.ops.options import RuntimeOptions
from nala_gen.ops.tracing import tracing

from .kernels import (
    RAW_KEY_LIMIT,
    check_norm_scale,
    nala_features,
    resolve_angle_scale,
    resolve_key_map,
    safe_keys,
    upcast,
)

Tensor = torch.Tensor
# The NaLa map's options and defaults, read from the map itself (one source for both paths).
NALA_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(nala_features).parameters.items()
    if p.default is not inspect.Parameter.empty
}
OPTIONS = frozenset(NALA_DEFAULTS)


def eligible(q: Tensor, k: Tensor, v: Tensor, options: dict, runtime: RuntimeOptions | None = None) -> bool:
    """Whether ``linear_attention(q, k, v, kernel="nala", **options)`` can take the fused op under ``runtime`` (the
    options in force by default)."""
    if tracing() or not enabled(runtime) or not OPTIONS.issuperset(options):
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


def streamable(dtype: torch.dtype, device: torch.device, options: dict, runtime: RuntimeOptions | None = None) -> bool:
    """Whether :func:`key_state` and :func:`query_into` can run on tensors of ``dtype`` on ``device`` with these
    map options: the op built and enabled, no tracer, no gradient to track, float32 on a CPU (they write float32
    results in place)."""
    return (
        not tracing()
        and enabled(runtime)
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
    runtime: RuntimeOptions | None = None,
    **options,
) -> Tensor:
    """The fused op; see the module.

    q, k: (B, heads, N, d); v: (B, heads, N_k, dv); rope: (cos, sin) tables (N, d) for the 2d features, or None;
    runtime: the CPU kernels' options (the instruction set's cap), those in force by default;
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

    # Without a gradient to track, the inference entry: it keeps nothing for a backward and, for heads that a vector
    # does not divide (NaLaSR's 18 floats), runs the kernels with the tokens in the lanes.
    into = out
    if into is None and not _tracks_grad(q, k, v, gamma):
        into = torch.empty((*q.shape[:-1], v.shape[-1]))

    def run(keys: Tensor) -> tuple[Tensor, Tensor]:
        if into is None:
            return nala_fused.FusedNaLa.apply(q, upcast(keys), v, *arguments, runtime)
        return into, nala_fused.forward_into(q, upcast(keys), v, arguments, into, add, runtime)

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


def key_state(
    k: Tensor, v: Tensor, rope: tuple[Tensor, Tensor] | None, runtime: RuntimeOptions | None = None, **options
) -> tuple[Tensor, Tensor]:
    """The keys' and values' part of the fused op, for some of the tokens (inference only): ``(state, key_max)``.

    The attention over N tokens can then run without holding all of them: the states of disjoint runs of tokens
    (each with its own rows of the RoPE tables) add up to the state of all of them, and :func:`query_into` maps
    queries through the sum, a run at a time. ``key_max`` is each (batch, head)'s largest key component: with the
    raw key map, a value above :data:`~nala_gen.attention.kernels.RAW_KEY_LIMIT` means the keys need rescaling
    (:func:`~nala_gen.attention.kernels.safe_keys`), which needs them all, so the caller runs the whole op instead.

    k: (B, heads, n, d), v: (B, heads, n, dv), any float dtype (computed in float32); rope: tables for these n
    tokens or None. Returns a float32 state whose layout is the op's, and key_max (B * heads,)."""
    arguments = _op_arguments(k.shape[1], k.shape[-1], rope, options)
    return nala_fused.key_state(upcast(k), upcast(v), arguments, runtime)


def query_into(
    q: Tensor,
    state: Tensor,
    rope: tuple[Tensor, Tensor] | None,
    eps_total: float,
    out: Tensor,
    add: Tensor | None = None,
    runtime: RuntimeOptions | None = None,
    **options,
) -> Tensor:
    """The queries' part of the fused op on a :func:`key_state` summed over every key: the attention of q (B,
    heads, n, d) plus ``add`` written into ``out`` (B, heads, n, dv), as :func:`nala_attention` writes it
    (:func:`writes_into` must hold). ``rope``: the tables' rows of these n queries; ``eps_total``: the kernel's
    denominator offset for all N keys; the options (and ``runtime``) as the state's. Returns ``out``."""
    arguments = _op_arguments(q.shape[1], q.shape[-1], rope, options)
    return nala_fused.query_into(upcast(q), state, (*arguments, eps_total), out, add, runtime)
