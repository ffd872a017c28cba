"""Attention processors that run :func:`~nala_gen.attention.linear_attention` inside diffusers' ``Attention``.

``NaLaAttnProcessor(kernel)`` is a drop-in for diffusers' ``AttnProcessor2_0``: it reuses the module's own
projections (``to_q/to_k/to_v``, optional ``norm_q/norm_k``, ``to_out``) and only replaces the attention op, so a
pretrained softmax model can be switched to NaLa (``linearize``) and a NaLa model ablated back to softmax without
touching any weight. With ``kernel="softmax"`` the processor computes exactly what ``AttnProcessor2_0`` does.

The processors hold no parameters: a model's state dict is the same whatever processor it runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention
from torch import nn

from nala_gen.attention import apply_rope, kernel_names, linear_attention

Tensor = torch.Tensor
Rope = tuple[Tensor, Tensor]


def _normalized_size(norm: nn.Module) -> int | None:
    """Last normalised dimension of a q/k norm (LayerNorm, RMSNorm), or None when it acts per head (LpNorm)."""
    shape = getattr(norm, "normalized_shape", None)
    if shape is None and isinstance(getattr(norm, "dim", None), torch.Size):
        shape = norm.dim
    return int(shape[-1]) if shape else None


def _qk_norm(norm: nn.Module | None, x: Tensor, heads: int, head_dim: int) -> Tensor:
    """Apply ``norm`` to (B, N, heads * head_dim) tokens, before or after the head split as the norm is sized.

    Most diffusers models normalise each head (size head_dim, after the split); some (Sana, LTX, Lumina) normalise
    across heads (size heads * head_dim, before it). Returns (B, heads, N, head_dim).
    """
    across_heads = norm is not None and head_dim != heads * head_dim and _normalized_size(norm) == heads * head_dim
    if across_heads:
        x = norm(x)
    x = x.unflatten(-1, (heads, head_dim)).transpose(1, 2)
    if norm is not None and not across_heads:
        x = norm(x)
    return x


def _key_keep_mask(attention_mask: Tensor, batch: int, n_keys: int) -> Tensor:
    """A key-padding mask, (B, N_k) or (B, 1, N_k), boolean or additive (0 keep, large negative drop) -> (B, N_k)."""
    mask = attention_mask
    if mask.dim() == 3 and mask.shape[1] == 1:
        mask = mask[:, 0]
    if mask.shape != (batch, n_keys):
        raise ValueError(
            f"linear attention supports key-padding masks of shape (B, N_k) or (B, 1, N_k) only; got "
            f"{tuple(attention_mask.shape)} for B={batch}, N_k={n_keys}"
        )
    return mask if mask.dtype == torch.bool else mask > -1.0


class NaLaAttnProcessor:
    """Kernelised attention for diffusers' ``Attention`` modules (self- or cross-attention).

    Args:
        kernel: a name from :func:`~nala_gen.attention.kernel_names` (``nala``, ``nala_split``, ``relu``, ``elu1``,
            ``focused``, ``softmax``).
        chunk_size: tokens per chunk of the streaming linear op (memory knob, results do not depend on it).
        **kernel_options: feature-map arguments, e.g. ``lam=3.0, tau=0.5`` for ``nala``.

    Call with ``hidden_states`` (B, N, C) or (B, C, H, W), optional ``encoder_hidden_states`` (B, M, C') for
    cross-attention, and optional ``rope`` (cos, sin) tables sized for the kernel's feature dimension.
    ``attention_mask``: any mask with ``softmax`` (as AttnProcessor2_0); key-padding masks only with linear
    kernels, run per sample on the kept keys (a linear form has no per-(query, key) weights to mask).
    """

    def __init__(self, kernel: str = "nala", chunk_size: int = 4096, **kernel_options) -> None:
        if kernel not in kernel_names():
            raise ValueError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(kernel_names())}")
        self.kernel = kernel
        self.chunk_size = chunk_size
        self.kernel_options = dict(kernel_options)

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.kernel_options.items())
        return f"{type(self).__name__}(kernel={self.kernel!r}{options})"

    def _attend(self, attn: Attention, q: Tensor, k: Tensor, v: Tensor, rope: Rope | None, mask: Tensor | None):
        """(B, heads, N, d) q, k, v -> (B, heads, N_q, d)."""
        if self.kernel == "softmax":
            # SDPA's default scale is head_dim**-0.5; modules built with another scale (scale_qk=False) get it by
            # rescaling q, which is what softmax(scale * q k^T) means.
            default_scale = q.shape[-1] ** -0.5
            if abs(attn.scale - default_scale) > 1e-12:
                q = q * (attn.scale / default_scale)
            if mask is None:
                return linear_attention(q, k, v, kernel="softmax", rope=rope)
            if rope is not None:
                q, k = apply_rope(q, *rope).to(q.dtype), apply_rope(k, *rope).to(k.dtype)
            mask = attn.prepare_attention_mask(mask, k.shape[-2], q.shape[0])
            mask = mask.view(q.shape[0], attn.heads, -1, mask.shape[-1])
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        options = self.kernel_options
        keep = None if mask is None else _key_keep_mask(mask, q.shape[0], k.shape[-2])
        if keep is None or bool(keep.all()):
            return linear_attention(q, k, v, self.kernel, rope, self.chunk_size, **options)
        if rope is not None:
            raise ValueError("RoPE with a key-padding mask is not supported by the linear processor")
        outputs = []
        for i in range(q.shape[0]):  # each sample attends over its own kept keys
            k_i, v_i = k[i : i + 1, :, keep[i]], v[i : i + 1, :, keep[i]]
            outputs.append(linear_attention(q[i : i + 1], k_i, v_i, self.kernel, None, self.chunk_size, **options))
        return torch.cat(outputs, dim=0)

    def __call__(
        self,
        attn: Attention,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        temb: Tensor | None = None,
        rope: Rope | None = None,
        **kwargs,
    ) -> Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)

        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channels, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channels, height * width).transpose(1, 2)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)

        heads = attn.heads
        head_dim = query.shape[-1] // heads
        kv_heads = key.shape[-1] // head_dim
        q = _qk_norm(attn.norm_q, query, heads, head_dim)
        k = _qk_norm(attn.norm_k, key, kv_heads, head_dim)
        v = value.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)
        if kv_heads != heads:  # grouped-query attention: share each k/v head among heads // kv_heads queries
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)

        out = self._attend(attn, q, k, v, rope, attention_mask)
        hidden_states = out.transpose(1, 2).flatten(2).to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)

        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channels, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def is_self_attention(module: nn.Module) -> bool:
    """True for diffusers ``Attention`` modules that attend over their own tokens only.

    Cross-attention (``is_cross_attention``) and joint attention with added text projections (``added_kv_proj_dim``,
    SD3/Flux style) are left out: their keys are not (only) the image tokens.
    """
    return (
        isinstance(module, Attention)
        and not module.is_cross_attention
        and module.added_kv_proj_dim is None
        and not module.only_cross_attention
    )


def linearize(model: nn.Module, kernel: str = "nala", **kernel_options) -> list[str]:
    """Swap the self-attention processors of a diffusers model for ``NaLaAttnProcessor(kernel)``, in place.

    Cross-attention keeps its processor. Weights are untouched, so the result is the same network with another
    attention op (to be fine-tuned). Processors are not saved with the weights: after ``from_pretrained`` call
    ``linearize`` again.

    Returns:
        The names (as in ``model.named_modules()``) of the swapped ``Attention`` modules.
    """
    processor = NaLaAttnProcessor(kernel, **kernel_options)
    swapped = []
    for name, module in model.named_modules():
        if is_self_attention(module):
            module.set_processor(processor)
            swapped.append(name)
    return swapped


def attention_processors(model: nn.Module) -> dict[str, object]:
    """``{module name: processor}`` of every diffusers ``Attention`` in ``model`` (also for models without
    ``AttentionMixin.attn_processors``, e.g. ``DiTTransformer2DModel``)."""
    return {name: module.processor for name, module in model.named_modules() if isinstance(module, Attention)}
