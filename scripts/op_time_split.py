"""Where the fused NaLa op's inference time goes: its key pass, its query pass, both into a reused output, and the
op as a caller gets it (a new output tensor), with the page faults each call takes.

    python scripts/op_time_split.py [--shapes 71680x4x32 62500x8x18] [--threads 2] [--rounds 5]

Each shape (tokens x heads x head size, batch 1, float32, random inputs, no RoPE, the paper's map) in a fresh
process per round, the rounds alternated: per process, the median of 15 calls after one warm-up of

* ``key``: :func:`nala_gen.attention.fused.key_state` over all tokens;
* ``query``: :func:`~nala_gen.attention.fused.query_into` into a reused output;
* ``into``: ``linear_attention(q, k, v, out=...)`` into a reused output (one call of the op's ``forward_into``),
  which is how NaLaSR's graph runs it (the attention's output is a slice of a map the graph holds);
* ``op``: ``linear_attention(q, k, v)`` under ``torch.inference_mode()``, a new output each call, inside
  :func:`nala_gen.profiling.reused_large_temporaries` as the upscaler runs a pass (a freed output's pages serve the
  next one);
* ``fresh``: the same outside it (glibc's own policy, as ``nala-bench attention`` calls it): an output above glibc's
  mmap threshold is page-faulted in afresh by every call; ``fresh - into`` is the first touch of its pages;
* ``relu``: the plain ReLU kernel as ``nala-bench attention`` times it (its own worker, in a process of its own: a
  process's earlier calls change how the allocator serves the next ones; ReLU's eager intermediates took 1,800 or
  27,000 page faults per call after the op's calls, depending on the op's own allocations);

and the minor page faults per call of ``into``, ``op`` and ``fresh``. Printed per round and as medians over rounds;
nothing is written. A diagnostic for the op's target (issue 39) and docs/kernel.md; run it with nothing else on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics

from nala_gen.bench.attention_scaling import run_config
from nala_gen.bench.worker import run_fresh

COLUMNS = ("key", "query", "into", "op", "fresh", "relu")
CALLS = 15


def worker(tokens: int, heads: int, head_dim: int) -> dict:
    """{part: [ms, faults per call]} for the op's parts at this shape."""
    import resource
    import time

    import torch

    from nala_gen.attention import fused, linear_attention
    from nala_gen.attention.kernels import kernel as kernel_spec
    from nala_gen.profiling import reused_large_temporaries

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, tokens, head_dim) for _ in range(3))
    out = torch.empty(1, heads, tokens, head_dim)
    eps_total = kernel_spec("nala").denominator_eps * tokens

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def timed(fn) -> tuple[float, float]:
        fn()
        runs, before = [], faults()
        for _ in range(CALLS):
            start = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - start)
        return statistics.median(runs) * 1e3, (faults() - before) / CALLS

    with torch.inference_mode():
        # first, before the scope below fixes glibc's mmap threshold for the rest of the process
        fresh = timed(lambda: linear_attention(q, k, v, kernel="nala"))
        with reused_large_temporaries():
            state, _ = fused.key_state(k, v, None)
            row = {
                "key": timed(lambda: fused.key_state(k, v, None)),
                "query": timed(lambda: fused.query_into(q, state, None, eps_total, out)),
                "into": timed(lambda: linear_attention(q, k, v, kernel="nala", out=out)),
                "op": timed(lambda: linear_attention(q, k, v, kernel="nala")),
            }
        row["fresh"] = fresh
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["71680x4x32", "62500x8x18"], help="TOKENSxHEADSxHEAD_DIM")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # for the workers (this process only starts them)
    rows: dict[str, list[dict]] = {shape: [] for shape in args.shapes}
    for round_ in range(args.rounds):
        for shape in args.shapes:
            tokens, heads, head_dim = (int(x) for x in shape.split("x"))
            kwargs = {"tokens": tokens, "heads": heads, "head_dim": head_dim}
            row = run_fresh(f"{__file__}:worker", kwargs, {"THP_MEM_ALLOC_ENABLE": "1"})  # as nala-bench
            relu = run_config("relu", tokens, heads, head_dim, repeats=CALLS, thp=True)
            if "status" in row or relu.get("status") != "ok":
                print(f"{shape}: failed: {row.get('note') or relu.get('note')}")
                return 1
            row["relu"] = (relu["latency_s"] * 1e3, 0.0)
            rows[shape].append(row)
            print(f"round {round_ + 1} {shape}: " + " ".join(f"{c}={row[c][0]:.2f}" for c in COLUMNS), flush=True)
    print(f"\nmedians over {args.rounds} rounds, {args.threads} threads (ms; faults per call for into, op, fresh)")
    for shape, runs in rows.items():
        medians = {c: statistics.median(r[c][0] for r in runs) for c in COLUMNS}
        fault = {c: statistics.median(r[c][1] for r in runs) for c in ("into", "op", "fresh")}
        shown = "  ".join(f"{c} {medians[c]:6.2f}" for c in COLUMNS)
        print(
            f"{shape:>12s}: {shown}  first touch {medians['fresh'] - medians['into']:5.2f}  "
            f"op/relu {medians['op'] / medians['relu']:.2f}  fresh/relu {medians['fresh'] / medians['relu']:.2f}  "
            f"faults into {fault['into']:.0f} op {fault['op']:.0f} fresh {fault['fresh']:.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
