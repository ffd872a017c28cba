"""NaLaSR and ESRT in BasicSR's ``ARCH_REGISTRY``: importing this module registers them (once).

The archs themselves need torch only, so the upscaler, the app and other loaders (spandrel, ONNX) never import
BasicSR or torchvision; the BasicSR entry points (``nala_gen.sr.train`` / ``nala_gen.sr.test``) and code that builds
BasicSR's own archs import this module first. BasicSR-style ``@ARCH_REGISTRY.register()`` at class definition would
tie every import of the archs to BasicSR.
"""

from . import _compat  # noqa: F401  (must run before anything imports basicsr)

# isort: split
from basicsr.utils.registry import ARCH_REGISTRY

from .esrt_arch import ESRT
from .nalasr_arch import NaLaSR

for _arch in (ESRT, NaLaSR):
    if _arch.__name__ not in ARCH_REGISTRY:  # BasicSR raises on a second registration
        ARCH_REGISTRY.register(_arch)
