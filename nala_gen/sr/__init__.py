"""NaLaSR and ESRT for BasicSR. Importing this package registers both archs in ``ARCH_REGISTRY``."""

from . import _compat  # noqa: F401  (must run before anything imports basicsr)
from .esrt_arch import ESRT  # noqa: E402
from .nalasr_arch import NALASR_SIZES, NaLaSR  # noqa: E402

__all__ = ["ESRT", "NALASR_SIZES", "NaLaSR"]
