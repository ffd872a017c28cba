"""The docs' result tables, each declared beside the code that writes the JSON it reads.

A module that writes results under ``benchmarks/results/`` declares its tables as ``TABLES``, a tuple of
:class:`Table`: the file's name under ``docs/results/tables/`` (its slug), the result files it reads and a function
that renders it. ``scripts/results_tables.py`` renders the tables of every module in :data:`MODULES`.

A bench whose module imports torch at import declares its tables in a companion, ``<bench>_tables.py``, so that
rendering every table imports no torch. Tables of results that no bench writes (``nala-sr evaluate``'s and
``nala-gen quality``'s, the CUDA runs) and the README's headline, which reads several benches, are in
:mod:`nala_gen.bench.summary`.

This module imports nothing of ours, so every bench may import it.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

# The modules that declare tables, in the order the script prints them.
MODULES = (
    "nala_gen.bench.summary",
    "nala_gen.bench.attention_scaling_tables",
    "nala_gen.bench.step_timing",
    "nala_gen.bench.train_speed",
    "nala_gen.bench.dit_sizes",
    "nala_gen.bench.sr_scaling_tables",
    "nala_gen.bench.sr_sets",
    "nala_gen.bench.upscale_throughput",
    "nala_gen.bench.upscale_memory",
    "nala_gen.bench.upscale_folder",
    "nala_gen.bench.upscale_overhead",
    "nala_gen.bench.winograd_speed",
    "nala_gen.bench.cli",
    "nala_gen.bench.trained_entropy_tables",
    "nala_gen.bench.sr_ablation",
    "nala_gen.bench.dit_ablation_tables",
)


@dataclass(frozen=True)
class Table:
    """One generated table: its file under docs/results/tables/ (``slug``), the result files it reads and how to
    render it. ``sources`` are the declaring module's own results, ``reads`` other modules' results (the README's
    headline); ``optional``: the files may be absent, and the table then says so."""

    slug: str
    sources: tuple[str, ...]
    render: Callable[[], str]
    reads: tuple[str, ...] = ()
    optional: bool = False


def declared() -> dict[str, tuple[Table, ...]]:
    """Every declaring module's name and its tables (imported here, when the tables are wanted)."""
    return {name: importlib.import_module(name).TABLES for name in MODULES}


def load(file: str) -> dict:
    """A result file under benchmarks/results/."""
    return json.loads((RESULTS / file).read_text())


def captioned(slug: str, file: str, caption: Callable[[dict], str], body: Callable[[dict], str]) -> Table:
    """A table of one result file: ``caption(result)``, a blank line, ``body(result)``."""

    def render() -> str:
        result = load(file)
        return caption(result) + "\n\n" + body(result)

    return Table(slug, (file,), render)


def cores(machine: dict) -> str:
    """'2 cores' and, where the result file names it, the processor (older files do not)."""
    cpu = machine.get("cpu")
    return f"{machine['cpu_count']} cores" + (f" of an {cpu}" if cpu else "")


def row(*cells) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"
