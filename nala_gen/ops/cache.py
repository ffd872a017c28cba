"""Per-machine caches of what the kernels measured: where they live and what identifies the code they measured.

Two caches keep readings across processes, each under a key that must change whenever the readings could: the
auto-tile memory probes (:mod:`nala_gen.sr.upscale.probe_cache`) and the per-machine choice of each convolution's
kernel (:mod:`nala_gen.sr.archs.fast.conv_choice`). Both hash the source files of the code that ran
(:func:`source_digest`: a changed line is a new key, without a version bump for every commit) and keep their file
in the user's cache folder (:func:`cache_file`). Here, below both, so that neither imports the other.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SOURCE_SUFFIXES = (".py", ".cpp", ".inc", ".h")
_OFF = ("off", "0", "none")


def source_digest(folders: list[Path]) -> str:
    """The hash of every source file (``SOURCE_SUFFIXES``) under ``folders``, by path relative to its folder."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
            digest.update(f"{path.relative_to(folder)}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_file(variable: str, name: str) -> Path | None:
    """A cache's file: the one the environment variable ``variable`` names, None where it says ``off`` (or ``0``,
    ``none``), else ``name`` in ``$XDG_CACHE_HOME/nala_gen/`` (``~/.cache/nala_gen/``); None without a home folder."""
    chosen = os.environ.get(variable, "")
    if chosen.lower() in _OFF:
        return None
    if chosen:
        return Path(chosen)
    try:
        cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:  # no home folder (some containers)
        return None
    return Path(cache_home) / "nala_gen" / name
