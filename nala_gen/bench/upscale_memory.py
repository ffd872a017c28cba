"""Does ``nala-sr upscale --memory-budget-mb`` hold for the whole process? Peak RSS of real jobs against the budget.

Each point is a fresh ``nala-sr upscale`` process on a made PNG (the bundled sample resized, bicubic, to a
square side), x4, with ``--memory-budget-mb``. Its peak resident memory is read by the parent from the child's
own accounting (``wait4``'s ``ru_maxrss``: everything the process ever held, libraries, model, input, probes and
encoder included). The fixed cost is the same measurement for a job of a 32 x 32 input in one pass: what the
process holds with the libraries and the model loaded. The check: peak <= budget + fixed cost.

    nala-bench upscale-memory [--sides 1500 3000] [--budget-mb 512] [--model nalasr-light-x4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nala_gen.bench.common import machine_info
from nala_gen.bench.tables import Table, load, row
from nala_gen.bench.upscale_throughput import sample_input

SIDES = (1500, 3000)


def stand_in_network(scale: int = 4):
    """A cheap stand-in SR network (one 3x3 convolution, a pixel shuffle, a sigmoid; seeded random weights), for
    measuring the upscale job's own memory where a real network would take too long (tests, 6000^2 inputs)."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 3 * scale**2, 3, padding=1), torch.nn.PixelShuffle(scale), torch.nn.Sigmoid()
    )


def run_job(args: list[str], timeout: float) -> dict:
    """``nala-sr upscale *args --json`` in a fresh process -> its JSON record, wall time and peak RSS."""
    cmd = [sys.executable, "-m", "nala_gen.sr.cli", "upscale", *args, "--json", "-q"]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        lines, errors = out.read().strip().splitlines(), err.read().strip().splitlines()
    record = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 and record.get("status") != "error":
        record = {"status": "failed", "error": errors[-1] if errors else f"exit {proc.returncode}"}
    record["wall_s"] = time.perf_counter() - start
    record["process_peak_rss_bytes"] = usage.ru_maxrss * 1024  # KiB on Linux
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench upscale-memory", description=__doc__.split("\n")[0])
    parser.add_argument("--sides", nargs="+", type=int, default=list(SIDES), help="square LR input sides")
    parser.add_argument("--budget-mb", type=float, default=512)
    parser.add_argument("--model", default="nalasr-light-x4")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per job")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)

    from nala_gen.sr.upscale.imageio import read_image, write_image_atomic

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small = write_image_atomic(sample_input(32), tmp / "small.png")
        fixed = run_job([str(small), "-o", str(tmp / "small_x4.png"), "-m", args.model, "--tile", "0"], 600)
        if fixed.get("status") != "ok":
            print(f"nala-bench upscale-memory: error: the fixed-cost job failed: {fixed.get('error')}", file=sys.stderr)
            return 1
        fixed_bytes = fixed["process_peak_rss_bytes"]
        budget = int(args.budget_mb * 2**20)
        print(f"fixed cost (libraries + {args.model} + a 32x32 job): {fixed_bytes / 2**20:,.0f} MiB", flush=True)
        for side in args.sides:
            src = write_image_atomic(sample_input(side), tmp / f"in_{side}.png")
            dst = tmp / f"out_{side}.png"
            job = run_job(
                [str(src), "-o", str(dst), "-m", args.model, "--memory-budget-mb", f"{args.budget_mb:g}"], args.timeout
            )
            row = {"lr_side": side, "budget_bytes": budget, "fixed_bytes": fixed_bytes, **job}
            if job.get("status") == "ok":
                row["output_ok"] = read_image(dst).shape[:2] == (4 * side, 4 * side)
                dst.unlink()
                row["within"] = job["process_peak_rss_bytes"] <= budget + fixed_bytes
                shown = (
                    f"process peak {job['process_peak_rss_bytes'] / 2**20:,.0f} MiB <= budget + fixed "
                    f"{(budget + fixed_bytes) / 2**20:,.0f} MiB: {row['within']}; estimate "
                    f"{job['estimate_mib']:,.0f} MiB, tile {job['tile_size']}, {job['tiles']} tiles, "
                    f"PNG streamed: {job['streamed']}, {job['wall_s']:.0f} s"
                )
            else:
                shown = f"{job.get('status')}: {job.get('error', '')}"
            print(f"{side}x{side} -> {4 * side}x{4 * side}: {shown}", flush=True)
            rows.append(row)

    result = {
        "machine": machine_info("cpu"),
        "model": args.model,
        "scale": 4,
        "budget_mb": args.budget_mb,
        "fixed_bytes": fixed_bytes,
        "input": "assets/chelsea_lr_x4.png resized (Pillow bicubic) to each LR side, written as PNG",
        "measure": "the child's ru_maxrss (wait4): the whole process's peak resident memory",
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "upscale_memory.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "upscale_memory.png")
    print(f"wrote {args.out / 'upscale_memory'}.json and .png")
    return 0 if all(r.get("within") and r.get("output_ok") for r in rows) else 1


def plot(result: dict, path: Path) -> None:
    """One bar per job: the fixed cost and the job's peak above it, against budget + fixed cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("status") == "ok"]
    mib = 2**20
    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = [f"{r['lr_side']}²→{4 * r['lr_side']}²" for r in rows]
    fixed = [r["fixed_bytes"] / mib for r in rows]
    above = [(r["process_peak_rss_bytes"] - r["fixed_bytes"]) / mib for r in rows]
    ax.bar(labels, fixed, color="#bbbbbb", label="fixed cost (libraries, model)")
    ax.bar(labels, above, bottom=fixed, color="#3b7dd8", label="the job (input, tiles, bands, PNG)")
    limit = (result["budget_mb"] * mib + result["fixed_bytes"]) / mib
    ax.axhline(limit, color="#d62728", linestyle="--", label=f"budget {result['budget_mb']:g} MiB + fixed cost")
    ax.set_ylabel("process peak RSS (MiB)")
    ax.set_title(f"nala-sr upscale x4 ({result['model']}), --memory-budget-mb {result['budget_mb']:g}")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def upscale_memory_table() -> str:
    data = load("upscale_memory.json")
    mib = 2**20
    lines = [
        f"`nala-sr upscale -m {data['model']} --memory-budget-mb {data['budget_mb']:g}`, x4, one fresh process per "
        f"job; {data['measure']}; fixed cost (libraries, model, a 32x32 job): {data['fixed_bytes'] / mib:,.0f} MiB.",
        "",
        "| LR in | out | process peak | budget + fixed | estimate | tile (tiles) | PNG | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        sides = (f"{r['lr_side']}²", f"{4 * r['lr_side']}²")
        if r.get("status") != "ok":
            lines.append(row(*sides, f"{r.get('status')}: {r.get('error', '')}", "", "", "", "", ""))
            continue
        peak, limit = (
            f"{r['process_peak_rss_bytes'] / mib:,.0f} MiB",
            f"{(r['budget_bytes'] + r['fixed_bytes']) / mib:,.0f} MiB",
        )
        plan = (
            f"{r['estimate_mib']:,.0f} MiB",
            f"{r['tile_size']} ({r['tiles']})",
            "streamed" if r["streamed"] else "in memory",
        )
        lines.append(row(*sides, peak, limit, *plan, f"{r['wall_s']:.0f} s"))
    return "\n".join(lines)


TABLES = (Table("upscale-memory", ("upscale_memory.json",), upscale_memory_table),)
