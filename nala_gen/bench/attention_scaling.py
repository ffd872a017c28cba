"""Attention latency and peak memory against token count, each configuration in a fresh process.

For every N and method a worker process allocates q, k, v of shape (1, heads, N, d), resets the RSS
high-water mark, runs the op once (its peak extra memory is the RSS high-water mark above that baseline; its time
is kept as ``cold_s``), then times ``repeats`` more runs and reports their median. Explicit softmax is only run
where its two N x N matrices fit the memory budget; beyond that the result records the memory it would need. The same
run measures ``torch.mm`` GFLOP/s and copy bandwidth, so ratios are side by side.

    nala-bench attention [--sizes 1024 4096 ...] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from nala_gen.attention import feature_dim, linear_attention
from nala_gen.bench.common import run_worker, write_cost_results
from nala_gen.profiling import PeakMemory

SIZES = (1024, 4096, 16384, 65536, 71680)
METHODS = ("nala", "nala_compiled", "nala_split", "relu", "softmax_sdpa", "softmax_explicit")
COMPILED = "_compiled"  # suffix: the same kernel with its feature map fused by torch.compile
EXPLICIT_BUDGET_BYTES = 10 * 2**30


def explicit_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with the N x N matrix materialised (ESRT-style, eager)."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.softmax(scores, dim=-1) @ v


def explicit_bytes(n: int, heads: int) -> int:
    """Scores plus softmax output, fp32: two (heads, N, N) matrices."""
    return 2 * heads * n * n * 4


def method_fn(method: str, q, k, v):
    if method == "softmax_sdpa":
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    if method == "softmax_explicit":
        return lambda: explicit_softmax(q, k, v)
    kernel = method.removesuffix(COMPILED)
    return lambda: linear_attention(q, k, v, kernel=kernel, compile=method.endswith(COMPILED))


def linear_flops(method: str, n: int, heads: int, d: int) -> int:
    """Matmul FLOPs of the linear op: key state, query numerator and denominator."""
    f = feature_dim(method.removesuffix(COMPILED), d)
    return heads * n * (4 * f * d + 2 * f)


def worker(method: str, n: int, heads: int, d: int, repeats: int) -> dict:
    torch.manual_seed(0)
    with torch.inference_mode():
        q, k, v = (torch.randn(1, heads, n, d) for _ in range(3))
        fn = method_fn(method, q, k, v)
        compile_s = None
        if method.endswith(COMPILED):  # compile outside the measurement; reported on its own
            start = time.perf_counter()
            fn()
            compile_s = time.perf_counter() - start
        with PeakMemory("cpu") as memory:
            start = time.perf_counter()
            fn()
            cold_s = time.perf_counter() - start
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - start)
    # The cold run (fresh pages for every buffer) measures memory; the latency is the median of the warm runs.
    result = {
        "latency_s": statistics.median(runs),
        "runs_s": runs,
        "cold_s": cold_s,
        "peak_extra_bytes": memory.peak_bytes,
    }
    return result if compile_s is None else {**result, "first_call_s": compile_s}


def machine_floor() -> dict:
    """torch.mm fp32 GFLOP/s (2048^3) and copy bandwidth (256 MiB, read + write counted)."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    out = torch.empty(2048, 2048)
    mm = []
    for _ in range(7):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        mm.append(time.perf_counter() - start)
    src = torch.randn(64 * 2**20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = []
    for _ in range(7):
        start = time.perf_counter()
        dst.copy_(src)
        copy.append(time.perf_counter() - start)
    return {
        "mm_gflops": 2 * 2048**3 / statistics.median(mm[1:]) / 1e9,
        "copy_gbps": 2 * src.numel() * 4 / statistics.median(copy) / 1e9,
    }


def run_config(method: str, n: int, heads: int, d: int, repeats: int, thp: bool) -> dict:
    row = {"method": method, "tokens": n, "heads": heads, "head_dim": d}
    if method == "softmax_explicit" and explicit_bytes(n, heads) > EXPLICIT_BUDGET_BYTES:
        need = explicit_bytes(n, heads)
        return {
            **row,
            "status": "skipped",
            "needs_bytes": need,
            "note": f"explicit N x N softmax needs ~{need / 1e9:.0f} GB (computed, not measured)",
        }
    args = ["--worker", method, "--sizes", str(n), "--heads", str(heads), "--head-dim", str(d)]
    result = run_worker(
        "nala_gen.bench.attention_scaling",
        [*args, "--repeats", str(repeats)],
        {"THP_MEM_ALLOC_ENABLE": "1" if thp else "0"},
    )
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
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args.sizes[0], args.heads, args.head_dim, args.repeats)))
        return 0

    floor = machine_floor()
    print(f"torch.mm fp32: {floor['mm_gflops']:.0f} GFLOP/s; copy: {floor['copy_gbps']:.1f} GB/s", flush=True)
    rows = []
    for n in args.sizes:
        for method in args.methods:
            row = run_config(method, n, args.heads, args.head_dim, args.repeats, not args.no_thp)
            rows.append(row)
            shown = (
                f"{row['latency_s'] * 1e3:10.1f} ms {row['peak_extra_bytes'] / 2**20:8.1f} MiB"
                if row["status"] == "ok"
                else row.get("note", row["status"])
            )
            print(f"N={n:>6} {method:<17} {shown}", flush=True)
    summarise(rows, floor)
    result = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "thp": not args.no_thp,
            **floor,
        },
        "repeats": args.repeats,
        "rows": rows,
    }
    write_cost_results(
        args.out,
        "attention_scaling",
        result,
        "method",
        "tokens N (4 heads, d = 32, fp32, batch 1)",
        "Attention cost vs tokens on this CPU (each point a fresh process)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
