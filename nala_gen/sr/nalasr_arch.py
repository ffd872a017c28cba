"""NaLaSR: ESRT's backbone with global Norm-Aware Linear Attention over every LR pixel.

NaLa attention: "Norm x Direction: Restoring the Missing Query Norm in Vision Linear Attention",
arXiv 2506.21137. Registered in BasicSR's ``ARCH_REGISTRY`` as ``NaLaSR``.
"""

from basicsr.utils.registry import ARCH_REGISTRY

from .blocks import ESRTBackbone

# Named sizes. ``light`` matches ESRT's parameter count exactly (same layers, only the attention differs).
NALASR_SIZES = {
    "light": {"num_feat": 32, "num_block": 3, "num_et": 1, "num_heads": 8},
    "large": {"num_feat": 48, "num_block": 4, "num_et": 2, "num_heads": 8},
}


@ARCH_REGISTRY.register()
class NaLaSR(ESRTBackbone):
    """NaLaSR: High Preserving Blocks, then Efficient Transformers with global attention by name.

    Linear in the number of LR pixels for every ``attn_type`` except ``emha`` (ESRT's split softmax) and
    ``softmax`` (fused SDPA: O(N) memory but O(N^2) time), so ablations are one YAML field.

    Args:
        num_in_ch, num_out_ch: image channels in and out (3).
        num_feat: feature channels (light 32, large 48).
        num_block: High Preserving Blocks (light 3, large 4).
        num_et: transformer blocks (light 1, large 2).
        num_heads: attention heads (8).
        upscale: 2, 3 or 4.
        attn_type: ``nala`` (default), ``nala_split``, ``emha``, ``softmax``, ``relu``, ``elu1``, ``focused``.
        num_splits: token segments, only for ``emha``.
        use_rope: 2-D RoPE on the attention features (no parameters).
        img_range: input range (1.0 for BasicSR's [0, 1] tensors).
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
        attn_type: str = "nala",
        num_splits: int = 4,
        use_rope: bool = True,
        img_range: float = 1.0,
    ) -> None:
        super().__init__(
            num_in_ch,
            num_out_ch,
            num_feat,
            num_block,
            num_et,
            num_heads,
            upscale,
            attn_type=attn_type,
            num_splits=num_splits,
            use_rope=use_rope,
            img_range=img_range,
        )
