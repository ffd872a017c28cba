"""The live-tensor high-water mark of one SR forward: what the tensors alive at once add up to, not the process's
resident memory (which also holds the heap's freed blocks, libraries and code pages).

    python scripts/sr_live_memory.py [--models nalasr srvgg] [--sides 250 500]

Each network at each LR side (x4, fp32, batch 1, channels-last, random weights, ``net(x)`` in eval mode under
``torch.inference_mode()`` with the engine's reused temporaries, as the peer board runs it) in a fresh process: one
warm-up pass, then one pass under ``torch.profiler`` with ``profile_memory=True``, whose allocation and free events,
summed in time order, give the live bytes; printed with the operators running at the peak, innermost first.
A one-off diagnostic (docs/results/peers.md quotes it); nothing is written.
"""

from __future__ import annotations

import argparse

from nala_gen.bench.worker import failed, run_fresh


def worker(model: str, side: int) -> dict:
    """The live peak (bytes) and the operators running at it, innermost first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nala_gen.bench.sr_scaling import build
    from nala_gen.profiling import reused_large_temporaries

    torch.manual_seed(0)
    net = build(model).eval().to(memory_format=torch.channels_last)
    x = torch.rand(1, 3, side, side).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), reused_large_temporaries():
        net(x)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            net(x)
    events = prof.profiler.kineto_results.events()
    allocations = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    when = None
    for time, size in allocations:
        live += size
        if live > peak:
            peak, when = live, time
    ops = [e for e in events if e.name() != "[memory]" and e.start_ns() <= when <= e.start_ns() + e.duration_ns()]
    # the operators running at the peak, innermost first (an op's allocations happen inside it)
    return {"peak_bytes": peak, "running": [e.name() for e in sorted(ops, key=lambda e: e.duration_ns())][:4]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["nalasr", "srvgg"])
    parser.add_argument("--sides", nargs="+", type=int, default=[250, 500])
    args = parser.parse_args(argv)
    for side in args.sides:
        for model in args.models:
            result = run_fresh(f"{__file__}:worker", {"model": model, "side": side})
            if failed(result):
                print(f"{model} {side}: {result['status']}: {result['note']}")
                continue
            running = " < ".join(result["running"]) or "?"
            print(f"{model:8s} {side}² LR  live peak {result['peak_bytes'] / 2**20:7.0f} MiB  in {running}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
