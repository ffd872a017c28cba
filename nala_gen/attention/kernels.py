"""Feature maps of kernelised (linear) attention, by name.

A kernel turns queries and keys of shape (..., N, d) into non-negative features (..., N, F) so that the
attention weight of query t on key j is ``phi(q_t) . phi(k_j) / sum_j' phi(q_t) . phi(k_j')``.

``nala`` is the paper's kernel (Norm-Aware Linear Attention, arXiv 2506.21137). Per query q with norm
``n = |q|`` and direction ``u = q / n``:

* the power ``p(q) = lam * (tau + tanh(n))`` is applied **elementwise** as an exponent to ``|u_i|``, so a
  longer query gives a peakier feature (lower entropy) - the norm information linear attention otherwise
  cancels;
* each direction component maps to an angle ``theta(x) = (pi / 4) * tanh(s * x)`` with ``s = sqrt(d)``
  (components of a unit vector are ~1/sqrt(d)) and to the 2-vector ``m * (cos theta, sin theta)``;
* keys use the same cosine map with the fixed power ``lam`` on the key *direction*: ``m_k,i = |dir(k)_i|^lam``.

Then ``phi(q) . phi(k) = sum_i m_q,i m_k,i cos(theta_q,i - theta_k,i) >= 0`` since the angles differ by less
than pi/2: opposite signs are damped, not deleted as with ReLU.

Why the key direction and not ``|k_i|^lam``: features then lie in [0, 1] for any input, so huge keys
cannot overflow in fp32 and no epsilon is needed to keep rows summing to one. The trade is that a key's
norm no longer weights it (as with QK-normalised transformers); salience comes from its direction only.

Kernels return float32 features for half/bf16/fp32 inputs (float64 stays float64, for gradcheck).

In eager PyTorch the NaLa map is a dozen elementwise passes (norm, power, sigmoid, cos, sin, products); at 70K
tokens on a CPU that costs more than the matmuls. :func:`compiled_feature_map` fuses it with ``torch.compile``
into one pass per input (about 5x faster here), at a one-off compile cost of tens of seconds per process:
worth it for long jobs (training, large images), opt-in for everything else.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
FeatureMap = Callable[..., Tensor]

# Kernels whose weights are not a dot product of features (computed by SDPA / explicit softmax).
SOFTMAX_KERNELS = ("softmax",)

_FEATURE_MAPS: dict[str, FeatureMap] = {}


def register_kernel(name: str) -> Callable[[FeatureMap], FeatureMap]:
    """Register ``fn(x, is_query, **options) -> phi(x)`` under ``name``.

    Queries and keys are mapped separately (``is_query`` tells which) so callers can stream over chunks of
    tokens without ever holding all features at once.
    """

    def wrap(fn: FeatureMap) -> FeatureMap:
        if name in _FEATURE_MAPS or name in SOFTMAX_KERNELS:
            raise ValueError(f"attention kernel {name!r} is already registered")
        _FEATURE_MAPS[name] = fn
        return fn

    return wrap


def kernel_names() -> tuple[str, ...]:
    """Every name accepted by ``linear_attention`` / ``reference_attention``."""
    return (*_FEATURE_MAPS, *SOFTMAX_KERNELS)


def feature_map(name: str) -> FeatureMap:
    try:
        return _FEATURE_MAPS[name]
    except KeyError:
        raise ValueError(f"unknown attention kernel {name!r}; choose one of {', '.join(kernel_names())}") from None


_COMPILED: dict[str, FeatureMap] = {}


def compiled_feature_map(name: str) -> FeatureMap:
    """``feature_map(name)`` fused by ``torch.compile`` (inductor; needs a C++ compiler on CPU), made once.

    Same math and results as the eager map (to float rounding). The first call per input shape compiles (tens of
    seconds on a CPU); later shapes of the same rank reuse a dynamic-shape kernel.
    """
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(feature_map(name))
    return _COMPILED[name]


def upcast(x: Tensor) -> Tensor:
    """Half and bfloat16 tensors to float32 (the op's math precision); float32/float64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def feature_dim(name: str, head_dim: int, **options) -> int:
    """Size F of the features ``name`` produces for heads of size ``head_dim`` (head_dim for softmax)."""
    if name in SOFTMAX_KERNELS:
        return head_dim
    return feature_map(name)(torch.ones(1, head_dim), False, **options).shape[-1]


def direction(x: Tensor) -> tuple[Tensor, Tensor]:
    """Split x (..., d) into its norm (..., 1) and unit direction (..., d), in float32.

    A zero vector has no direction; it gets the uniform one, ``1 / sqrt(d)``, so its attention is still a
    proper distribution. Norms so small or large that their square leaves fp32's range (below ~1e-19 or
    above ~1e19) take a slower path that rescales by the largest component first.
    """
    x = upcast(x)
    if torch.compiler.is_compiling():
        return _robust_direction(x)  # branchless, so the whole map fuses; costs nothing extra once fused
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    if bool(((norm < 1e-18) | ~torch.isfinite(norm)).any()):
        return _robust_direction(x)
    return norm, x * norm.reciprocal()


def _robust_direction(x: Tensor) -> tuple[Tensor, Tensor]:
    amax = x.abs().amax(dim=-1, keepdim=True)
    scaled = x / amax.clamp_min(torch.finfo(x.dtype).tiny)
    length = torch.linalg.vector_norm(scaled, dim=-1, keepdim=True)
    uniform = torch.full_like(x, 1.0 / math.sqrt(x.shape[-1]))
    unit = torch.where(amax > 0, scaled / length.clamp_min(1e-30), uniform)
    return amax * length, unit


def query_power(norm: Tensor, lam: float = 3.0, tau: float = 0.5) -> Tensor:
    """The paper's norm-aware exponent p(q) = lam * (tau + tanh |q|), in [lam*tau, lam*(tau+1))."""
    return lam * (tau + torch.tanh(norm))


def cosine_features(unit: Tensor, power: Tensor | float, scale: float) -> Tensor:
    """(..., d) unit directions -> (..., 2d) features ``|u|^power * (cos theta(u), sin theta(u))``.

    ``theta = (pi/4) tanh(scale * u)``. tanh is computed as ``2 sigmoid(2y) - 1`` (the same function,
    about 3x faster on CPU).
    """
    magnitude = unit.abs().pow(power)
    theta = torch.sigmoid(unit * (2 * scale)) * (math.pi / 2) - math.pi / 4
    return torch.cat((magnitude * torch.cos(theta), magnitude * torch.sin(theta)), dim=-1)


@register_kernel("nala")
def nala_features(x: Tensor, is_query: bool, lam: float = 3.0, tau: float = 0.5) -> Tensor:
    """The paper's NaLa map: norm-aware elementwise power and cosine direction map, 2d features."""
    norm, unit = direction(x)
    power = query_power(norm, lam, tau) if is_query else lam
    return cosine_features(unit, power, math.sqrt(x.shape[-1]))


@register_kernel("nala_split")
def nala_split_features(x: Tensor, is_query: bool, lam: float = 3.0, tau: float = 0.5) -> Tensor:
    """The released NaLaFormer code's map: the same norm-aware power on a ReLU split [u+, u-] (2d)."""
    norm, unit = direction(x)
    power = query_power(norm, lam, tau) if is_query else lam
    return torch.cat((F.relu(unit).pow(power), F.relu(-unit).pow(power)), dim=-1)


@register_kernel("relu")
def relu_features(x: Tensor, is_query: bool) -> Tensor:
    """phi(x) = ReLU(x): scale-invariant in q, so blind to the query norm."""
    return F.relu(upcast(x))


@register_kernel("elu1")
def elu1_features(x: Tensor, is_query: bool) -> Tensor:
    """phi(x) = ELU(x) + 1 (Katharopoulos et al., 2020)."""
    return F.elu(upcast(x)) + 1


@register_kernel("focused")
def focused_features(x: Tensor, is_query: bool, power: float = 3.0) -> Tensor:
    """Focused linear attention (Han et al., 2023): ReLU(x)^p rescaled to the norm of ReLU(x)."""
    r = F.relu(upcast(x))
    r_norm = torch.linalg.vector_norm(r, dim=-1, keepdim=True)
    # Rescale by the max first so ReLU(x)^p cannot overflow for large x.
    r = r / r.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(r.dtype).tiny)
    rp = r.pow(power)
    return rp * (r_norm / torch.linalg.vector_norm(rp, dim=-1, keepdim=True).clamp_min(1e-30))
