"""NaLaSR and ESRT (torch only), the upscaling engine, BasicSR entry points, data preparation and ``nala-sr``.

``import nala_gen.sr.basicsr_registry`` registers both archs in BasicSR's ``ARCH_REGISTRY`` (the BasicSR entry points
do it themselves). The names below load on first use, so ``nala-sr --help`` does not import torch.
"""

from __future__ import annotations

import importlib

# name -> module that defines it
_LAZY = {"ESRT": ".esrt_arch", "NaLaSR": ".nalasr_arch", "NALASR_SIZES": ".nalasr_arch"}

__all__ = ["ESRT", "NALASR_SIZES", "SR_ARCHS", "NaLaSR"]


def __getattr__(name: str):
    if name == "SR_ARCHS":  # our archs by the names weight cards and BasicSR options use
        return {"ESRT": __getattr__("ESRT"), "NaLaSR": __getattr__("NaLaSR")}
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
