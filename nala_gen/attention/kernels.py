"""Feature maps of kernelised (linear) attention, by name.

A kernel turns queries and keys of shape (..., N, d) into non-negative features (..., N, F) so that the
attention weight of query t on key j is ``phi(q_t) . phi(k_j) / sum_j' phi(q_t) . phi(k_j')``.

``nala`` is the paper's kernel (Norm-Aware Linear Attention, arXiv 2506.21137). Per query q with norm
``n = |q|`` and direction ``u = q / n``:

* the power ``p(q) = lam * (tau + tanh(n / gamma))`` is applied **elementwise** as an exponent to ``|u_i|``,
  so a longer query gives a peakier feature (lower entropy) - the norm information linear attention otherwise
  cancels. The paper has ``gamma = 1``; since tanh saturates for n > 2 while trained queries sit at norms 3-7,
  ``norm_scale=gamma`` (our extension, a number or a per-head tensor, e.g. learned) moves the sensitive range
  to where the norms are;
* each direction component maps to an angle ``theta(x) = (pi / 4) * tanh(s * x)`` and to the 2-vector
  ``m * (cos theta, sin theta)``. The paper writes ``s = 1`` (the default); ``angle_scale="sqrt_d"`` is our
  option that spreads the angles of unit-vector components (~1/sqrt(d)) over the whole tanh;
* keys use the same cosine map with the fixed power ``lam``: ``key_map="raw"`` is the paper's ``k^lam``
  (magnitude ``|k_i|^lam``, so a longer key weighs more), ``key_map="direction"`` uses ``|dir(k)_i|^lam``
  (a key's norm is ignored, as in QK-normalised transformers). The default is chosen by an equal-budget
  training comparison (README, "Differences from the paper").

Then ``phi(q) . phi(k) = sum_i m_q,i m_k,i cos(theta_q,i - theta_k,i) >= 0`` since the angles differ by less
than pi/2: opposite signs are damped, not deleted as with ReLU.

``nala_split`` is the released NaLaFormer code's map: ``[ReLU(u)^p, ReLU(-u)^p]`` for queries,
``[ReLU(k)^3, ReLU(-k)^3]`` for raw keys, normalised by ``phi(q) . mean_j phi(k_j) + 1e-6``.

Raw key powers overflow fp32 for huge keys; since such a map is homogeneous in k (every key scaled by s scales
every weight's numerator and denominator by s^lam), the ops divide all keys by their largest component first
when it exceeds :data:`RAW_KEY_LIMIT`, which leaves the weights unchanged.

Kernels return float32 features for half/bf16/fp32 inputs (float64 stays float64, for gradcheck).

In eager PyTorch the NaLa map is a dozen elementwise passes (norm, power, sigmoid, cos, sin, products); at 70K
tokens on a CPU that costs more than the matmuls. :func:`compiled_feature_map` fuses it with ``torch.compile``
into one pass per input, at a one-off compile cost of seconds per process: worth it for long jobs (training,
large images), opt-in for everything else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
FeatureMap = Callable[..., Tensor]

# Kernels whose weights are not a dot product of features (computed by SDPA / explicit softmax).
SOFTMAX_KERNELS = ("softmax",)

# Keys whose largest component exceeds this are rescaled before a raw power (see the module docstring).
RAW_KEY_LIMIT = 1e3


@dataclass(frozen=True)
class Kernel:
    """A registered feature map and what the ops must know about it.

    Attributes:
        features: ``fn(x, is_query, **options) -> phi(x)``.
        raw_keys: ``fn(options) -> bool``: the key features are a power of the raw keys (homogeneous in k), so
            huge keys are rescaled first.
        denominator_eps: added per key to the denominator (the release's ``mean_j phi(k_j) + eps`` is
            ``sum_j phi(k_j) + N_k * eps``); 0 for an exact distribution.
    """

    features: FeatureMap
    raw_keys: Callable[[dict], bool]
    denominator_eps: float


_KERNELS: dict[str, Kernel] = {}


def register_kernel(
    name: str, raw_keys: bool | Callable[[dict], bool] = False, denominator_eps: float = 0.0
) -> Callable[[FeatureMap], FeatureMap]:
    """Register ``fn(x, is_query, **options) -> phi(x)`` under ``name``.

    Queries and keys are mapped separately (``is_query`` tells which) so callers can stream over chunks of
    tokens without ever holding all features at once. See :class:`Kernel` for ``raw_keys`` and
    ``denominator_eps``.
    """

    def wrap(fn: FeatureMap) -> FeatureMap:
        if name in _KERNELS or name in SOFTMAX_KERNELS:
            raise ValueError(f"attention kernel {name!r} is already registered")
        raw = raw_keys if callable(raw_keys) else (lambda options, flag=bool(raw_keys): flag)
        _KERNELS[name] = Kernel(fn, raw, float(denominator_eps))
        return fn

    return wrap


def kernel_names() -> tuple[str, ...]:
    """Every name accepted by ``linear_attention`` / ``reference_attention``."""
    return (*_KERNELS, *SOFTMAX_KERNELS)


def kernel(name: str) -> Kernel:
    try:
        return _KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown attention kernel {name!r}; choose one of {', '.join(kernel_names())}") from None


def feature_map(name: str) -> FeatureMap:
    return kernel(name).features


def safe_keys(name: str, k: Tensor, **options) -> Tensor:
    """k (B, heads, N, d), divided by its largest |component| per (B, head) when a raw key power could overflow.

    The weights of a raw-power kernel do not change (see the module docstring); other kernels get k unchanged.
    """
    if not kernel(name).raw_keys(options):
        return k
    # max(max k, -min k): two plain reductions, several times faster on CPU than abs().amax() (which
    # materialises |k|) or the inf-norm.
    k32 = upcast(k)
    amax = torch.maximum(k32.amax(dim=(-2, -1), keepdim=True), -k32.amin(dim=(-2, -1), keepdim=True))
    # Eagerly, skip the pass when nothing is that large; traced (torch.export, ONNX, compile) there is no
    # data-dependent branch: dividing by exactly 1 leaves the keys as they are.
    if not torch.compiler.is_compiling() and not bool((amax > RAW_KEY_LIMIT).any()):
        return k
    return upcast(k) / torch.where(amax > RAW_KEY_LIMIT, amax, torch.ones_like(amax)).detach()


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
    probe = torch.ones(1, head_dim, device="cpu")  # on the CPU also under a meta-device context
    return feature_map(name)(probe, False, **options).shape[-1]


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


def check_norm_scale(norm_scale: float) -> float:
    """A numeric ``norm_scale`` option, which must be a positive finite number."""
    if not math.isfinite(norm_scale) or norm_scale <= 0:
        raise ValueError(f"norm_scale must be a positive number, got {norm_scale!r}")
    return float(norm_scale)


def query_power(norm: Tensor, lam: float | Tensor = 3.0, tau: float = 0.5, norm_scale: float | Tensor = 1.0) -> Tensor:
    """The norm-aware exponent p(q) = lam * (tau + tanh(|q| / norm_scale)), in [lam*tau, lam*(tau+1)).

    ``norm_scale = 1`` is the paper's form; a tensor (e.g. one per head, shape (heads, 1, 1)) broadcasts over
    (..., heads, N, 1) norms.
    """
    if isinstance(norm_scale, Tensor):
        return lam * (tau + torch.tanh(norm / upcast(norm_scale)))
    check_norm_scale(norm_scale)
    return lam * (tau + torch.tanh(norm if norm_scale == 1.0 else norm * (1.0 / norm_scale)))


def cosine_features(unit: Tensor, magnitude: Tensor, scale: float) -> Tensor:
    """(..., d) unit directions and magnitudes -> (..., 2d) features ``m * (cos theta(u), sin theta(u))``.

    ``theta = (pi/4) tanh(scale * u)``. tanh is computed as ``2 sigmoid(2y) - 1`` (the same function,
    about 3x faster on CPU).
    """
    theta = torch.sigmoid(unit * (2 * scale)) * (math.pi / 2) - math.pi / 4
    return torch.cat((magnitude * torch.cos(theta), magnitude * torch.sin(theta)), dim=-1)


KEY_MAPS = ("raw", "direction")
# The default key map of ``nala``: the paper's raw k^lam (see the README for the comparison behind the choice).
NALA_KEY_MAP = "raw"


def resolve_angle_scale(angle_scale: float | str, head_dim: int) -> float:
    """The number s of ``theta = (pi/4) tanh(s x)`` for an ``angle_scale`` option (a number or ``"sqrt_d"``)."""
    if angle_scale == "sqrt_d":
        return math.sqrt(head_dim)
    if isinstance(angle_scale, str) or not math.isfinite(angle_scale) or angle_scale <= 0:
        raise ValueError(f"angle_scale must be a positive number or 'sqrt_d', got {angle_scale!r}")
    return float(angle_scale)


def resolve_key_map(key_map: str | None) -> str:
    """A ``key_map`` option checked, None meaning :data:`NALA_KEY_MAP`."""
    key_map = NALA_KEY_MAP if key_map is None else key_map
    if key_map not in KEY_MAPS:
        raise ValueError(f"key_map must be one of {', '.join(KEY_MAPS)}, got {key_map!r}")
    return key_map


@register_kernel("nala", raw_keys=lambda options: (options.get("key_map") or NALA_KEY_MAP) == "raw")
def nala_features(
    x: Tensor,
    is_query: bool,
    lam: float = 3.0,
    tau: float = 0.5,
    angle_scale: float | str = 1.0,
    key_map: str | None = None,
    norm_scale: float | Tensor = 1.0,
) -> Tensor:
    """The paper's NaLa map: norm-aware elementwise power and cosine direction map, 2d features.

    Args:
        lam, tau: the power ``p(q) = lam * (tau + tanh(|q| / norm_scale))``; keys use ``lam``.
        norm_scale: ``gamma`` in that power: 1 is the paper's; a positive number or a tensor broadcasting over
            (..., heads, N, 1) (one per head: :class:`~nala_gen.attention.NaLaAttention` can learn it) is ours.
        angle_scale: ``s`` in ``theta = (pi/4) tanh(s * u)``; 1 is the paper's, ``"sqrt_d"`` ours.
        key_map: ``"raw"`` (``|k_i|^lam``, the paper) or ``"direction"`` (``|dir(k)_i|^lam``); None is
            :data:`NALA_KEY_MAP`.
    """
    key_map = resolve_key_map(key_map)
    norm, unit = direction(x)
    if is_query:
        magnitude = unit.abs().pow(query_power(norm, lam, tau, norm_scale))
    elif key_map == "raw":
        magnitude = upcast(x).abs().pow(lam)
    else:
        magnitude = unit.abs().pow(lam)
    return cosine_features(unit, magnitude, resolve_angle_scale(angle_scale, x.shape[-1]))


@register_kernel("nala_split", raw_keys=True, denominator_eps=1e-6)
def nala_split_features(x: Tensor, is_query: bool, lam: float = 3.0, tau: float = 0.5) -> Tensor:
    """The released NaLaFormer code's map (2d features).

    Queries: ``[ReLU(u)^p, ReLU(-u)^p]`` with ``u = q / |q|`` and the norm-aware power p; keys: the raw
    ``[ReLU(k)^lam, ReLU(-k)^lam]``. Registered with the release's normaliser epsilon (1e-6 on the mean).
    """
    if is_query:
        norm, unit = direction(x)
        power = query_power(norm, lam, tau)
        return torch.cat((F.relu(unit).pow(power), F.relu(-unit).pow(power)), dim=-1)
    x = upcast(x)
    return torch.cat((F.relu(x).pow(lam), F.relu(-x).pow(lam)), dim=-1)


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
