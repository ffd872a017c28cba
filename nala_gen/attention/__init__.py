"""NaLa attention core: feature maps, the linear op and its explicit reference, RoPE, modules, diagnostics.

Depends on torch only. ``linear_attention(q, k, v, kernel="nala")`` is the entry point; every kernel name
from :func:`kernel_names` works with both ops, so models can be ablated by one config value.
"""

from .diagnostics import attention_entropy, entropy_vs_query_norm, query_norm_entropy
from .functional import (
    attention_weights,
    linear_attention,
    record_queries_keys,
    reference_attention,
    report_queries_keys,
    softmax_attention,
)
from .kernels import direction, feature_dim, feature_map, kernel_names, query_power, register_kernel
from .modules import ConvFFN, NaLaAttention, NaLaBlock, map_to_tokens, tokens_to_map
from .rope import apply_rope, rope_2d

__all__ = [
    "ConvFFN",
    "NaLaAttention",
    "NaLaBlock",
    "apply_rope",
    "attention_entropy",
    "attention_weights",
    "direction",
    "entropy_vs_query_norm",
    "feature_dim",
    "feature_map",
    "kernel_names",
    "linear_attention",
    "map_to_tokens",
    "query_norm_entropy",
    "query_power",
    "record_queries_keys",
    "reference_attention",
    "register_kernel",
    "report_queries_keys",
    "rope_2d",
    "softmax_attention",
    "tokens_to_map",
]
