"""NaLaSR, ESRT and SRVGGNetCompactZeroInit in BasicSR's ``ARCH_REGISTRY``, and
:class:`~nala_gen.sr.basicsr.model.UpscalerSRModel` in its ``MODEL_REGISTRY``: importing this module registers
them (once); :mod:`nala_gen.sr.basicsr` imports it.

NaLaSR's and ESRT's archs need torch only (SRVGGNetCompactZeroInit is BasicSR's own arch, re-initialised), so
the upscaler, the app and other loaders (spandrel, ONNX) never import BasicSR or torchvision; the BasicSR entry
points (``nala_gen.sr.train`` / ``nala_gen.sr.test``) and code that builds BasicSR's own archs import
:mod:`nala_gen.sr.basicsr` first. BasicSR-style ``@ARCH_REGISTRY.register()`` at class definition would
tie every import of the archs to BasicSR.
"""

from basicsr.utils.registry import ARCH_REGISTRY, MODEL_REGISTRY

from ..archs.esrt_arch import ESRT
from ..archs.nalasr_arch import NaLaSR
from ..archs.srvgg_zero_init_arch import SRVGGNetCompactZeroInit
from .model import UpscalerSRModel

for _registry, _classes in (
    (ARCH_REGISTRY, (ESRT, NaLaSR, SRVGGNetCompactZeroInit)),
    (MODEL_REGISTRY, (UpscalerSRModel,)),
):
    for _cls in _classes:
        if _cls.__name__ not in _registry:  # BasicSR raises on a second registration
            _registry.register(_cls)
