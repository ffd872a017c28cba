"""Functional attention over (B, heads, N, d) tensors: the linear-time op and its explicit reference.

``linear_attention`` never forms an N x N tensor. It streams over chunks of tokens: first it sums the key
features into a (F, dv) state and an (F,) normaliser, then maps each chunk of queries through them, so the
extra memory is O(chunk * F + F * dv) on top of the output. Math runs in float32 whatever the input dtype
(bf16/fp16 inputs accumulate in fp32; the output is cast back).

``reference_attention`` builds the full weight matrix (O(N^2)); tests use it to pin the linear form, and
diagnostics read the weights from :func:`attention_weights`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F

from nala_gen.ops import RuntimeOptions, runtime_options, tracing

from . import fused
from .kernels import SOFTMAX_KERNELS, compiled_feature_map, safe_keys, upcast
from .kernels import kernel as kernel_spec
from .rope import apply_rope

Tensor = torch.Tensor
Rope = tuple[Tensor, Tensor]

# Tokens per chunk. Big enough that the matmuls stay efficient, small enough that the temporaries stay
# below glibc's mmap threshold on CPU (fresh large tensors page-fault on first touch and are slow here).
DEFAULT_CHUNK = 4096

# Denominators are clamped, not offset by an epsilon: an added epsilon would shrink rows whose features
# are all tiny; a clamp only acts when the denominator is zero, i.e. a query that matches no key at all.
_TINY = torch.finfo(torch.float32).tiny


class RecordedCall(NamedTuple):
    """One attention call seen by :func:`record_queries_keys`: (B, heads, N, d) queries and keys, detached and on
    the CPU, with the kernel and feature-map options the call used (None and {} when the caller did not say)."""

    q: Tensor
    k: Tensor
    kernel: str | None = None
    options: dict = {}


# Open recorders of record_queries_keys(); empty outside diagnostics, so the hot path pays one list check.
_RECORDERS: list[list[RecordedCall]] = []


@contextmanager
def record_queries_keys() -> Iterator[list[RecordedCall]]:
    """Collect every attention call inside the block (its q, k, kernel and options; see :class:`RecordedCall`).

    Diagnostics use it to read a trained model's real queries and keys (e.g. entropy vs query norm) without
    hooks into each model: :func:`linear_attention` (softmax included) reports them, and custom attentions
    report theirs with :func:`report_queries_keys`.
    """
    store: list[RecordedCall] = []
    _RECORDERS.append(store)
    try:
        yield store
    finally:
        _RECORDERS.remove(store)


def report_queries_keys(q: Tensor, k: Tensor, kernel: str | None = None, **options) -> None:
    """Hand (B, heads, N, d) queries and keys, and the kernel and options used on them (a learned norm scale
    included), to any open :func:`record_queries_keys` block."""
    kept = {key: value.detach().cpu() if isinstance(value, Tensor) else value for key, value in options.items()}
    for store in _RECORDERS:
        store.append(RecordedCall(q.detach().cpu(), k.detach().cpu(), kernel, kept))


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be (B, heads, N, d) tensors")
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")


def _chunks(tokens: int, chunk_size: int, whole: bool) -> list[tuple[int, int | None]]:
    """``[start, stop)`` steps of ``chunk_size`` tokens over ``tokens``; one step of all of them when ``whole``."""
    if whole:
        return [(0, None)]
    return [(start, start + chunk_size) for start in range(0, tokens, chunk_size)]


def _rope_slice(rope: Rope | None, start: int, stop: int | None) -> Rope | None:
    return None if rope is None else (rope[0][start:stop], rope[1][start:stop])


def _rotate(x: Tensor, rope: Rope | None) -> Tensor:
    return x if rope is None else apply_rope(x, *rope)


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, rope: Rope | None = None) -> Tensor:
    """Fused softmax attention (``scaled_dot_product_attention``), RoPE applied to q and k.

    On CPU half-precision inputs are upcast to fp32 (no native half kernels there, and huge logits would
    overflow); on GPUs the fused kernels already accumulate in fp32.
    """
    _check(q, k, v)
    dtype = v.dtype
    if q.device.type == "cpu":
        q, k, v = upcast(q), upcast(k), upcast(v)
    if rope is not None:
        q, k = apply_rope(q, *rope).to(q.dtype), apply_rope(k, *rope).to(k.dtype)
    return F.scaled_dot_product_attention(q, k, v).to(dtype)


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernel: str = "nala",
    rope: Rope | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    compile: bool | None = None,
    out: Tensor | None = None,
    add: Tensor | None = None,
    runtime: RuntimeOptions | None = None,
    **kernel_options,
) -> Tensor:
    """Non-causal kernelised attention in O(N) time and memory.

    Args:
        q, k: (B, heads, N, d) queries and keys (N may differ between them).
        v: (B, heads, N_k, dv) values.
        kernel: a name from :func:`~nala_gen.attention.kernels.kernel_names`; ``softmax`` uses fused SDPA.
        rope: optional (cos, sin) tables from :func:`~nala_gen.attention.rope.rope_2d` for the feature
            size (or for d with ``softmax``). For linear kernels it rotates the numerator features only (as
            the paper and its code do): the denominator still normalises with the unrotated features, but the
            rotated products ``phi(q) R_t R_j^T phi(k)`` can be negative, so the effective weights are no
            longer a distribution (some are negative and rows need not sum to one; ``test_attention``
            measures how far on random inputs).
        chunk_size: tokens processed at a time.
        compile: fuse the feature map with ``torch.compile`` (see :func:`~nala_gen.attention.kernels.
            compiled_feature_map`); None follows ``runtime``'s ``compile`` (``NALA_GEN_COMPILE=1``). Where the fused
            C++ op applies (``nala`` on a CPU, see :mod:`~nala_gen.attention.fused`) that op runs instead.
        out: optional (B, heads, N_q, dv) tensor the result is written into (and returned), as torch's ``out=``
            (no autograd through it); any strides with a contiguous last dimension, such as a head group's
            channels of a (B, N, C) map. Where the fused op applies it writes there directly.
        add: optional tensor of the result's shape added to it (LePE's output, say): in the same pass as the
            write when the fused op writes into ``out``. Neither may overlap q, k or v, nor each other.
        runtime: which CPU kernels may run (:class:`~nala_gen.ops.RuntimeOptions`); the options in force by default.
        **kernel_options: forwarded to the feature map (e.g. ``lam``, ``tau`` for ``nala``).

    Returns:
        (B, heads, N_q, dv) in v's dtype (``out`` when given).
    """
    if _RECORDERS:
        report_queries_keys(q, k, kernel, **kernel_options)
    if kernel in SOFTMAX_KERNELS:
        return _written(softmax_attention(q, k, v, rope), out, add)
    _check(q, k, v)
    runtime = runtime_options() if runtime is None else runtime
    if compile is None:
        compile = runtime.compile
    spec = kernel_spec(kernel)
    eps_total = spec.denominator_eps * k.shape[-2]
    # The fused op beats the compiled map on a CPU too, so it runs whenever it can; compile= only shapes the rest.
    # It checks the keys for overflow itself (see fused.nala_attention).
    if kernel == "nala" and fused.eligible(q, k, v, kernel_options, runtime):
        if out is not None and fused.writes_into(out, add, q, k, v):
            return fused.nala_attention(q, k, v, rope, eps_total, out, add, runtime, **kernel_options)
        return _written(fused.nala_attention(q, k, v, rope, eps_total, runtime=runtime, **kernel_options), out, add)
    k = safe_keys(kernel, k, **kernel_options)
    phi = compiled_feature_map(kernel) if compile else spec.features
    # Traced (an ONNX export, say), the loops below would keep the traced size's trip count and drop every token
    # past it at other sizes: one step over all tokens there.
    whole = tracing()
    kv, k_sum = None, None
    for start, stop in _chunks(k.shape[-2], chunk_size, whole):
        phi_k = phi(k[..., start:stop, :], False, **kernel_options)
        v_chunk = upcast(v[..., start:stop, :])
        kv_part = _rotate(phi_k, _rope_slice(rope, start, stop)).transpose(-2, -1) @ v_chunk
        sum_part = phi_k.sum(dim=-2, keepdim=True)
        kv = kv_part if kv is None else kv.add_(kv_part)
        k_sum = sum_part if k_sum is None else k_sum.add_(sum_part)

    result = torch.empty(*q.shape[:-1], v.shape[-1], dtype=v.dtype, device=v.device)
    for start, stop in _chunks(q.shape[-2], chunk_size, whole):
        phi_q = phi(q[..., start:stop, :], True, **kernel_options)
        denominator = (phi_q * k_sum).sum(dim=-1, keepdim=True).add_(eps_total).clamp_min_(_TINY)
        numerator = _rotate(phi_q, _rope_slice(rope, start, stop)) @ kv
        result[..., start:stop, :] = numerator.div_(denominator)
    return _written(result, out, add)


def _written(result: Tensor, out: Tensor | None, add: Tensor | None) -> Tensor:
    """``result + add`` (when ``add`` is given), into ``out`` when that is given."""
    if out is None:
        return result if add is None else result + add
    return out.copy_(result) if add is None else torch.add(result, add, out=out)


def attention_weights(q: Tensor, k: Tensor, kernel: str = "nala", rope: Rope | None = None, **kernel_options) -> Tensor:
    """The explicit (B, heads, N_q, N_k) weight matrix, float32. O(N^2) memory: tests and diagnostics.

    With RoPE the numerator weights are returned (rows normalised by the unrotated features, as in
    :func:`linear_attention`): they can be negative and rows need not sum to one. Without it every weight is
    >= 0 and each row sums to one (for ``nala_split`` up to the release's epsilon, 1e-6 per key).
    """
    if kernel in SOFTMAX_KERNELS:
        q, k = upcast(q), upcast(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    spec = kernel_spec(kernel)
    k = safe_keys(kernel, k, **kernel_options)
    phi_q, phi_k = spec.features(q, True, **kernel_options), spec.features(k, False, **kernel_options)
    scores = phi_q @ phi_k.transpose(-2, -1)
    denominator = (scores.sum(dim=-1, keepdim=True) + spec.denominator_eps * k.shape[-2]).clamp_min(_TINY)
    return (_rotate(phi_q, rope) @ _rotate(phi_k, rope).transpose(-2, -1)) / denominator


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, kernel: str = "nala", rope: Rope | None = None, **kernel_options
) -> Tensor:
    """Explicit O(N^2) attention ``weights @ v`` for any kernel; the ground truth for tests."""
    _check(q, k, v)
    weights = attention_weights(q, k, kernel, rope, **kernel_options)
    return (weights @ upcast(v)).to(v.dtype)
