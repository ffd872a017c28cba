"""NaLaSR, ESRT and SRVGGNetCompactZeroInit in BasicSR's ``ARCH_REGISTRY``, and
:class:`~nala_gen.sr.basicsr_model.UpscalerSRModel` in its ``MODEL_REGISTRY``: importing this module registers
them (once).

NaLaSR's and ESRT's archs need torch only (SRVGGNetCompactZeroInit is BasicSR's own arch, re-initialised), so
the upscaler, the app and other loaders (spandrel, ONNX) never import
BasicSR or torchvision; the BasicSR entry points (``nala_gen.sr.train`` / ``nala_gen.sr.test``) and code that builds
BasicSR's own archs import this module first. BasicSR-style ``@ARCH_REGISTRY.register()`` at class definition would
tie every import of the archs to BasicSR.
"""

from . import _compat  # noqa: F401  (must run before anything imports basicsr)

# isort: split
from basicsr.utils.registry import ARCH_REGISTRY, MODEL_REGISTRY

from .basicsr_model import UpscalerSRModel
from .esrt_arch import ESRT
from .nalasr_arch import NaLaSR
from .srvgg_zero_init_arch import SRVGGNetCompactZeroInit

for _registry, _classes in (
    (ARCH_REGISTRY, (ESRT, NaLaSR, SRVGGNetCompactZeroInit)),
    (MODEL_REGISTRY, (UpscalerSRModel,)),
):
    for _cls in _classes:
        if _cls.__name__ not in _registry:  # BasicSR raises on a second registration
            _registry.register(_cls)
