"""Where an SR network's forward spends its time: per operator and per layer (``nala-bench peers --profile``).

One whole-image x4 forward, channels-last and fp32 as the upscaling engine runs it, in this (fresh) process after an
untimed warm-up:

* per operator: ``torch.profiler``'s self CPU time of each ATen op over ``repeats`` forwards (its share of their
  sum), so a layout copy, a ``pixel_shuffle`` or an elementwise add shows as itself, not inside its caller;
* per layer: wall time of each module up to ``depth`` levels below the network (forward pre/post hooks, children
  included), the mean over the same forwards.

Hooks and the profiler add a little overhead each; the shares, not the absolute times, are the result.
"""

from __future__ import annotations

import time

import torch


def _layer_times(net: torch.nn.Module, x: torch.Tensor, repeats: int, depth: int) -> list[dict]:
    """Mean inclusive wall time per module of at most ``depth`` name levels, in call order of the first forward."""
    totals: dict[str, float] = {}
    started: dict[str, float] = {}
    handles = []
    for name, module in net.named_modules():
        if not name or name.count(".") >= depth:
            continue

        def before(_module, _args, name=name):
            started[name] = time.perf_counter()

        def after(_module, _args, _out, name=name):
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started.pop(name)

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        start = time.perf_counter()
        for _ in range(repeats):
            net(x)
        whole = (time.perf_counter() - start) / repeats
    finally:
        for handle in handles:
            handle.remove()
    return [
        {
            "layer": name,
            "type": type(net.get_submodule(name)).__name__,
            "ms": 1e3 * t / repeats,
            "share": t / repeats / whole,
        }
        for name, t in totals.items()
    ]


def _op_times(net: torch.nn.Module, x: torch.Tensor, repeats: int, top: int) -> tuple[list[dict], float]:
    """The ``top`` operators by self CPU time (mean per forward), and the sum of all operators' self time (ms)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            net(x)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [
        {
            "op": e.key,
            "calls": e.count // repeats,
            "ms": e.self_cpu_time_total / 1e3 / repeats,
            "share": e.self_cpu_time_total / total_us,
        }
        for e in events[:top]
    ]
    return rows, total_us / 1e3 / repeats


def profile_forward(net: torch.nn.Module, x: torch.Tensor, repeats: int = 3, top: int = 12, depth: int = 3) -> dict:
    """Profile ``net(x)`` (already in the layout and mode to measure): seconds per forward, the top operators and the
    layers; see the module docstring."""
    with torch.inference_mode():
        net(x)  # warm-up: allocator, oneDNN primitive cache
        start = time.perf_counter()
        for _ in range(repeats):
            net(x)
        seconds = (time.perf_counter() - start) / repeats
        ops, op_ms = _op_times(net, x, repeats, top)
        layers = _layer_times(net, x, repeats, depth)
    return {"seconds": seconds, "ops": ops, "ops_total_ms": op_ms, "layers": layers, "repeats": repeats}


def format_profile(model: str, side: int, result: dict) -> str:
    """The profile as two plain-text tables."""
    lines = [
        f"{model}, {side}x{side} LR -> x4, one forward: {result['seconds']:.3f} s "
        f"(mean of {result['repeats']} after a warm-up, without profiler or hooks)",
        "",
        f"{'operator (self time)':<40} {'calls':>6} {'ms':>9} {'share':>7}",
    ]
    for r in result["ops"]:
        lines.append(f"{r['op'][:40]:<40} {r['calls']:>6} {r['ms']:>9.1f} {r['share']:>7.1%}")
    lines += ["", f"{'layer (with its children)':<40} {'type':<22} {'ms':>9} {'share':>7}"]
    for r in result["layers"]:
        lines.append(f"{r['layer'][:40]:<40} {r['type'][:22]:<22} {r['ms']:>9.1f} {r['share']:>7.1%}")
    return "\n".join(lines)
