"""What ships inside the package: the named weights (``weights/``), the sample image (``assets/``) and the
attention benchmarks the app plots (``results/``).

In the repository these are links to its top-level ``weights/``, ``assets/`` and ``benchmarks/results/``; a
wheel carries copies. Found through :mod:`importlib.resources`, so an installed package works from any directory;
the paths are resolved (in the repository: the real folders, not the links), so every caller sees one path.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped_weights() -> Path:
    """The folder of the weights that ship with the package."""
    return Path(str(files(__name__) / "weights")).resolve()


def sample_image() -> Path:
    """The bundled sample: a held-out photo's x4 bicubic LR (Chelsea the cat, scikit-image)."""
    return Path(str(files(__name__) / "assets" / "chelsea_lr_x4.png")).resolve()


def shipped_results() -> Path:
    """The folder of the committed benchmark results the app shows (attention and SR scaling)."""
    return Path(str(files(__name__) / "results")).resolve()
