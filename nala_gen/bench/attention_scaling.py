"""Attention latency and peak memory against token count, each configuration in a fresh process.

For every N and method a worker process allocates q, k, v of shape (1, heads, N, d), resets the RSS
high-water mark, runs the op once (its peak extra memory is the RSS high-water mark above that baseline; its time
is kept as ``cold_s``), then times ``repeats`` more runs and reports their median. Explicit softmax is only run
where its two N x N matrices fit the memory budget; beyond that the result records the memory it would need. The same
run measures ``torch.mm`` GFLOP/s and copy bandwidth, so ratios are side by side. The methods, their calls and
their memory and FLOP formulas are :mod:`nala_gen.attention.registry`'s (the app's Scaling tab runs the same ones).

    nala-bench attention [--sizes 1024 4096 ...] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from nala_gen.attention import fused
from nala_gen.attention.registry import COMPILED, EAGER, METHODS, explicit_bytes, linear_flops, method_fn
from nala_gen.bench.common import machine_info, write_cost_results
from nala_gen.bench.worker import run_fresh
from nala_gen.profiling import PeakMemory, synchronize

SIZES = (1024, 4096, 16384, 65536, 71680)
EXPLICIT_BUDGET_BYTES = 10 * 2**30


def timed(fn, device: str) -> float:
    """Seconds of fn() (device-synchronised)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def backward_times(method: str, n: int, heads: int, d: int, repeats: int, device: str = "cpu") -> list[float]:
    """Seconds of ``out.backward(grad)`` alone (the forward that builds the graph is not counted), per run."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, d, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, n, d, device=device)
    fn = method_fn(method, q, k, v)
    runs = []
    for _ in range(repeats + 1):  # the first warms up
        out = fn()
        runs.append(timed(lambda out=out: out.backward(grad), device))
        q.grad = k.grad = v.grad = None
    return runs[1:]


def worker(method: str, n: int, heads: int, d: int, repeats: int, backward: bool = False, device: str = "cpu") -> dict:
    torch.manual_seed(0)
    with torch.inference_mode():
        q, k, v = (torch.randn(1, heads, n, d, device=device) for _ in range(3))
        fn = method_fn(method, q, k, v)
        compile_s = None
        if method.endswith(COMPILED):  # compile outside the measurement; reported on its own
            compile_s = timed(fn, device)
        with PeakMemory(device) as memory:
            cold_s = timed(fn, device)
        runs = [timed(fn, device) for _ in range(repeats)]
    # The cold run (fresh pages for every buffer) measures memory; the latency is the median of the warm runs.
    result = {
        "latency_s": statistics.median(runs),
        "runs_s": runs,
        "cold_s": cold_s,
        "peak_extra_bytes": memory.peak_bytes,
    }
    if backward:
        result["backward_runs_s"] = backward_times(method, n, heads, d, repeats, device)
        result["backward_s"] = statistics.median(result["backward_runs_s"])
    return result if compile_s is None else {**result, "first_call_s": compile_s}


def machine_floor(device: str = "cpu") -> dict:
    """torch.mm fp32 GFLOP/s (2048^3) and copy bandwidth (256 MiB, read + write counted)."""
    a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    out = torch.empty(2048, 2048, device=device)
    mm = [timed(lambda: torch.mm(a, b, out=out), device) for _ in range(7)]
    src = torch.randn(64 * 2**20, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = [timed(lambda: dst.copy_(src), device) for _ in range(7)]
    return {
        "mm_gflops": 2 * 2048**3 / statistics.median(mm[1:]) / 1e9,
        "copy_gbps": 2 * src.numel() * 4 / statistics.median(copy) / 1e9,
    }


@contextmanager
def busy_core(active: bool):
    """While active, a second process spins on one core (the "another job on the machine" condition)."""
    if not active:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it reach the scheduler's steady state
        yield
    finally:
        spinner.kill()
        spinner.wait()


def run_config(
    method: str,
    n: int,
    heads: int,
    d: int,
    repeats: int,
    thp: bool,
    backward: bool = False,
    busy: bool = False,
    device: str = "cpu",
) -> dict:
    row = {"method": method, "tokens": n, "heads": heads, "head_dim": d, "busy_core": busy}
    if method == "softmax_explicit" and explicit_bytes(n, heads) > EXPLICIT_BUDGET_BYTES:
        need = explicit_bytes(n, heads)
        return {
            **row,
            "status": "skipped",
            "needs_bytes": need,
            "note": f"explicit N x N softmax needs ~{need / 1e9:.0f} GB (computed, not measured)",
        }
    backward = backward and not method.startswith("softmax")  # linear kernels only: the op this bench is about
    env = {"THP_MEM_ALLOC_ENABLE": "1" if thp else "0"}
    env["NALA_GEN_FUSED"] = "0" if method.endswith((EAGER, COMPILED)) else "1"  # both measure the PyTorch path
    kwargs = {"method": method, "n": n, "heads": heads, "d": d, "repeats": repeats, "backward": backward}
    with busy_core(busy):
        result = run_fresh("nala_gen.bench.attention_scaling:worker", {**kwargs, "device": device}, env)
    return {**row, "status": "ok", **result}


def summarise(rows: list[dict], floor: dict) -> None:
    """Add achieved GFLOP/s, share of mm peak and the memory-traffic floor to the linear rows."""
    for row in rows:
        if row["status"] != "ok" or row["method"].startswith("softmax"):
            continue
        n, h, d = row["tokens"], row["heads"], row["head_dim"]
        gflops = linear_flops(row["method"], n, h, d) / row["latency_s"] / 1e9
        io_bytes = 4 * h * n * d * 4  # read q, k, v; write the output (fp32)
        row["gflops"] = gflops
        row["share_of_mm_peak"] = gflops / floor["mm_gflops"]
        row["io_floor_s"] = io_bytes / (floor["copy_gbps"] * 1e9)


def shown_row(row: dict) -> str:
    if row["status"] != "ok":
        return row.get("note", row["status"])
    text = f"{row['latency_s'] * 1e3:10.1f} ms {row['peak_extra_bytes'] / 2**20:8.1f} MiB"
    return text + (f"  backward {row['backward_s'] * 1e3:.1f} ms" if "backward_s" in row else "")


def contention_ratios(rows: list[dict]) -> list[dict]:
    """Per (method, N): the busy-core median over the idle median, both measured in this run."""
    idle = {(r["method"], r["tokens"]): r for r in rows if r["status"] == "ok" and not r["busy_core"]}
    out = []
    for r in rows:
        base = idle.get((r["method"], r["tokens"]))
        if r["status"] == "ok" and r["busy_core"] and base:
            ratio = r["latency_s"] / base["latency_s"]
            out.append({"method": r["method"], "tokens": r["tokens"], "busy_over_idle": ratio})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench attention", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--no-thp",
        action="store_true",
        help="do not ask PyTorch for transparent huge pages (THP_MEM_ALLOC_ENABLE)",
    )
    parser.add_argument("--backward", action="store_true", help="also time the backward pass (inputs need grad)")
    parser.add_argument(
        "--contention",
        action="store_true",
        help="run every point twice, idle and with a second process spinning on one core; writes attention_contention",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (CUDA-synchronised times; peak is allocated)")
    parser.add_argument("--tag", default="", help="suffix of the result files (e.g. cuda)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)

    floor = machine_floor(args.device)
    print(f"torch.mm fp32: {floor['mm_gflops']:.0f} GFLOP/s; copy: {floor['copy_gbps']:.1f} GB/s", flush=True)
    rows = []
    for n in args.sizes:
        for method in args.methods:
            for busy in (False, True) if args.contention else (False,):
                row = run_config(
                    method,
                    n,
                    args.heads,
                    args.head_dim,
                    args.repeats,
                    not args.no_thp,
                    args.backward,
                    busy,
                    args.device,
                )
                rows.append(row)
                print(f"N={n:>6} {method:<17}{' busy' if busy else ''} {shown_row(row)}", flush=True)
    summarise(rows, floor)
    result = {
        "machine": {**machine_info(args.device), "thp": not args.no_thp, "fused_op": fused.instruction_set(), **floor},
        "repeats": args.repeats,
        "rows": rows,
    }
    if args.contention:
        result["contention"] = contention_ratios(rows)
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"attention_contention{'_' + args.tag if args.tag else ''}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        for entry in result["contention"]:
            print(f"N={entry['tokens']:>6} {entry['method']:<17} busy/idle median {entry['busy_over_idle']:.2f}")
        print(f"wrote {path}")
        return 0
    write_cost_results(
        args.out,
        "attention_scaling" + (f"_{args.tag}" if args.tag else ""),
        result,
        "method",
        "tokens N (4 heads, d = 32, fp32, batch 1)",
        "Attention cost vs tokens on this CPU (each point a fresh process)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
