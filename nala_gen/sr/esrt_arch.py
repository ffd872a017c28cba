"""ESRT (Lu et al., "Transformer for Single Image Super-Resolution", CVPRW 2022), written from the paper.

Registered in BasicSR's ``ARCH_REGISTRY`` as ``ESRT``.
"""

from basicsr.utils.registry import ARCH_REGISTRY

from .blocks import ESRTBackbone


@ARCH_REGISTRY.register()
class ESRT(ESRTBackbone):
    """ESRT: three High Preserving Blocks and one Efficient Transformer whose EMHA runs softmax inside
    ``num_splits`` token segments (memory ~N^2 / num_splits). 0.64 M parameters at x4 (0.57 M at x2, 0.66 M at x3).

    Args:
        num_in_ch, num_out_ch: image channels in and out (3).
        num_feat: feature channels (32; tokens are 9 * num_feat wide).
        num_block: High Preserving Blocks (3).
        num_et: Efficient Transformers (1).
        num_heads: attention heads (8).
        upscale: 2, 3 or 4.
        num_splits: EMHA token segments (4).
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
        num_splits: int = 4,
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
            attn_type="emha",
            num_splits=num_splits,
            use_rope=False,
            img_range=img_range,
        )
