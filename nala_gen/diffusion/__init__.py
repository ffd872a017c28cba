"""NaLaDiT / NaLaSiT in diffusers: the transformer, NaLa attention processors, ``linearize`` and one pipeline.

``NaLaDiTTransformer2DModel`` is a class-conditional DiT whose attention kernel is one config value
(``kernel``); ``NaLaDiTPipeline`` samples it as DiT (epsilon schedulers) or SiT (flow-matching
schedulers); ``NaLaAttnProcessor`` / ``linearize`` put NaLa into the attention of other diffusers models.
The names below load on first use, so ``nala-gen --help`` does not import diffusers.
"""

from __future__ import annotations

import importlib

# name -> module that defines it
_LAZY = {
    "TimestepClassEmbedding": ".embeddings",
    "sincos_pos_embed_2d": ".embeddings",
    "MODEL_SIZES": ".model",
    "NaLaDiTBlock": ".model",
    "NaLaDiTTransformer2DModel": ".model",
    "NaLaDiTPipeline": ".pipeline",
    "LinearizeReport": ".processors",
    "NaLaAttnProcessor": ".processors",
    "NaLaJointAttnProcessor": ".processors",
    "attention_processors": ".processors",
    "linearize": ".processors",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
