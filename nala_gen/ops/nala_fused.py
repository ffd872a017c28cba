"""The fused NaLa op: the C++ extension (``csrc/nala_fused.cpp``, built with the package) and its autograd.

The eager map is a dozen elementwise passes over (N, 2d) buffers; the op maps, rotates (RoPE) and multiplies tiles
of 64 tokens while they sit in cache, forward and backward, with the same math: exp/log for the norm-aware power,
``tanh`` from one exp, cos/sin of the angle (always within pi/4) by short polynomials, and the keys' integer power
by products. Results match the eager path to float rounding (tests pin 1e-5).

This module takes the map's arguments resolved (gamma per head, lam, tau, the angle scale, the raw key map or not);
:mod:`nala_gen.attention.fused` turns ``linear_attention``'s options into them and decides when the op applies.
Without the built op (a pure-Python install, or a torch whose ABI differs from the one it was built against)
:func:`available` is False and :func:`unavailable_reason` says why.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .options import RuntimeOptions, runtime_options

try:
    from nala_gen.ops import _nala_fused as _op
except ImportError as error:  # not built, or built against another torch
    _op = None
    _WHY_NOT = f"the fused NaLa op is not importable ({error}); reinstall with `pip install --no-build-isolation .`"
else:
    _WHY_NOT = None

Tensor = torch.Tensor
MAX_HEAD_DIM = 512
_isa_cap: list[str | None] = [None]  # the cap last handed to the op (it starts uncapped)


def available() -> bool:
    """The op is built and importable (it may still be switched off: ``RuntimeOptions.fused``)."""
    return _op is not None


def unavailable_reason() -> str | None:
    return _WHY_NOT


def enabled(runtime: RuntimeOptions | None = None) -> bool:
    """The op is built and the options (those in force by default) let it run."""
    return _op is not None and (runtime or runtime_options()).fused


def op(runtime: RuntimeOptions | None = None):
    """The extension, its instruction set capped as ``runtime`` (the options in force by default) says."""
    return _capped((runtime or runtime_options()).fused_isa)


def _capped(isa: str | None):
    if isa != _isa_cap[0]:
        _op.set_isa_cap(isa or "")
        _isa_cap[0] = isa
    return _op


def instruction_set(runtime: RuntimeOptions | None = None) -> str | None:
    """The widest compiled variant this CPU runs (``avx512``, ``avx2`` or ``baseline``); None without the op.

    The 16-float AVX-512 kernels take a head unless their padding to 16 floats (d and dv) makes its products more
    vector work than the 8-float AVX2 kernels' (heads of 8 floats, say), which then run it.
    ``RuntimeOptions.fused_isa`` (``NALA_GEN_FUSED_ISA=avx2`` or ``baseline``) caps the choice."""
    return None if _op is None else op(runtime).isa()


def inference_layout(d: int, dv: int, runtime: RuntimeOptions | None = None) -> str:
    """Which kernels the inference entry runs for heads of ``d`` floats and values of ``dv``: ``soa`` (the tokens in
    the lanes) or ``tiles``."""
    return op(runtime).inference_layout(d, dv)


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


class FusedNaLa(torch.autograd.Function):
    """The op with autograd: ``FusedNaLa.apply(q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw,
    eps_total, runtime)`` -> out (B, heads, N_q, dv) and key_max (B * heads,): each head's largest |key component|.

    q, k: (B, heads, N, d) float32; v: (B, heads, N_k, dv) float32; cos, sin: RoPE tables (N, d) or empty; gamma:
    the norm scale per head (differentiable); runtime: the options whose instruction set runs it (None: those in
    force)."""

    @staticmethod
    def forward(ctx, q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total, runtime=None):
        # the backward reads the state in the layout of the forward's kernels
        ctx.isa = (runtime or runtime_options()).fused_isa
        out, den, state, key_max = _capped(ctx.isa).forward(
            q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total
        )
        ctx.save_for_backward(q, k, v, cos, sin, gamma, out, den, state)
        ctx.options = (lam, tau, angle_scale, key_raw, eps_total)
        ctx.mark_non_differentiable(key_max)
        return out, key_max

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _key_max_grad):
        q, k, v, cos, sin, gamma, out, den, state = ctx.saved_tensors
        gq, gk, gv, g_gamma = _capped(ctx.isa).backward(grad, q, k, v, cos, sin, gamma, out, den, state, *ctx.options)
        g_gamma = g_gamma.view(q.shape[0], q.shape[1]).sum(0)  # per (batch, head) -> per head
        grads = (gq, gk, gv, None, None, g_gamma) + (None,) * 6
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def forward_into(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    arguments: tuple,
    out: Tensor,
    add: Tensor | None,
    runtime: RuntimeOptions | None = None,
) -> Tensor:
    """The inference entry: the attention plus ``add`` (or nothing) written into ``out``; ``arguments`` are
    ``(cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total)``. Keeps nothing for a backward. Returns each
    (batch, head)'s largest |key component|."""
    with torch.profiler.record_function("_FusedNaLa"):  # named in profiles as the autograd path's op is
        return op(runtime).forward_into(q, k, v, *arguments, out, torch.empty(0) if add is None else add)


def key_state(k: Tensor, v: Tensor, arguments: tuple, runtime: RuntimeOptions | None = None) -> tuple[Tensor, Tensor]:
    """The inference entry's key pass alone: ``(state, key_max)``; ``arguments`` are
    ``(cos, sin, gamma, lam, tau, angle_scale, key_raw)`` for these keys' tokens."""
    return tuple(op(runtime).key_state(k, v, *arguments))


def query_into(
    q: Tensor, state: Tensor, arguments: tuple, out: Tensor, add: Tensor | None, runtime: RuntimeOptions | None = None
) -> Tensor:
    """The inference entry's query pass on a summed :func:`key_state` (made with the same ``runtime``);
    ``arguments`` are ``(cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total)``. Returns ``out``."""
    op(runtime).query_into(q, state, *arguments, out, torch.empty(0) if add is None else add)
    return out
