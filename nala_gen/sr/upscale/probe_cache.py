"""The auto-tile probes' readings, kept across processes.

``tile="auto"`` measures a network's memory at three small sizes before its first job (see
:meth:`nala_gen.sr.upscale.engine.Upscaler._probes`): well under a second, but every ``nala-sr upscale`` of one image
paid it again. The readings depend on what the network is (its layers, shapes and options), not on its weight
values, and on where it runs (device, precision, threads, CPU, torch, this package, which CPU kernels run: the
runtime options and the kernels' and the networks' sources), so they are kept under a key made of exactly those,
in ``$XDG_CACHE_HOME/nala_gen/probes.json`` (``~/.cache/...`` by default; ``NALA_GEN_PROBE_CACHE`` names another
file, or ``off``).

A cache must never cost a job: an unreadable, corrupt or unwritable file is ignored (the network is probed as
without it), a write is atomic, and the file keeps only the ``MAX_ENTRIES`` most recent networks.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from nala_gen.devices import cpu_model
from nala_gen.ops import nala_fused, runtime_options, winograd
from nala_gen.ops.cache import cache_file, source_digest

CACHE_ENV = "NALA_GEN_PROBE_CACHE"
MAX_ENTRIES = 64


def cache_path() -> Path | None:
    """The cache file, or None when ``NALA_GEN_PROBE_CACHE`` is ``off`` (or ``0``) or there is no home folder."""
    return cache_file(CACHE_ENV, "probes.json")


# The packages whose code runs a pass: the CPU kernels (Python and C++), the attention, the networks and their fast
# form. Every source file under them is hashed, so a changed line in any of them is a new key (the package's
# version is not bumped for every commit) and a new module needs no entry here.
_PASS_PACKAGES = ("ops", "attention", "sr/archs")  # under nala_gen/ (hashed by nala_gen.ops.cache.source_digest)


def _code_digest() -> str:
    package = Path(__file__).resolve().parents[2]
    return source_digest([package / name for name in _PASS_PACKAGES])


def runtime_described() -> dict:
    """Which CPU kernels run a pass here: the options in force and what of them this build and CPU can run (a build
    without the fused op runs the attention's PyTorch path whatever the options say)."""
    return {
        "options": runtime_options().as_dict(),
        "fused": nala_fused.instruction_set() if nala_fused.enabled() else None,
        "winograd": winograd.enabled(),
    }


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
        "runtime": runtime_described(),
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
