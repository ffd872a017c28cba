"""The package's CPU kernels, below everything that uses them (it imports neither ``attention`` nor ``sr``).

* :mod:`~nala_gen.ops.nala_fused`: the fused NaLa op (C++, ``csrc/nala_fused.cpp``) and its autograd;
* :mod:`~nala_gen.ops.winograd`: the Winograd 3x3 and the 1x1 convolutions of the SR inference graph
  (``csrc/winograd.cpp``);
* :mod:`~nala_gen.ops.options`: which of them run (:class:`RuntimeOptions`, read from ``NALA_GEN_*`` once);
* :func:`tracing`: whether a tracer is running, when every kernel steps aside for PyTorch's ops.

Both extensions are built by ``setup.py`` (``pip install --no-build-isolation .``, ``make install``); without them
the package runs PyTorch's ops and each module's ``unavailable_reason()`` says why.
"""

from .options import RuntimeOptions, runtime_options, using
from .tracing import tracing

__all__ = ["RuntimeOptions", "runtime_options", "tracing", "using"]
