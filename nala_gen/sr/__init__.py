"""Super-resolution: NaLaSR and ESRT, the upscaling engine, batch jobs, BasicSR training/testing and ``nala-sr``.

Laid out by job, as BasicSR lays out its package:

* :mod:`nala_gen.sr.archs`: the networks, one ``*_arch.py`` each (torch only);
* :mod:`nala_gen.sr.basicsr`: ``import nala_gen.sr.basicsr`` registers NaLaSR, ESRT and SRVGGNetCompactZeroInit in
  BasicSR's ``ARCH_REGISTRY`` and :class:`~nala_gen.sr.basicsr.model.UpscalerSRModel` in its ``MODEL_REGISTRY``;
  ``nala_gen.sr.train`` / ``nala_gen.sr.test`` are BasicSR's entry points with them;
* :mod:`nala_gen.sr.upscale`: the engine (tiles, memory budget, streaming), its inference graph, probes, resampling
  and image I/O;
* :mod:`nala_gen.sr.jobs`: resumable folder jobs, their manifests, sharding and video;
* :mod:`nala_gen.sr.data`: data preparation in BasicSR's layouts; :mod:`nala_gen.sr.interop`: spandrel and ONNX;
* :mod:`nala_gen.sr.loading`: networks from named weights, cards or BasicSR checkpoints.

Importing this package is cheap (no torch): it makes ``import basicsr`` work with current torchvision
(:mod:`nala_gen.sr.torchvision_alias`). The names below load on first use, so ``nala-sr --help`` does not import
torch.
"""

from __future__ import annotations

import importlib

from . import torchvision_alias

torchvision_alias.install()

# name -> module that defines it
_LAZY = {"ESRT": ".archs.esrt_arch", "NaLaSR": ".archs.nalasr_arch", "NALASR_SIZES": ".archs.nalasr_arch"}

__all__ = ["ESRT", "NALASR_SIZES", "SR_ARCHS", "NaLaSR"]


def __getattr__(name: str):
    if name == "SR_ARCHS":  # our archs by the names weight cards and BasicSR options use
        return {"ESRT": __getattr__("ESRT"), "NaLaSR": __getattr__("NaLaSR")}
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
