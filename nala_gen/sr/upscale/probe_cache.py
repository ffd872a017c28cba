"""The auto-tile probes' readings, kept across processes.

``tile="auto"`` measures a network's memory at three small sizes before its first job (see
:meth:`nala_gen.sr.upscale.engine.Upscaler._probes`): well under a second, but every ``nala-sr upscale`` of one image
paid it again. The readings depend on what the network is (its layers, shapes and options), not on its weight
values, and on where it runs (device, precision, threads, CPU, torch, this package, the fused NaLa op on or
off), so they are kept under a key made of exactly those, in ``$XDG_CACHE_HOME/nala_gen/probes.json``
(``~/.cache/...`` by default; ``NALA_GEN_PROBE_CACHE`` names another file, or ``off``).

A cache must never cost a job: an unreadable, corrupt or unwritable file is ignored (the network is probed as
without it), a write is atomic, and the file keeps only the ``MAX_ENTRIES`` most recent networks.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from nala_gen.attention import fused
from nala_gen.devices import cpu_model

CACHE_ENV = "NALA_GEN_PROBE_CACHE"
MAX_ENTRIES = 64


def cache_path() -> Path | None:
    """The cache file, or None when ``NALA_GEN_PROBE_CACHE`` is ``off`` (or ``0``) or there is no home folder."""
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen.lower() in ("off", "0", "none"):
        return None
    if chosen:
        return Path(chosen)
    try:
        cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:  # no home folder (some containers)
        return None
    return Path(cache_home) / "nala_gen" / "probes.json"


# The modules whose code decides a pass's memory: a changed line in any of them is a new key (the package's
# version is not bumped for every commit).
_PASS_SOURCES = ("nala_gen.sr.archs.esrt_arch", "nala_gen.sr.archs.esrt_layers", "nala_gen.sr.archs.nalasr_arch",
                 "nala_gen.sr.archs.fast.graph", "nala_gen.sr.archs.fast.body", "nala_gen.sr.archs.fast.transformer",
                 "nala_gen.sr.archs.fast.upsampler", "nala_gen.attention.inference", "nala_gen.attention.modules",
                 "nala_gen.attention.functional", "nala_gen.attention.fused", "nala_gen.attention.kernels")  # fmt: skip


def _code_digest() -> str:
    import importlib.util

    digest = hashlib.sha256()
    for name in _PASS_SOURCES:
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and os.path.isfile(spec.origin):
            digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()


def network_key(network: torch.nn.Module, device: torch.device, precision: str, sides: tuple[int, ...]) -> str:
    """What a pass's memory depends on, hashed: the network's structure (its printed modules, its config when it
    has one, every parameter's and buffer's name, shape and dtype; not their values), the probed sides and
    where it runs."""
    tensors = [(n, tuple(t.shape), str(t.dtype)) for n, t in (*network.named_parameters(), *network.named_buffers())]
    described = {
        "type": f"{type(network).__module__}.{type(network).__qualname__}",
        "config": getattr(network, "_hub_mixin_config", None),
        "modules": repr(network),
        "tensors": tensors,
        "sides": list(sides),
        "device": str(device),
        "precision": precision,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "nala_gen": _package_version(),
        "code": _code_digest(),
        # whether the fused NaLa op runs (not just whether it is asked for: a build without it runs eager)
        "fused": (fused.enabled(), fused.instruction_set()),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nala_gen")
    except PackageNotFoundError:
        return "unknown"


def _entries(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def load(key: str, count: int) -> list[int] | None:
    """The ``count`` peak readings stored under ``key``, or None (nothing stored, or not in the expected form)."""
    try:
        return _load(key, count)
    except Exception:  # noqa: BLE001  (never cost a job)
        return None


def _load(key: str, count: int) -> list[int] | None:
    path = cache_path()
    if path is None:
        return None
    peaks = _entries(path).get(key, {})
    peaks = peaks.get("peaks") if isinstance(peaks, dict) else None
    if isinstance(peaks, list) and len(peaks) == count and all(isinstance(p, int) and p > 0 for p in peaks):
        return peaks
    return None


def _stored_at(entry) -> float:
    try:
        return float(entry.get("stored", 0))
    except (AttributeError, TypeError, ValueError):
        return 0.0


def store(key: str, peaks: list[int]) -> None:
    """Keep ``peaks`` under ``key`` (the oldest entries beyond MAX_ENTRIES go); any failure is ignored."""
    from nala_gen.fileio import write_atomic

    try:
        path = cache_path()
    except Exception:  # noqa: BLE001  (never cost a job)
        return
    if path is None:
        return
    entries = _entries(path)
    entries[key] = {"peaks": peaks, "stored": time.time()}
    newest = sorted(entries.items(), key=lambda kv: _stored_at(kv[1]))
    try:
        write_atomic(path, (json.dumps(dict(newest[-MAX_ENTRIES:]), indent=1) + "\n").encode())
    except OSError:
        pass
