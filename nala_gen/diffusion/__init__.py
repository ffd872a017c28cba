"""NaLaDiT / NaLaSiT in diffusers: the transformer, NaLa attention processors, ``linearize`` and one pipeline.

``NaLaDiTTransformer2DModel`` is a class-conditional DiT whose attention kernel is one config value
(``attention_type``); ``NaLaDiTPipeline`` samples it as DiT (epsilon schedulers) or SiT (flow-matching
schedulers); ``NaLaAttnProcessor`` / ``linearize`` put NaLa into the self-attention of other diffusers models.
"""

from .embeddings import TimestepClassEmbedding, sincos_pos_embed_2d
from .model import MODEL_SIZES, NaLaDiTBlock, NaLaDiTTransformer2DModel
from .pipeline import NaLaDiTPipeline
from .processors import NaLaAttnProcessor, attention_processors, is_self_attention, linearize

__all__ = [
    "MODEL_SIZES",
    "NaLaAttnProcessor",
    "NaLaDiTBlock",
    "NaLaDiTPipeline",
    "NaLaDiTTransformer2DModel",
    "TimestepClassEmbedding",
    "attention_processors",
    "is_self_attention",
    "linearize",
    "sincos_pos_embed_2d",
]
