"""What the seeded ablations share (``nala-bench sr-ablation``, ``nala-bench dit-ablation``): a lock per run, so
several invocations can train side by side; a ledger row written whole or not at all; and the statistics over
seeds (mean, sample standard deviation, the difference from a reference variant and its standard error)."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Busy(Exception):
    """The run is being trained by another live process."""


def _take(path: Path) -> None:
    """Take ``path`` as this process's lock, or raise :class:`Busy` when a live process holds it (a lock left by a
    process that is gone is taken over)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(path.read_text() or 0)
                os.kill(pid, 0)
            except (ValueError, ProcessLookupError, FileNotFoundError):
                path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            except PermissionError:
                pass  # alive, someone else's
            raise Busy(path.stem) from None
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return
    raise Busy(path.stem)


@contextmanager
def run_lock(path: Path) -> Iterator[None]:
    """``with run_lock(experiments / f"{run}.lock"):`` train the run; raises :class:`Busy` if another live
    process holds it."""
    _take(path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def write_row(path: Path, row: dict) -> None:
    """Put a finished run's row in the ledger: whole or not at all."""
    from nala_gen.fileio import write_atomic  # a temporary file of its own, then a rename

    write_atomic(path, (json.dumps(row, indent=1) + "\n").encode())


def seed_statistics(
    rows: list[dict], metrics: tuple[str, ...], reference: str, order: list[str], keys=("network_g",)
) -> list[dict]:
    """Per variant (``row["variant"]``): its seeds, and the mean and sample standard deviation of each metric
    over the rows that have it (``<metric>_n`` of them; None for one: no spread is made up); against
    ``reference``, for each metric the difference of means
    (``<metric>_vs_reference``) with its standard error (``_se``) and whether it exceeds two of them
    (``<metric>_beyond_two_se``). Sorted as ``order`` lists the variants; ``keys`` are copied from a variant's
    first row."""
    by_variant: dict[str, list[dict]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    stats = {}
    for variant, runs in by_variant.items():
        entry = {"variant": variant, **{k: runs[0].get(k) for k in keys}}
        entry["seeds"] = sorted(r.get("seed", 0) for r in runs)
        for metric in metrics:
            values = [r[metric] for r in runs if r.get(metric) is not None]  # rows scored before a metric existed
            entry[metric] = statistics.fmean(values) if values else None
            entry[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else None
            entry[f"{metric}_n"] = len(values)
        stats[variant] = entry
    ref = stats.get(reference)
    for entry in stats.values():
        for metric in metrics:
            if ref is None or entry is ref or entry[f"{metric}_std"] is None or ref[f"{metric}_std"] is None:
                continue
            n, n_ref = entry[f"{metric}_n"], ref[f"{metric}_n"]
            se = math.sqrt(entry[f"{metric}_std"] ** 2 / n + ref[f"{metric}_std"] ** 2 / n_ref)
            difference = entry[metric] - ref[metric]
            entry[f"{metric}_vs_reference"] = difference
            entry[f"{metric}_vs_reference_se"] = se
            entry[f"{metric}_beyond_two_se"] = se > 0 and abs(difference) > 2 * se  # no spread: no verdict
    return sorted(stats.values(), key=lambda e: order.index(e["variant"]) if e["variant"] in order else len(order))
