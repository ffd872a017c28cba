"""Which kernel runs each convolution of the fast form: the one that timed fastest on this machine.

Why: the Winograd and 1x1 kernels (:mod:`nala_gen.ops.winograd`) were tuned on one microarchitecture, and on
another oneDNN's direct convolution, which is tuned for many, or the other Winograd tile can be the faster one for
some shapes (issue 58: each kernel faster per shape on an Intel Xeon, the whole network hardly). Which one wins
depends on the CPU, on torch (its oneDNN) and on the kernels' code, so it is measured where the network runs, as
cuDNN's benchmark mode does, and remembered.

For each convolution shape the fast form runs (kernel size, input and output channels, and a coarse size class of
the map, :func:`size_class`), the first call times every kernel that applies (:func:`candidates`: Winograd
F(4x4, 3x3) and F(2x2, 3x3), the 1x1 kernel, each in every instruction set the CPU and the options allow, and
``F.conv2d``) on a random map of the class's size: a warm-up call, then up to ``REPEATS`` timed ones within
``BUDGET_S`` seconds each, their median. The fastest is kept in a JSON file in the user's cache folder
(``$XDG_CACHE_HOME/nala_gen/conv_choice.json``; ``NALA_GEN_CONV_CACHE`` names another file, or ``off`` to keep
choices for the process only), under a key of the CPU model and flags, the torch version, the threads, the runtime
options and a hash of the kernels' and this package's sources (:func:`machine`), so a new CPU, torch, option or
kernel edit times again and later runs read the file instead. Each entry records the probe's times and its own
duration. A corrupt or unreadable file is ignored and rewritten (atomically: :func:`nala_gen.fileio.write_atomic`).

All maps of the fast form are channels-last (the graph moves its input there once), so the layout is not among
the choices. Nothing is timed where only the direct convolution may run (tracing, ONNX export, ``torch.compile``,
autograd, autocast, a dispatch mode: :func:`nala_gen.ops.winograd.algorithms`), and nothing with
``RuntimeOptions.conv_choice == "static"`` (``NALA_GEN_CONV_CHOICE=static``, what the test suite runs), which
keeps the fixed rule: every output then depends on the options alone, never on a timing.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import threading
import time
from functools import cache
from pathlib import Path

import torch
from torch import nn

from nala_gen.devices import cpu_flags, cpu_model
from nala_gen.ops import winograd
from nala_gen.ops.cache import cache_file, source_digest
from nala_gen.ops.options import RuntimeOptions, runtime_options

Tensor = torch.Tensor
CACHE_ENV = "NALA_GEN_CONV_CACHE"
# (name, pixels (batch x height x width) below which a map is of the class, side of the square map it is timed on)
SIZE_CLASSES = (("small", 48 * 48, 32), ("medium", 160 * 160, 96), ("large", None, 192))
REPEATS = 3  # timed calls per kernel after the warm-up; their median is its time
BUDGET_S = 0.05  # no further timed call of a kernel once its timed calls took this long (at least one is made)
MAX_MACHINES = 16  # keys kept in the file, the most recently stored

_lock = threading.RLock()  # one probe at a time; the table and the file are read and written under it
_tables: dict[str, dict[str, dict]] = {}  # machine key -> shape key -> entry, as read from the file and probed
_keys: dict[tuple, tuple[str, dict]] = {}  # what a call's key is made of -> (key, description): one hash per setup


def size_class(x: Tensor) -> str:
    """The class of a map's size: what decides which kernel is fastest is how much of it fits the caches, so a
    few classes by pixel count (batch included) stand for all sizes."""
    pixels = x.shape[0] * x.shape[-2] * x.shape[-1]
    return next(name for name, below, _ in SIZE_CLASSES if below is None or pixels < below)


def shape_key(x: Tensor, weight: Tensor) -> str:
    """``"3x3 32>160 medium"``: kernel size, input > output channels, size class."""
    k = weight.shape[-1]
    return f"{k}x{k} {weight.shape[1]}>{weight.shape[0]} {size_class(x)}"


@cache
def _sources() -> str:
    """The hash of the kernels' sources (Python and C++) and of this package (which kernels it asks about)."""
    return source_digest([Path(winograd.__file__).parent, Path(__file__).parent])


@cache
def _cpu() -> tuple[str, tuple[str, ...]]:
    return cpu_model(), tuple(sorted(cpu_flags()))


def machine(runtime: RuntimeOptions) -> tuple[str, dict]:
    """What the timings depend on, and its hash: the CPU (model and flags), torch, the threads, the options and the
    code. Read on every call (a process may change its threads or options), hashed once per distinct value."""
    ident = (runtime, torch.__version__, torch.get_num_threads(), _sources())
    known = _keys.get(ident)
    if known is None:
        model, flags = _cpu()
        described = {
            "cpu": model,
            "cpu_flags": list(flags),
            "torch": ident[1],
            "threads": ident[2],
            "options": runtime.as_dict(),
            "sources": ident[3],
        }
        known = _keys[ident] = (hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest(), described)
    return known


def candidates(x: Tensor, weight: Tensor, runtime: RuntimeOptions) -> list[str]:
    """The kernels that may run this convolution here, as ``algorithm`` or ``algorithm/isa`` (each instruction set
    the options allow); ``direct`` last."""
    isas = winograd.instruction_sets(runtime)
    found = []
    for algorithm in winograd.algorithms(x, weight, runtime):
        found += [algorithm] if algorithm == winograd.DIRECT else [f"{algorithm}/{isa}" for isa in isas]
    return found


def _split(candidate: str) -> tuple[str, str | None]:
    algorithm, _, isa = candidate.partition("/")
    return algorithm, isa or None


def _run(candidate: str, x: Tensor, weight: Tensor, bias: Tensor, packed: Tensor | None, runtime: RuntimeOptions):
    algorithm, isa = _split(candidate)
    if weight.shape[-1] == 1:
        return winograd.conv1x1(x, weight, bias, runtime, algorithm=algorithm, isa=isa)
    return winograd.conv3x3(x, weight, bias, packed, runtime, algorithm=algorithm, isa=isa)


def _timed(call) -> float:
    """The median of up to REPEATS timed calls after a warm-up, fewer where they pass BUDGET_S."""
    call()
    times: list[float] = []
    while len(times) < REPEATS and sum(times) < BUDGET_S:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _probe(x: Tensor, weight: Tensor, runtime: RuntimeOptions) -> dict:
    """Time every candidate on a random map of ``x``'s size class with ``weight``'s shape -> the cache entry:
    ``{"choice", "seconds": {candidate: median}, "probe_seconds", "probed_at"}``."""
    started = time.perf_counter()
    side = next(side for name, _, side in SIZE_CLASSES if name == size_class(x))
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        sample = torch.randn(1, weight.shape[1], side, side, generator=gen).contiguous(
            memory_format=torch.channels_last
        )
        w = torch.randn(tuple(weight.shape), generator=gen) / weight[0].numel() ** 0.5
        bias = torch.randn(weight.shape[0], generator=gen)
        seconds = {}
        for candidate in candidates(sample, w, runtime):
            algorithm, _ = _split(candidate)
            packed = (
                winograd.pack(w, algorithm) if algorithm in (winograd.WINOGRAD_4X4, winograd.WINOGRAD_2X2) else None
            )
            seconds[candidate] = _timed(lambda c=candidate, p=packed: _run(c, sample, w, bias, p, runtime))
    return {
        "choice": min(seconds, key=seconds.get),
        "seconds": seconds,
        "probe_seconds": time.perf_counter() - started,
        "probed_at": time.time(),
    }


def _read(path: Path | None) -> dict:
    """The file's machines, or nothing where it is missing, unreadable or not this cache's JSON."""
    if path is None:
        return {}
    try:
        machines = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return machines if isinstance(machines, dict) else {}


def _entries(machine_entry) -> dict:
    shapes = machine_entry.get("shapes") if isinstance(machine_entry, dict) else None
    return (
        {k: v for k, v in shapes.items() if isinstance(v, dict) and "choice" in v} if isinstance(shapes, dict) else {}
    )


def _store(path: Path | None, key: str, described: dict, table: dict) -> None:
    """Keep ``table`` under ``key`` in the file, with what other machine keys it holds (the most recent
    MAX_MACHINES); a failure to write costs nothing but the next process's probe."""
    from nala_gen.fileio import write_atomic

    if path is None:
        return
    machines = _read(path)
    machines[key] = {"machine": described, "stored": time.time(), "shapes": table}

    def stored(item) -> float:
        value = item[1].get("stored", 0) if isinstance(item[1], dict) else 0
        return float(value) if isinstance(value, (int, float)) else 0.0

    newest = dict(sorted(machines.items(), key=stored)[-MAX_MACHINES:])
    try:
        write_atomic(path, (json.dumps(newest, indent=1, sort_keys=True) + "\n").encode())
    except OSError:
        pass


def forget() -> None:
    """Drop the choices held in this process (the file stays): the next call reads the file again."""
    with _lock:
        _tables.clear()
        _keys.clear()


def choose(x: Tensor, weight: Tensor, runtime: RuntimeOptions | None = None) -> tuple[str, str | None] | None:
    """``(algorithm, isa)`` for this convolution on this machine, timing the shape's kernels first where no choice
    is kept for it; None where the fixed rule runs it (``conv_choice`` static, or only the direct convolution may
    run, as under tracing or autograd)."""
    options = runtime or runtime_options()
    if options.conv_choice != "probe":
        return None
    if len(winograd.algorithms(x, weight, options)) < 2:
        return None
    shape = shape_key(x, weight)
    with _lock:
        key, described = machine(options)
        path = cache_file(CACHE_ENV, "conv_choice.json")
        table = _tables.get(key)
        if table is None:
            table = _tables[key] = _entries(_read(path).get(key))
        entry = table.get(shape)
        if entry is None or entry["choice"] not in candidates(x, weight, options):
            entry = table[shape] = _probe(x, weight, options)
            _store(path, key, described, table)
    return _split(entry["choice"])


def conv3x3(x: Tensor, weight: Tensor, bias: Tensor | None = None, packed: Tensor | None = None) -> Tensor:
    """:func:`nala_gen.ops.winograd.conv3x3` by the kernel :func:`choose` picks."""
    algorithm, isa = choose(x, weight) or (None, None)
    return winograd.conv3x3(x, weight, bias, packed, algorithm=algorithm, isa=isa)


def conv1x1(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """:func:`nala_gen.ops.winograd.conv1x1` by the kernel :func:`choose` picks."""
    algorithm, isa = choose(x, weight) or (None, None)
    return winograd.conv1x1(x, weight, bias, algorithm=algorithm, isa=isa)


def layer(conv: nn.Module) -> nn.Module:
    """:func:`nala_gen.ops.winograd.winograd_layer` run by :func:`conv3x3`."""
    return winograd.winograd_layer(conv, conv3x3)
