"""Build the package's two CPU ops with it; metadata lives in setup.cfg.

* the fused NaLa op (``nala_gen.ops._nala_fused``), the attention;
* the Winograd 3x3 and 1x1 convolutions (``nala_gen.ops._winograd``) of the SR networks' inference graph, for
  AVX-512F and for AVX2 with FMA (one source, ``winograd_kernels.inc``, compiled for each; chosen at run time).

Their sources are ``nala_gen/ops/csrc/``.

Both are optional: without PyTorch at build time (an isolated build) or without a working C++ compiler the
package installs as pure Python, ``linear_attention`` uses its PyTorch path (``nala_gen.ops.nala_fused`` says
why) and the graph PyTorch's convolutions. Build against the torch you run: ``pip install --no-build-isolation -e .``
(the Makefile does).
"""

import sys

from setuptools import setup

ext_modules, cmdclass = [], {}
try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    print("nala_gen: PyTorch not importable at build time; the CPU ops are not built", file=sys.stderr)
else:

    class OptionalBuildExtension(BuildExtension):
        """A failed compile leaves the package usable (PyTorch fallback) instead of failing the install."""

        failed: set[str] = set()

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as error:  # noqa: BLE001 - any compiler failure means: install without the op
                self.failed.add(ext.name)
                print(f"nala_gen: {ext.name} was not built ({error}); using the PyTorch path", file=sys.stderr)

        def copy_extensions_to_source(self):
            built = [ext for ext in self.extensions if ext.name not in self.failed]
            self.extensions, everything = built, self.extensions
            try:
                super().copy_extensions_to_source()
            finally:
                self.extensions = everything

        def get_outputs(self):
            return [path for ext, path in zip(self.extensions, super().get_outputs()) if ext.name not in self.failed]

    # -O3 for the vector loops, no debug info (-g0, -s: 11 MB of it otherwise); no errno/trap bookkeeping in math;
    # OpenMP for ATen's parallel_for (the process shares torch's libgomp: same soname).
    flags = {
        "extra_compile_args": ["-O3", "-g0", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi"],
        "extra_link_args": ["-fopenmp", "-s"],
    }
    ext_modules = [
        CppExtension(
            "nala_gen.ops._nala_fused",
            ["nala_gen/ops/csrc/nala_fused.cpp"],
            depends=["nala_gen/ops/csrc/nala_tiles.inc", "nala_gen/ops/csrc/nala_soa.inc"],
            **flags,
        ),
        CppExtension(
            "nala_gen.ops._winograd",
            ["nala_gen/ops/csrc/winograd.cpp"],
            depends=["nala_gen/ops/csrc/winograd_kernels.inc"],
            **flags,
        ),
    ]
    cmdclass = {"build_ext": OptionalBuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
