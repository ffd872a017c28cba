"""What the benchmarks share: run stamps, result files, machine info and the latency/memory plot.

Fresh-process measurements go through :mod:`nala_gen.bench.worker`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def run_stamp() -> str:
    """When a benchmark run started, as its rows record it (``--keep-others`` mixes rows of several runs)."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def rows_not_rerun(previous: list[dict], rows: list[dict], key) -> list[dict]:
    """The rows of ``previous`` whose ``key(row)`` no new row has, each marked with its run ("earlier run" for
    rows from before runs were recorded)."""
    rerun = {key(r) for r in rows}
    return [{"run": "earlier run", **r} for r in previous if key(r) not in rerun]


def write_json(target: Path, result: dict, quiet: bool = False) -> None:
    """A bench's result file (its folder made), written whole; said on stdout unless ``quiet`` (a partial write of
    a long run)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=1))
    if not quiet:
        print(f"wrote {target}")


# The CPU flags that decide which kernels run (ours and oneDNN's), and the variables that cap them: a result says
# both, so that a figure from a CPU without AVX-512, or from a stand-in for one, is never read as another's.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "NALA_GEN_FUSED_ISA", "NALA_GEN_WINOGRAD_ISA", "NALA_GEN_WINOGRAD")


def machine_info(device: str) -> dict:
    """What a result file says about where it ran: CPU (model, its instruction-set flags and any variable that caps
    them), cores, torch, threads and, on CUDA, the GPU."""
    import torch

    from nala_gen.devices import cpu_flags, cpu_model

    info = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__}
    info["cpu_flags"] = [flag for flag in ISA_FLAGS if flag in cpu_flags()]
    info["isa_caps"] = {name: os.environ[name] for name in ISA_CAPS if os.environ.get(name)}
    info["threads"] = torch.get_num_threads()
    info["device"] = device
    if device != "cpu":
        info["device_name"] = torch.cuda.get_device_name(torch.device(device))
        info["memory"] = "torch.cuda.max_memory_allocated (tensors), CUDA-synchronised timings"
    return info


def plot_cost(rows: list[dict], series_key: str, path: Path, xlabel: str, title: str, latency_unit: str = "ms") -> None:
    """Log-log latency and peak-memory panels, one line per ``row[series_key]``. Rows that ran out of memory
    ("oom") get an x at the cap they hit (``limit_bytes``); rows skipped with a computed need (``needs_bytes``)
    an open triangle there, marked as computed, not measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = {"ms": 1e3, "s": 1.0}[latency_unit]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for name in dict.fromkeys(r[series_key] for r in rows):
        ok = [r for r in rows if r[series_key] == name and r["status"] == "ok"]
        if ok:
            tokens = [r["tokens"] for r in ok]
            axes[0].loglog(tokens, [r["latency_s"] * scale for r in ok], marker="o", label=name)
            axes[1].loglog(tokens, [max(r["peak_extra_bytes"], 2**20) / 2**20 for r in ok], marker="o", label=name)
        for r in rows:
            if r[series_key] == name and r["status"] == "oom":
                axes[1].scatter([r["tokens"]], [r["limit_bytes"] / 2**20], marker="x", color="red", zorder=3)
            if r[series_key] == name and "needs_bytes" in r:
                axes[1].scatter(
                    [r["tokens"]],
                    [r["needs_bytes"] / 2**20],
                    marker="^",
                    facecolors="none",
                    edgecolors="gray",
                    zorder=3,
                )
    axes[0].set_ylabel(f"median latency ({latency_unit})")
    axes[1].set_ylabel("peak extra memory (MiB, RSS)")
    axes[1].set_title("x: out of memory at the cap; open triangle: needed (computed)", fontsize=8)
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_cost_results(
    out: Path, stem: str, result: dict, series_key: str, xlabel: str, title: str, latency_unit: str = "ms"
) -> None:
    """``out/STEM.json`` (the whole result) and ``out/STEM.png`` (:func:`plot_cost` of its rows)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    plot_cost(result["rows"], series_key, out / f"{stem}.png", xlabel, title, latency_unit)
    print(f"wrote {out / stem}.json and .png")
