"""Make basicsr 1.4.2 importable with current torchvision: the one place the alias is made.

basicsr 1.4.2 (the PyPI release) imports ``torchvision.transforms.functional_tensor``, a module torchvision
removed in 0.17; the function it needs (``rgb_to_grayscale``) lives in ``torchvision.transforms.functional``.
``import nala_gen.sr`` installs :class:`FunctionalTensorAlias` on ``sys.meta_path``; it imports nothing itself
and acts only when something (basicsr) imports the removed module, so ``nala-sr --help`` and the torch-only
upscaler never load torchvision, and a BasicSR user's own ``import basicsr`` after ``import nala_gen.sr`` works.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

REMOVED = "torchvision.transforms.functional_tensor"
REPLACEMENT = "torchvision.transforms.functional"


class FunctionalTensorAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``REMOVED`` only; its module is ``REPLACEMENT``'s (the same object, so patches apply to both)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != REMOVED:
            return None
        try:  # a torchvision that still ships the module needs no alias
            if importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
                return None
        except ImportError:
            pass
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(REPLACEMENT)

    def exec_module(self, module) -> None:
        pass  # already executed as REPLACEMENT


def install() -> None:
    """Put the alias on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, FunctionalTensorAlias) for finder in sys.meta_path):
        sys.meta_path.insert(0, FunctionalTensorAlias())
