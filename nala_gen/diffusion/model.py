"""NaLaDiT: a class-conditional DiT whose self-attention runs any kernel of ``nala_gen.attention`` (NaLa by default).

Layout (DiT, Peebles & Xie 2023): patchify conv -> + 2-D sin-cos positions -> ``depth`` adaLN-Zero blocks
conditioned on one vector c = timestep embedding + class embedding -> adaLN final layer -> unpatchify.
Attention is the NaLa block of :class:`~nala_gen.attention.NaLaAttention` (the module NaLaSR uses too: q/k/v/g
projection, the kernel with 2-D RoPE on the numerator, LePE, the ``LN(o) * SiLU(g)`` gate, projection), its kernel
chosen by the config field ``kernel`` (with ``kernel_options``; the same names as the block's and NaLaSR's): a NaLa
model and its softmax twin differ by that one value and have identical state dicts. Older configs name them
``attention_kernel`` / ``attention_kernel_options``, or ``attention_type``; these still load (with a
DeprecationWarning) and are saved under today's names. ``rope``, ``lepe`` and ``gate`` switch the block's parts (the
paper's block: all on).

As in diffusers, attention runs through processors: ``model.attn_processors`` lists them (one
:class:`~nala_gen.diffusion.processors.NaLaAttnProcessor` per block, with the config's kernel) and
``model.set_attn_processor`` swaps them, e.g. ``NaLaAttnProcessor("softmax")`` runs softmax on the same weights;
diffusers' ``AttnProcessor()`` / ``AttnProcessor2_0()`` do the same (the block's RoPE, LePE and gate kept).

The same network serves both objectives: DiT (epsilon prediction, timesteps in [0, 1000)) and SiT (flow matching:
it outputs ``noise - data`` at timestep ``1000 * sigma``), see :mod:`nala_gen.diffusion.pipeline`.
"""

from __future__ import annotations

import torch
from diffusers.configuration_utils import ConfigMixin, FrozenDict, register_to_config
from diffusers.models.attention import AttentionMixin, FeedForward
from diffusers.models.modeling_outputs import Transformer2DModelOutput

# ``ModelMixin`` must be an attribute of this module: a pipeline saved with this model records the library as
# "nala_gen.diffusion.model", and diffusers' loader looks the base class up there to pick the load method.
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from nala_gen.attention import NaLaAttention
from nala_gen.attention.modules import KERNEL_KEY_ALIASES, with_kernel_keys

from .embeddings import TimestepClassEmbedding, sincos_pos_embed_2d
from .processors import NaLaAttnProcessor, block_processor

Tensor = torch.Tensor

# hidden size, depth, heads of the DiT paper's sizes (patch size in the name), plus a tiny one for tests and demos.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "depth": 2, "num_attention_heads": 2, "patch_size": 2},
    "S/2": {"hidden_size": 384, "depth": 12, "num_attention_heads": 6, "patch_size": 2},
    "B/2": {"hidden_size": 768, "depth": 12, "num_attention_heads": 12, "patch_size": 2},
    "L/2": {"hidden_size": 1024, "depth": 24, "num_attention_heads": 16, "patch_size": 2},
    "XL/2": {"hidden_size": 1152, "depth": 28, "num_attention_heads": 16, "patch_size": 2},
}


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN: x (B, N, C) * (1 + scale) + shift, with per-sample (B, C) shift and scale."""
    return x * (1 + scale[:, None]) + shift[:, None]


PREDICTION_TYPES = ("epsilon", "v_prediction", "flow", None)  # what a model outputs (None: not recorded)
ATTENTION_INITS = ("neutral", "xavier")  # see NaLaDiTTransformer2DModel's attention_init


class NaLaDiTAttention(NaLaAttention):
    """The NaLa block run by an attention processor, as diffusers' ``Attention`` is (``get_processor`` /
    ``set_processor``, which ``AttentionMixin.attn_processors`` / ``set_attn_processor`` walk).

    Its processor starts as :class:`NaLaAttnProcessor` with the block's kernel and options; another
    ``NaLaAttnProcessor`` runs its kernel on the same weights (RoPE sized for that kernel, LePE and gate as
    configured), and diffusers' ``AttnProcessor()`` / ``AttnProcessor2_0()`` run the softmax kernel so
    (:func:`~nala_gen.diffusion.processors.block_processor`). The processor set is the one ``get_processor`` (and
    so ``attn_processors``) gives back, as diffusers' modules do. Processors hold no parameters: the state dict is
    the block's.
    """

    def __init__(self, dim: int, num_heads: int, **options) -> None:
        super().__init__(dim, num_heads, **options)
        self.processor = NaLaAttnProcessor(self.kernel, **self.kernel_options)

    def get_processor(self) -> object:
        return self.processor

    def set_processor(self, processor: object) -> None:
        block_processor(processor)  # refuses, before anything changes, a processor the block cannot run
        self.processor = processor

    def forward(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """x: (B, N, C) tokens of the patch grid ``hw`` -> (B, N, C)."""
        return block_processor(self.processor)(self, x, hw=hw)


class NaLaDiTBlock(nn.Module):
    """adaLN-Zero transformer block: ``x + gate * attn(modulate(LN(x)))``, then the same with an MLP.

    The modulation is zero-initialised by the model, so every block starts as the identity (DiT's adaLN-Zero).
    ``attention_options`` go to :class:`NaLaDiTAttention` (``kernel``, ``rope``, ``lepe``, ``gate``,
    ``kernel_options``, ``norm_scale``).
    """

    def __init__(
        self, hidden_size: int, num_heads: int, mlp_ratio: float, norm_eps: float = 1e-6, **attention_options
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=norm_eps)
        self.attn = NaLaDiTAttention(hidden_size, num_heads, **attention_options)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=norm_eps)
        inner = int(hidden_size * mlp_ratio)
        self.ff = FeedForward(hidden_size, activation_fn="gelu-approximate", inner_dim=inner)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: Tensor, c: Tensor, grid: tuple[int, int]) -> Tensor:
        """x (B, N, C) tokens of a ``grid`` (H, W) of patches, c (B, C) conditioning -> (B, N, C)."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=-1)
        x = x + gate_msa[:, None] * self.attn(_modulate(self.norm1(x), shift_msa, scale_msa), grid)
        return x + gate_mlp[:, None] * self.ff(_modulate(self.norm2(x), shift_mlp, scale_mlp))


class NaLaDiTTransformer2DModel(ModelMixin, ConfigMixin, AttentionMixin):
    """Class-conditional diffusion transformer with NaLa (or any ``nala_gen`` kernel) self-attention.

    Args:
        sample_size: training latent size (pipelines use it for the default resolution; the model runs at any
            size divisible by ``patch_size``).
        patch_size: side of the square patches (tokens = (H / p) * (W / p)).
        in_channels: input channels (4 for SD-VAE latents, 3 for pixels).
        hidden_size, depth, num_attention_heads: width, number of blocks, heads (see :data:`MODEL_SIZES`).
        mlp_ratio: MLP hidden size / hidden_size.
        num_classes: number of classes; the embedding table has one more row, the null class ``num_classes``.
        learn_sigma: also output the (DDPM learned-range) variance, so ``out_channels = 2 * in_channels``.
        kernel: attention kernel: ``nala``, ``nala_split``, ``relu``, ``elu1``, ``focused`` or ``softmax``.
        kernel_options: feature-map arguments, e.g. ``{"lam": 3.0, "tau": 0.5}``.
        attention_norm_scale: ``nala`` only, our extension: the query power's norm scale gamma (None: the
            paper's 1; a number; ``"learned"`` or ``"tracked"``: one per head, see
            :class:`~nala_gen.attention.NaLaAttention`).
        rope: the block's 2-D RoPE (on the kernel's numerator features; on q/k for softmax), besides the absolute
            positions.
        lepe: the block's 5x5 depthwise LePE on v over the patch grid.
        gate: the block's ``LN(o) * SiLU(g)`` output gate.
        interpolate_pos_embed: at a grid other than the training one, scale positions so that the longer side
            spans the training grid (PixArt-style); False keeps one position per patch (extrapolation).
        norm_eps: epsilon of the (affine-free) LayerNorms.
        attention_init: how a freshly built model starts its attention blocks (a loaded model has its trained
            weights whatever this says). ``"neutral"``: q/k/v rows xavier-initialised as the fused q/k/v of a
            block without a gate (DiT's), LePE zero and the gate open
            (:meth:`~nala_gen.attention.NaLaAttention.start_parts_neutral`), so the block starts as attention
            followed by a LayerNorm. ``"xavier"``: xavier over the whole fused q/k/v/g weight and PyTorch's default
            for LePE, the initialisation of pipelines trained before this field (a random local term and a
            half-closed random gate from the first step).
        prediction_type: what the model was trained to output: ``"epsilon"`` (DiT), ``"v_prediction"``,
            ``"flow"`` (SiT: the velocity ``noise - data``), or None (not recorded: the scheduler decides, as
            before this field existed). ``nala-gen train`` records it; the pipeline checks its scheduler against it.
        attention_kernel, attention_kernel_options, attention_type: deprecated names of ``kernel`` and
            ``kernel_options``, read from older configs (a DeprecationWarning) and not saved.
    """

    _supports_gradient_checkpointing = True
    _no_split_modules = ["NaLaDiTBlock"]
    _repeated_blocks = ["NaLaDiTBlock"]
    _skip_layerwise_casting_patterns = ["embedder", "norm"]

    @register_to_config
    def __init__(
        self,
        sample_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 1152,
        depth: int = 28,
        num_attention_heads: int = 16,
        mlp_ratio: float = 4.0,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        kernel: str = "nala",
        kernel_options: dict | None = None,
        attention_norm_scale: float | str | None = None,
        rope: bool = True,
        lepe: bool = True,
        gate: bool = True,
        interpolate_pos_embed: bool = False,
        norm_eps: float = 1e-6,
        prediction_type: str | None = None,
        attention_init: str = "neutral",
        attention_kernel: str | None = None,
        attention_kernel_options: dict | None = None,
        attention_type: str | None = None,
    ) -> None:
        super().__init__()
        deprecated = {
            "attention_kernel": attention_kernel,
            "attention_kernel_options": attention_kernel_options,
            "attention_type": attention_type,
        }
        current = with_kernel_keys({"kernel": kernel, "kernel_options": kernel_options, **deprecated})
        kernel, kernel_options = current["kernel"], current["kernel_options"]
        # One name per field in the config: an older config's values under today's names, its own names gone (and
        # not listed as defaulted, which would make from_config(model.config) drop a value an old name gave).
        config = {k: v for k, v in self.config.items() if k not in KERNEL_KEY_ALIASES}
        if "_use_default_values" in config:
            defaulted = config["_use_default_values"]
            config["_use_default_values"] = [k for k in defaulted if k not in KERNEL_KEY_ALIASES and k not in current]
        self._internal_dict = FrozenDict({**config, **current})
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        if attention_init not in ATTENTION_INITS:
            raise ValueError(f"attention_init must be one of {ATTENTION_INITS}, got {attention_init!r}")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_attention_heads}")
        self.out_channels = 2 * in_channels if learn_sigma else in_channels
        self.gradient_checkpointing = False

        self.x_embedder = nn.Conv2d(in_channels, hidden_size, kernel_size=patch_size, stride=patch_size)
        self.embedder = TimestepClassEmbedding(hidden_size, num_classes)
        attention = {
            "kernel": kernel,
            "kernel_options": kernel_options,
            "norm_scale": attention_norm_scale,
            "rope": rope,
            "lepe": lepe,
            "gate": gate,
        }
        self.blocks = nn.ModuleList(
            NaLaDiTBlock(hidden_size, num_attention_heads, mlp_ratio, norm_eps, **attention) for _ in range(depth)
        )
        self.norm_out = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=norm_eps)
        self.adaLN_out = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))
        self.proj_out = nn.Linear(hidden_size, patch_size * patch_size * self.out_channels)
        self._init_weights()

    @classmethod
    def from_size(cls, name: str, **overrides) -> NaLaDiTTransformer2DModel:
        """A randomly initialised model of a named size (``tiny``, ``S/2``, ``B/2``, ``L/2``, ``XL/2``).

        ``overrides`` set any other config field (or replace the size's), e.g. ``kernel="softmax"``.
        """
        if name not in MODEL_SIZES:
            raise ValueError(f"unknown model size {name!r}; choose one of {', '.join(MODEL_SIZES)}")
        return cls(**{**MODEL_SIZES[name], **overrides})

    def set_attn_processor(self, processor: object | dict[str, object]) -> None:
        """diffusers' ``set_attn_processor`` (one processor for every block, or a dict keyed like
        ``attn_processors``), with every processor checked first, so that a refused one (a TypeError, see
        :func:`~nala_gen.diffusion.processors.block_processor`) leaves every block as it was."""
        for each in processor.values() if isinstance(processor, dict) else (processor,):
            block_processor(each)
        super().set_attn_processor(processor)

    def _init_weights(self) -> None:
        """DiT's initialisation: xavier linears, N(0, 0.02) embeddings, zero adaLN modulation and output; the
        attention blocks' parts as ``attention_init`` says."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.config.attention_init == "neutral":
            for block in self.blocks:
                attn = block.attn
                # q, k, v drawn as DiT draws its fused (3C, C) q/k/v weight: a g row block would widen xavier's
                # fan-out and shrink them.
                nn.init.xavier_uniform_(attn.qkvg.weight[: 3 * attn.qkvg.in_features])
                attn.start_parts_neutral()
        # The patch conv is a linear map of flattened patches.
        nn.init.xavier_uniform_(self.x_embedder.weight.view(self.x_embedder.weight.shape[0], -1))
        nn.init.zeros_(self.x_embedder.bias)
        nn.init.normal_(self.embedder.class_embedder.weight, std=0.02)
        nn.init.normal_(self.embedder.timestep_embedder.linear_1.weight, std=0.02)
        nn.init.normal_(self.embedder.timestep_embedder.linear_2.weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for linear in (self.adaLN_out[-1], self.proj_out):
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)

    def _pos_embed(self, grid_h: int, grid_w: int, device: torch.device) -> Tensor:
        scale = 1.0
        if self.config.interpolate_pos_embed:
            scale = (self.config.sample_size // self.config.patch_size) / max(grid_h, grid_w)
        return sincos_pos_embed_2d(self.config.hidden_size, grid_h, grid_w, scale, device)

    def forward(
        self,
        hidden_states: Tensor,
        timestep: Tensor | float | int,
        class_labels: Tensor,
        return_dict: bool = True,
    ) -> Transformer2DModelOutput | tuple[Tensor]:
        """Predict noise (or flow velocity) for a batch.

        Args:
            hidden_states: (B, C_in, H, W) noisy latents/images, H and W divisible by ``patch_size``.
            timestep: (B,) or a scalar, in [0, 1000] (DDPM step index or ``1000 * sigma``).
            class_labels: (B,) ints in [0, num_classes]; ``num_classes`` is the null (unconditional) class.
            return_dict: return a ``Transformer2DModelOutput`` (else a 1-tuple).

        Returns:
            ``sample`` of shape (B, out_channels, H, W); with ``learn_sigma`` the first ``in_channels`` channels
            are the prediction and the rest the variance interpolation.
        """
        batch, _, height, width = hidden_states.shape
        p = self.config.patch_size
        if height % p or width % p:
            raise ValueError(f"input size {height}x{width} is not divisible by the patch size {p}")
        grid_h, grid_w = height // p, width // p
        device, dtype = hidden_states.device, hidden_states.dtype

        x = self.x_embedder(hidden_states).flatten(2).transpose(1, 2)  # (B, N, hidden)
        x = x + self._pos_embed(grid_h, grid_w, device).to(x.dtype)
        timestep = torch.as_tensor(timestep, device=device).float().reshape(-1).expand(batch)
        c = self.embedder(timestep, class_labels.to(device).reshape(-1), x.dtype)

        for block in self.blocks:
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                x = self._gradient_checkpointing_func(block, x, c, (grid_h, grid_w))
            else:
                x = block(x, c, (grid_h, grid_w))

        shift, scale = self.adaLN_out(c).chunk(2, dim=-1)
        x = self.proj_out(_modulate(self.norm_out(x), shift, scale))  # (B, N, p * p * C_out)
        x = x.reshape(batch, grid_h, grid_w, p, p, self.out_channels)
        sample = x.permute(0, 5, 1, 3, 2, 4).reshape(batch, self.out_channels, height, width).to(dtype)
        if not return_dict:
            return (sample,)
        return Transformer2DModelOutput(sample=sample)
