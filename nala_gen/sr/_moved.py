"""The modules of ``nala_gen.sr`` that moved when the package was laid out by job (archs, basicsr, upscale, jobs,
data, interop): importing an old path still works for one release, with a DeprecationWarning naming the new one.

The old name is bound to the new module itself (not a copy), so ``monkeypatch.setattr`` on either path patches both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

# old module -> new module
MOVED = {
    "nala_gen.sr.esrt_arch": "nala_gen.sr.archs.esrt_arch",
    "nala_gen.sr.nalasr_arch": "nala_gen.sr.archs.nalasr_arch",
    "nala_gen.sr.srvgg_zero_init_arch": "nala_gen.sr.archs.srvgg_zero_init_arch",
    "nala_gen.sr.peers": "nala_gen.bench.peers",
    # the peer board's registry (other networks to compare against) belongs to the benchmarks
    "nala_gen.sr.archs.peers": "nala_gen.bench.peers",
    "nala_gen.sr._compat": "nala_gen.sr.basicsr",
    "nala_gen.sr.basicsr_registry": "nala_gen.sr.basicsr",
    "nala_gen.sr.basicsr_model": "nala_gen.sr.basicsr.model",
    "nala_gen.sr.upscaler": "nala_gen.sr.upscale.engine",
    # the networks own their fast inference form, one module per job in a package beside them
    "nala_gen.sr.inference_graph": "nala_gen.sr.archs.fast",
    "nala_gen.sr.upscale.inference_graph": "nala_gen.sr.archs.fast",
    "nala_gen.sr.archs.inference_graph": "nala_gen.sr.archs.fast",
    # the CPU kernels live in one package below attention and sr
    "nala_gen.sr.archs.winograd": "nala_gen.ops.winograd",
    "nala_gen.sr.probe_cache": "nala_gen.sr.upscale.probe_cache",
    "nala_gen.sr.resample": "nala_gen.sr.upscale.resample",
    "nala_gen.sr.imageio": "nala_gen.sr.upscale.imageio",
    "nala_gen.sr.folder_job": "nala_gen.sr.jobs.folder",
    "nala_gen.sr.video": "nala_gen.sr.jobs.video",
    "nala_gen.sr.photos": "nala_gen.sr.data.photos",
    "nala_gen.sr.spandrel_support": "nala_gen.sr.interop.spandrel_support",
    "nala_gen.sr.onnx_export": "nala_gen.sr.interop.onnx_export",
    "nala_gen.sr.models": "nala_gen.sr.loading",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves the old paths in :data:`MOVED` to their new modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        pass  # executed under its new name


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
