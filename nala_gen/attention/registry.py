"""Attention methods by name, as the benchmarks and the app measure them: a call and its cost formulas.

A method is a kernel name of :func:`~nala_gen.attention.kernel_names` run by the linear op (optionally with a
suffix: ``_eager``, the same kernel on the PyTorch path with the fused C++ op switched off by the caller's
``NALA_GEN_FUSED=0``; ``_compiled``, that path with its feature map fused by ``torch.compile``), or one of two
softmax baselines: ``softmax_sdpa`` (PyTorch's fused ``scaled_dot_product_attention``, which never builds the
N x N matrix) and ``softmax_explicit`` (the N x N matrix materialised, as ESRT-style attention does).

Every call takes q, k, v of shape (batch, heads, N, d) and returns a function of no arguments running the op,
so one timer measures them all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .functional import linear_attention
from .kernels import feature_dim

METHODS = ("nala", "nala_eager", "nala_compiled", "nala_split", "relu", "softmax_sdpa", "softmax_explicit")
COMPILED = "_compiled"  # suffix: the PyTorch path with its feature map fused by torch.compile (fused op off)
EAGER = "_eager"  # suffix: the same kernel on the PyTorch path (the fused C++ op switched off), i.e. "before"


def method_kernel(method: str) -> str:
    """The kernel a linear method runs: its name without the ``_eager`` or ``_compiled`` suffix."""
    return method.removesuffix(COMPILED).removesuffix(EAGER)


def explicit_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with the N x N matrix materialised (ESRT-style, eager)."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.softmax(scores, dim=-1) @ v


def explicit_bytes(n: int, heads: int) -> int:
    """Memory explicit softmax materialises at N tokens: scores plus softmax output, fp32, two (heads, N, N)."""
    return 2 * heads * n * n * 4


def method_fn(method: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A function of no arguments running ``method`` on (q, k, v)."""
    if method == "softmax_sdpa":
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    if method == "softmax_explicit":
        return lambda: explicit_softmax(q, k, v)
    return lambda: linear_attention(q, k, v, kernel=method_kernel(method), compile=method.endswith(COMPILED))


def linear_flops(method: str, n: int, heads: int, d: int) -> int:
    """Matmul FLOPs of a linear method (batch 1): key state, query numerator and denominator."""
    f = feature_dim(method_kernel(method), d)
    return heads * n * (4 * f * d + 2 * f)
