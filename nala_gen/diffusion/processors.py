"""Attention processors that run :func:`~nala_gen.attention.linear_attention` inside diffusers' attention modules.

``NaLaAttnProcessor(kernel)`` is a drop-in for diffusers' ``AttnProcessor2_0`` (and HunyuanDiT's processor): it
reuses the module's own projections (``to_q/to_k/to_v``, optional ``norm_q/norm_k``, ``to_out``) and only replaces
the attention op, so a pretrained softmax model can be switched to NaLa (``linearize``) without touching any weight.
With ``kernel="softmax"`` it computes exactly what ``AttnProcessor2_0`` does. ``NaLaJointAttnProcessor`` does the
same for joint text-image attention: SD3's ``JointAttnProcessor2_0`` and Flux's ``FluxAttnProcessor``. The same
``NaLaAttnProcessor`` is also the processor of NaLaDiT's own attention (the NaLa block,
:class:`~nala_gen.attention.NaLaAttention`), so ``set_attn_processor`` swaps its kernel too; there diffusers'
``AttnProcessor()`` / ``AttnProcessor2_0()`` mean the softmax kernel (:func:`block_processor`).

A model's rotary embedding (``image_rotary_emb``: HunyuanDiT, Flux) is kept: for a linear kernel it rotates the
numerator features with the model's own frequencies (see :func:`rope_from_rotary`), as NaLa's 2-D RoPE does.

The processors hold no parameters: a model's state dict is the same whatever processor it runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import (
    Attention,
    AttnProcessor,
    AttnProcessor2_0,
    HunyuanAttnProcessor2_0,
    JointAttnProcessor2_0,
    SanaLinearAttnProcessor2_0,
)
from diffusers.models.embeddings import apply_rotary_emb
from torch import nn

from nala_gen.attention import NaLaAttention, apply_rope, feature_dim, kernel_names, linear_attention

Tensor = torch.Tensor
Rope = tuple[Tensor, Tensor]


@functools.cache
def _flux() -> tuple[type, type]:
    """Flux's attention and processor classes, imported on first use: importing them loads every diffusers
    transformer (about a second), which loading a NaLaDiT, whose processors live here, does not need."""
    from diffusers.models.transformers.transformer_flux import FluxAttention, FluxAttnProcessor

    return FluxAttention, FluxAttnProcessor


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


def _rotary_tables(rotary: tuple[Tensor, Tensor], head_dim: int) -> tuple[Tensor, Tensor, bool]:
    """Check diffusers' real rotary ``(cos, sin)`` (each (N, head_dim)); returns them in fp32 and whether the pairs
    are interleaved (channels 2i, 2i+1: Flux, HunyuanDiT) rather than halves (i, i + head_dim / 2)."""
    if not (isinstance(rotary, tuple | list) and len(rotary) == 2 and all(torch.is_tensor(t) for t in rotary)):
        raise ValueError("only real (cos, sin) rotary embeddings are supported by the NaLa processors")
    cos, sin = (t.float() for t in rotary)
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[-1] != head_dim:
        raise ValueError(f"rotary tables of shape {tuple(cos.shape)} do not fit heads of size {head_dim}")
    interleaved = torch.equal(cos[:, 0::2], cos[:, 1::2]) and torch.equal(sin[:, 0::2], sin[:, 1::2])
    return cos, sin, interleaved


def rotate_like_the_model(x: Tensor, rotary: tuple[Tensor, Tensor]) -> Tensor:
    """Apply a model's rotary embedding to (B, heads, N, head_dim) queries or keys exactly as the model does."""
    cos, sin, interleaved = _rotary_tables(rotary, x.shape[-1])
    return apply_rotary_emb(x, (cos, sin), use_real_unbind_dim=-1 if interleaved else -2)


def rope_from_rotary(rotary: tuple[Tensor, Tensor], head_dim: int, kernel: str, **kernel_options) -> Rope:
    """diffusers' real rotary tables -> :func:`~nala_gen.attention.apply_rope` tables for a linear kernel's features.

    The model's ``(cos, sin)`` rotate pairs of q/k channels, one angle per pair; here each pair's angle rotates the
    features of the channels it covers (NaLa's cosine map: the 2-vector of each channel; ReLU-like maps: pairs of
    features), numerator only, as NaLa's own 2-D RoPE does. (Softmax uses :func:`rotate_like_the_model`.)
    """
    cos, sin, interleaved = _rotary_tables(rotary, head_dim)
    angles_cos, angles_sin = (t[:, 0::2] if interleaved else t[:, : head_dim // 2] for t in (cos, sin))
    size = feature_dim(kernel, head_dim, **kernel_options)
    repeat = size // 2 // angles_cos.shape[-1]
    if size % 2 or repeat < 1 or repeat * angles_cos.shape[-1] != size // 2:
        raise ValueError(f"cannot map a rotary embedding of {head_dim} channels onto {size} {kernel} features")
    return angles_cos.repeat_interleave(repeat, -1), angles_sin.repeat_interleave(repeat, -1)


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
    """Kernelised attention for diffusers' ``Attention`` modules (self- or cross-attention) and for the NaLa block.

    Args:
        kernel: a name from :func:`~nala_gen.attention.kernel_names` (``nala``, ``nala_split``, ``relu``, ``elu1``,
            ``focused``, ``softmax``).
        chunk_size: tokens per chunk of the streaming linear op (memory knob, results do not depend on it).
        **kernel_options: feature-map arguments, e.g. ``lam=3.0, tau=0.5`` for ``nala``.

    Call with ``hidden_states`` (B, N, C) or (B, C, H, W), optional ``encoder_hidden_states`` (B, M, C') for
    cross-attention, optional ``rope`` (cos, sin) tables sized for the kernel's feature dimension, or the model's
    ``image_rotary_emb`` (diffusers' real (cos, sin), HunyuanDiT), kept through :func:`rope_from_rotary` in
    self-attention.
    ``attention_mask``: any mask with ``softmax`` (as AttnProcessor2_0); key-padding masks only with linear
    kernels, run per sample on the kept keys (a linear form has no per-(query, key) weights to mask).
    Cross-attention (``encoder_hidden_states``: text tokens) gets no RoPE: the text keys have no 2-D positions.
    HunyuanDiT rotates its cross-attention's queries (not the keys): they are rotated so before the kernel.

    On the NaLa block (:class:`~nala_gen.attention.NaLaAttention`: NaLaDiT's attention, driven by
    ``set_attn_processor``) it is called with ``hidden_states`` (B, N, C) and the patch grid ``hw``, and runs
    ``kernel`` inside the block's own q/k/v/g projection, 2-D RoPE, LePE and gate (with the op's default chunk).
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

    def rotary(self, q: Tensor, k: Tensor, image_rotary_emb: Rope) -> tuple[Tensor, Tensor, Rope | None]:
        """(q, k, rope) that keep a model's rotary embedding: softmax rotates q and k as the model does; a linear
        kernel gets the model's angles as feature RoPE (:func:`rope_from_rotary`)."""
        if self.kernel == "softmax":
            return rotate_like_the_model(q, image_rotary_emb), rotate_like_the_model(k, image_rotary_emb), None
        return q, k, rope_from_rotary(image_rotary_emb, q.shape[-1], self.kernel, **self.kernel_options)

    def _attend(self, attn: Attention, q: Tensor, k: Tensor, v: Tensor, rope: Rope | None, mask: Tensor | None):
        """(B, heads, N, d) q, k, v -> (B, heads, N_q, d)."""
        if self.kernel == "softmax":
            # SDPA's default scale is head_dim**-0.5; modules built with another scale (scale_qk=False) get it by
            # rescaling q, which is what softmax(scale * q k^T) means.
            default_scale = q.shape[-1] ** -0.5
            scale = getattr(attn, "scale", default_scale)  # Flux's attention has none: always the default
            if abs(scale - default_scale) > 1e-12:
                q = q * (scale / default_scale)
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
        attn: Attention | NaLaAttention,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        temb: Tensor | None = None,
        rope: Rope | None = None,
        image_rotary_emb: tuple[Tensor, Tensor] | None = None,
        hw: tuple[int, int] | None = None,
    ) -> Tensor:
        if isinstance(attn, NaLaAttention):  # the NaLa block: self-attention over a patch grid, its own parts
            if encoder_hidden_states is not None or attention_mask is not None:
                raise ValueError("the NaLa block is self-attention: no encoder_hidden_states or attention_mask")
            return attn.proj(attn.mix(hidden_states, hw, self.kernel, self.kernel_options))
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

        if image_rotary_emb is not None and attn.is_cross_attention:
            # HunyuanDiT rotates the queries of its cross-attention (absolute positions; the text keys have none):
            # the kernel gets the model's own queries.
            q = rotate_like_the_model(q, image_rotary_emb)
        elif image_rotary_emb is not None:
            if rope is not None or k.shape[-2] != q.shape[-2]:
                raise ValueError("image_rotary_emb is supported for self-attention without another rope only")
            q, k, rope = self.rotary(q, k, image_rotary_emb)
        out = self._attend(attn, q, k, v, rope, attention_mask)
        hidden_states = out.transpose(1, 2).flatten(2).to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)

        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channels, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


class NaLaJointAttnProcessor(NaLaAttnProcessor):
    """Kernelised joint attention over image and text tokens: SD3 (``Attention`` with added projections) and Flux
    (``FluxAttention``, with or without text: its single blocks).

    Reproduces ``JointAttnProcessor2_0`` / ``FluxAttnProcessor`` with the attention op replaced: each stream is
    projected and normalised with its own layers, the streams are concatenated (SD3: image first; Flux: text first),
    attend jointly, and are split and projected back. Flux's rotary embedding covers the joint sequence and is kept
    (:func:`rope_from_rotary`). Masks are refused (a linear form cannot mask per query and key).
    """

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        image_rotary_emb: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        if attention_mask is not None:
            raise ValueError("NaLaJointAttnProcessor does not take an attention mask")
        flux = isinstance(attn, _flux()[0])
        fused = flux and attn.fused_projections
        heads = attn.heads
        if fused:
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = query.shape[-1] // heads
        q, k, v = (_heads(x, heads, head_dim) for x in (query, key, value))
        q, k = _norm(attn.norm_q, q), _norm(attn.norm_k, k)
        n_image = q.shape[-2]
        joint = encoder_hidden_states is not None and attn.added_kv_proj_dim is not None
        if joint:
            if fused:
                text = attn.to_added_qkv(encoder_hidden_states).chunk(3, dim=-1)
            else:
                text = (proj(encoder_hidden_states) for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
            tq, tk, tv = (_heads(x, heads, head_dim) for x in text)
            tq, tk = _norm(attn.norm_added_q, tq), _norm(attn.norm_added_k, tk)
            streams = ((tq, q), (tk, k), (tv, v)) if flux else ((q, tq), (k, tk), (v, tv))
            q, k, v = (torch.cat(pair, dim=-2) for pair in streams)
        rope = None
        if image_rotary_emb is not None:
            q, k, rope = self.rotary(q, k, image_rotary_emb)
        out = self._attend(attn, q, k, v, rope, None).transpose(1, 2).flatten(2).to(query.dtype)
        if not joint:
            # Flux's processor returns a text-free call's output unprojected (its single blocks project it together
            # with their MLP); SD3's projects it.
            return out if flux else attn.to_out[1](attn.to_out[0](out))
        n_text = out.shape[1] - n_image
        text_out, image_out = (out[:, :n_text], out[:, n_text:]) if flux else (out[:, n_image:], out[:, :n_image])
        image_out = attn.to_out[1](attn.to_out[0](image_out.contiguous()))
        if flux or not attn.context_pre_only:
            text_out = attn.to_add_out(text_out.contiguous())
        return image_out, text_out


def _heads(x: Tensor, heads: int, head_dim: int) -> Tensor:
    """(B, N, heads * head_dim) -> (B, heads, N, head_dim)."""
    return x.unflatten(-1, (heads, head_dim)).transpose(1, 2)


def _norm(norm: nn.Module | None, x: Tensor) -> Tensor:
    """A per-head q/k norm on (B, heads, N, head_dim), or x itself."""
    return x if norm is None else norm(x)


# Processors whose computation the NaLa processors reproduce with another attention op.
PLAIN_PROCESSORS = (AttnProcessor, AttnProcessor2_0, HunyuanAttnProcessor2_0, SanaLinearAttnProcessor2_0)
JOINT_PROCESSORS = (JointAttnProcessor2_0,)  # and Flux's (see _flux)
# diffusers' plain softmax processors: what a diffusers user sets to ask for "ordinary attention" (as diffusers' tests
# and its models' set_default_attn_processor do), so the NaLa block takes them as the softmax kernel (block_processor).
SOFTMAX_PROCESSORS = (AttnProcessor, AttnProcessor2_0)
_BLOCK_SOFTMAX = NaLaAttnProcessor("softmax")  # processors hold no state: one instance serves every block


def block_processor(processor: object) -> NaLaAttnProcessor:
    """The processor that runs the NaLa block (NaLaDiT's attention) when ``processor`` is set on it.

    A :class:`NaLaAttnProcessor` runs itself; diffusers' ``AttnProcessor()`` / ``AttnProcessor2_0()`` (exactly those
    classes: a subclass may compute something else) run the softmax kernel, i.e. ``NaLaAttnProcessor("softmax")``:
    softmax inside the block's own projection, RoPE, LePE and gate, which stay as configured (they are part of the
    block's weights and of what it was trained with; the processors replace the attention op only).

    Raises:
        TypeError: for any other processor (joint, xformers, IP-adapter, LoRA, custom ...): it is written for
            diffusers' ``Attention`` module, whose projections the NaLa block does not have.
    """
    if isinstance(processor, NaLaAttnProcessor) and not isinstance(processor, NaLaJointAttnProcessor):
        return processor
    if type(processor) in SOFTMAX_PROCESSORS:
        return _BLOCK_SOFTMAX
    raise TypeError(
        "NaLaDiT's attention runs a NaLaAttnProcessor (any kernel, e.g. NaLaAttnProcessor('softmax')) or diffusers' "
        f"AttnProcessor / AttnProcessor2_0 (the softmax kernel), not {type(processor).__name__}"
    )


@dataclass
class LinearizeReport:
    """What :func:`linearize` did: the modules swapped (the joint and the cross-attention ones among them) and, for
    each module left alone, why."""

    kernel: str
    swapped: list[str] = field(default_factory=list)
    joint: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    cross: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        counts = f"{len(self.joint)} joint, {len(self.cross)} cross-attention"
        head = f"linearize({self.kernel!r}): {len(self.swapped)} swapped ({counts}), "
        lines = [head + f"{len(self.skipped)} left alone"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def _is_cross_attention(module: nn.Module) -> bool:
    """Attention whose keys and values are text tokens (``attn2`` of diffusers' ``BasicTransformerBlock``)."""
    return isinstance(module, Attention) and (module.is_cross_attention or module.only_cross_attention)


def _skip_reason(module: nn.Module, cross_attention: bool) -> str | None:
    """Why a diffusers attention module is not swapped, or None when it is."""
    processor = getattr(module, "processor", None)
    if _is_cross_attention(module) and not cross_attention:
        return "cross-attention: its keys are the text, not the image tokens (linearize(..., cross_attention=True))"
    if isinstance(processor, NaLaAttnProcessor):
        return None
    flux_attention, flux_processor = _flux()
    if isinstance(module, flux_attention):
        return None if isinstance(processor, flux_processor) else f"custom processor {type(processor).__name__}"
    if not isinstance(module, Attention):
        return f"{type(module).__name__} is not an attention class the NaLa processors support"
    if isinstance(processor, JOINT_PROCESSORS + PLAIN_PROCESSORS + (flux_processor,)):
        return None
    return f"processor {type(processor).__name__} is not one the NaLa processors reproduce"


def linearize(
    model: nn.Module, kernel: str = "nala", *, cross_attention: bool = False, **kernel_options
) -> LinearizeReport:
    """Swap the self- and joint attention of a diffusers model for the NaLa processors with ``kernel``, in place.

    Self-attention (``Attention`` running ``AttnProcessor2_0``, HunyuanDiT's or Sana's processor) gets
    :class:`NaLaAttnProcessor`, keeping the model's rotary embedding; joint text-image attention (SD3, Flux) gets
    :class:`NaLaJointAttnProcessor`. With ``cross_attention=True`` text-conditioned cross-attention (``attn2`` of
    diffusers' ``BasicTransformerBlock``: PixArt, the UNets, HunyuanDiT) gets :class:`NaLaAttnProcessor` too: its
    queries come from the N image tokens, its keys and values from the M text tokens, and its cost becomes
    O((N + M) d^2) instead of softmax's O(N M d). No RoPE or LePE is added there: the text tokens have no 2-D grid
    (a model that rotates the queries of its cross-attention, HunyuanDiT, still does); a text-padding mask is kept
    (each sample attends over its kept text tokens). By default (False) cross-attention stays softmax: with a few
    hundred text tokens its cost is linear in the image tokens already.

    Custom processors and attention classes the processors do not reproduce are left alone and reported. Weights
    are untouched, so the result is the same network with another attention op (to be fine-tuned). Processors are
    not saved with the weights: after ``from_pretrained`` call ``linearize`` again.

    Args:
        model: a diffusers model, or a pipeline (its ``transformer``, else its ``unet``).
        kernel, **kernel_options: the kernel (:func:`~nala_gen.attention.kernel_names`) and its feature-map options.
        cross_attention: also swap text-conditioned cross-attention.

    Returns:
        A :class:`LinearizeReport`: swapped module names (as in ``model.named_modules()``), the joint and the
        cross-attention ones among them, and each skipped module with its reason.
    """
    if not isinstance(model, nn.Module):  # a pipeline: its denoiser
        denoiser = getattr(model, "transformer", None) or getattr(model, "unet", None)
        if not isinstance(denoiser, nn.Module):
            raise TypeError(f"linearize takes a diffusers model or a pipeline with one, not {type(model).__name__}")
        model = denoiser
    plain, joint = NaLaAttnProcessor(kernel, **kernel_options), NaLaJointAttnProcessor(kernel, **kernel_options)
    report = LinearizeReport(kernel)
    for name, module in model.named_modules():
        if not isinstance(module, AttentionModuleMixin | Attention):
            continue
        reason = _skip_reason(module, cross_attention)
        if reason is not None:
            report.skipped[name] = reason
            continue
        is_joint = isinstance(module, _flux()[0]) or module.added_kv_proj_dim is not None
        module.set_processor(joint if is_joint else plain)
        report.swapped.append(name)
        if is_joint:
            report.joint.append(name)
        elif _is_cross_attention(module):
            report.cross.append(name)
    return report


def attention_processors(model: nn.Module) -> dict[str, object]:
    """``{module name: processor}`` of every diffusers attention module in ``model`` (``Attention``, Flux's, ...;
    also for models without ``AttentionMixin.attn_processors``, e.g. ``DiTTransformer2DModel``)."""
    return {
        name: module.processor
        for name, module in model.named_modules()
        if isinstance(module, AttentionModuleMixin | Attention)
    }
