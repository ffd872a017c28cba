"""NaLaSR: ESRT with its efficient multi-head attention replaced by the paper's NaLa block, global over every LR
pixel. Registered in BasicSR's ``ARCH_REGISTRY`` as ``NaLaSR`` by :mod:`nala_gen.sr.basicsr`.

NaLa attention: "Norm x Direction: Restoring the Missing Query Norm in Vision Linear Attention",
arXiv 2506.21137. Everything outside the attention is ESRT's (:class:`~nala_gen.sr.archs.esrt_arch.ESRTLayout`).
Inside the Efficient Transformer, ESRT's reduction of the ``9 * num_feat``-wide tokens to half width stays;
the NaLa block (:class:`~nala_gen.attention.NaLaAttention`: q/k/v/g projection -> kernel with 2-D RoPE on the
numerator -> + 5x5 LePE on v -> ``LN(o) * SiLU(g)`` -> projection back to the token width) replaces EMHA's
q/k/v, split softmax and projection. NaLaSR-light has 777,099 parameters at x4 against ESRT's 751,755 (+3.4 %:
the gate projection, LePE and the output LayerNorm).
"""

from __future__ import annotations

import torch
from torch import nn

from nala_gen.attention import NaLaAttention
from nala_gen.attention.modules import kernel_from_alias

from .esrt_arch import ESRTLayout
from .hub import HubMixin

Tensor = torch.Tensor

# Named sizes. ``light`` is ESRT's layout; ``large`` is ours (no published counterpart).
NALASR_SIZES = {
    "light": {"num_feat": 32, "num_block": 3, "num_et": 1, "num_heads": 8},
    "large": {"num_feat": 48, "num_block": 4, "num_et": 2, "num_heads": 8},
}


class NaLaTokenAttention(nn.Module):
    """ESRT's token reduction (``dim -> dim // 2``, no bias), then the NaLa block projecting back to ``dim``.

    As :class:`~nala_gen.sr.archs.esrt_arch.EMHA`: ``forward = proj(mix(reduce(x)))`` with ``reduce`` and ``proj``
    Linear layers (the fast inference form composes them with the transformer's LayerNorms and fold).

    Args:
        dim: token width (``9 * num_feat``).
        num_heads: heads of the NaLa block.
        **block_options: forwarded to :class:`~nala_gen.attention.NaLaAttention` (``kernel``, ``rope``,
            ``lepe``, ``gate``, ``kernel_options``, ...).
    """

    def __init__(self, dim: int, num_heads: int, **block_options) -> None:
        super().__init__()
        self.reduce = nn.Linear(dim, dim // 2, bias=False)
        self.block = NaLaAttention(dim // 2, num_heads, out_dim=dim, **block_options)

    @property
    def proj(self) -> nn.Linear:
        return self.block.proj

    def mix(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """Reduced tokens (B, N, dim // 2) -> the block's output before its projection, (B, N, dim // 2)."""
        return self.block.mix(x, hw)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, dim) tokens of an H x W grid -> (B, N, dim)."""
        return self.block(self.reduce(x), hw)


class NaLaSR(ESRTLayout, HubMixin, hub_tags=("super-resolution", "nala")):
    """NaLaSR: ESRT's layout with the NaLa block as its transformer's attention, linear in LR pixels.

    Every part of the block is a switch, so ablations are one YAML field each. ``save_pretrained(folder)`` and
    ``NaLaSR.from_pretrained(folder)`` write and read ``config.json`` + ``model.safetensors`` (huggingface_hub's
    model-mixin convention, its module imported on first use: :mod:`~nala_gen.sr.archs.hub`; local folders work
    offline).

    Args:
        num_in_ch, num_out_ch: image channels in and out (3).
        num_feat: feature channels (light 32, large 48).
        num_block: High Preserving Blocks (light 3, large 4).
        num_et: Efficient Transformers (light 1, large 2).
        num_heads: attention heads (8).
        upscale: 2, 3 or 4.
        kernel: kernel of the block: ``nala`` (default), ``nala_split``, ``softmax`` (fused SDPA: O(N) memory,
            O(N^2) time), ``relu``, ``elu1``, ``focused``. ``attn_type`` (older option files and cards) is its
            deprecated name.
        rope: 2-D RoPE on the numerator features.
        lepe: the 5x5 depthwise LePE on v.
        gate: the ``LN(o) * SiLU(g)`` output gate.
        kernel_options: feature-map arguments, e.g. ``{"key_map": "direction"}`` or ``{"angle_scale": "sqrt_d"}``.
        norm_scale: ``nala`` only, our extension: the query power's norm scale gamma (None: the paper's 1; a
            number; ``"learned"`` or ``"tracked"``: one per head, see :class:`~nala_gen.attention.NaLaAttention`).
        fast_inference: run the fast inference form in inference (see
            :meth:`~nala_gen.sr.archs.esrt_arch.ESRTLayout.forward`); False runs the layers one by one there too.
    """

    def __init__(
        self,
        num_in_ch: int = 3,
        num_out_ch: int = 3,
        num_feat: int = 32,
        num_block: int = 3,
        num_et: int = 1,
        num_heads: int = 8,
        upscale: int = 4,
        kernel: str = "nala",
        rope: bool = True,
        lepe: bool = True,
        gate: bool = True,
        kernel_options: dict | None = None,
        norm_scale: float | str | None = None,
        attn_type: str | None = None,
        fast_inference: bool = True,
    ) -> None:
        kernel = kernel_from_alias(kernel, attn_type, "attn_type")
        options = {"kernel": kernel, "rope": rope, "lepe": lepe, "gate": gate, "kernel_options": kernel_options}
        options["norm_scale"] = norm_scale
        super().__init__(
            num_in_ch,
            num_out_ch,
            num_feat,
            num_block,
            num_et,
            upscale,
            attention=lambda dim: NaLaTokenAttention(dim, num_heads, **options),
            fast_inference=fast_inference,
        )
