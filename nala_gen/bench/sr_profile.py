"""Where an SR network's forward spends its time: per operator and per layer (``nala-bench peers --profile``).

One whole-image x4 forward, channels-last and fp32 as the upscaling engine runs it, in this (fresh) process after an
untimed warm-up:

* per operator: ``torch.profiler``'s self CPU time of each ATen op over ``repeats`` forwards (its share of their
  sum), so a layout copy, a ``pixel_shuffle`` or an elementwise add shows as itself, not inside its caller;
* per layer: wall time of each module up to ``depth`` levels below the network (forward pre/post hooks, children
  included), the mean over the same forwards;
* per convolution shape: wall time, calls and FLOPs of every ``conv2d``, ``conv_transpose2d`` and Winograd
  (:mod:`~nala_gen.ops.winograd`) call, grouped by kind, channels, kernel and groups, so each shape's
  arithmetic rate (GFLOP/s) shows: whether a network is slow for its FLOPs because of its convolutions' shapes or
  because of what runs between them. A Winograd call counts the FLOPs of the direct convolution it computes, so
  its rate is the one a direct kernel would need to be as fast.

Hooks and the profiler add a little overhead each; the shares, not the absolute times, are the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from nala_gen.ops.winograd import pointwise_conv, winograd_conv3x3


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


def operator_times(run: Callable[[], object], repeats: int) -> tuple[list[dict], float]:
    """Every operator by self CPU time over ``repeats`` calls of ``run`` (mean per call, slowest first), and the sum
    of their self time (ms)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run()
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
        for e in events
    ]
    return rows, total_us / 1e3 / repeats


class _ConvolutionTimer(TorchFunctionMode):
    """Times every 2-D convolution called while active, by shape. A convolution on the CPU returns when done, so
    the wall time around the call is its time (its layout reorders included, which is what a caller pays)."""

    KINDS = {
        F.conv2d: "conv",
        F.conv_transpose2d: "transposed",
        winograd_conv3x3: "winograd",
        pointwise_conv: "1x1 kernel",
    }

    def __init__(self) -> None:
        super().__init__()
        self.shapes: dict[tuple, list[float]] = {}  # key -> [calls, seconds, flops]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self.KINDS.get(func)
        if kind is None:
            return func(*args, **kwargs)
        start = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - start
        x, weight = args[0], args[1]
        groups = kwargs.get("groups", args[6] if len(args) > 6 else 1)  # the 7th argument of both
        # weight: (out, in / groups, kh, kw) for conv, (in, out / groups, kh, kw) for the transposed one; each
        # multiply-add of the larger side's elements reads weight.shape[1] * kh * kw inputs of the other
        kh, kw = weight.shape[-2:]
        if kind == "winograd":  # weight: the packed (16 or 36, Ci, Co)
            kh = kw = 3
            channels, macs = (x.shape[1], weight.shape[2]), out.numel() * x.shape[1] * 9
        elif kind == "1x1 kernel":  # weight: (Ci, Co)
            kh = kw = 1
            channels, macs = (x.shape[1], weight.shape[1]), out.numel() * x.shape[1]
        elif kind == "conv":
            channels, macs = (x.shape[1], weight.shape[0]), out.numel() * weight[0].numel()
        else:
            channels, macs = (x.shape[1], weight.shape[1] * groups), x.numel() * weight[0].numel()
        entry = self.shapes.setdefault((kind, *channels, f"{kh}x{kw}", groups), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        entry[2] += 2 * macs
        return out


def _convolution_times(net: torch.nn.Module, x: torch.Tensor, repeats: int) -> list[dict]:
    """Per convolution shape, mean per forward: calls, ms, GFLOP and GFLOP/s, the slowest shapes first."""
    with _ConvolutionTimer() as timer:
        for _ in range(repeats):
            net(x)
    rows = [
        {
            "kind": kind,
            "in_channels": c_in,
            "out_channels": c_out,
            "kernel": kernel,
            "groups": groups,
            "calls": calls // repeats,
            "ms": 1e3 * seconds / repeats,
            "gflop": flops / 1e9 / repeats,
            "gflops": flops / 1e9 / seconds if seconds else 0.0,
        }
        for (kind, c_in, c_out, kernel, groups), (calls, seconds, flops) in timer.shapes.items()
    ]
    return sorted(rows, key=lambda r: r["ms"], reverse=True)


def profile_forward(net: torch.nn.Module, x: torch.Tensor, repeats: int = 3, depth: int = 3) -> dict:
    """Profile ``net(x)`` (already in the layout and mode to measure): seconds per forward, every operator (slowest
    first) and the layers; see the module docstring."""
    with torch.inference_mode():
        net(x)  # warm-up: allocator, oneDNN primitive cache
        start = time.perf_counter()
        for _ in range(repeats):
            net(x)
        seconds = (time.perf_counter() - start) / repeats
        ops, op_ms = operator_times(lambda: net(x), repeats)
        layers = _layer_times(net, x, repeats, depth)
        convolutions = _convolution_times(net, x, repeats)
    return {
        "seconds": seconds,
        "ops": ops,
        "ops_total_ms": op_ms,
        "layers": layers,
        "convolutions": convolutions,
        "repeats": repeats,
    }


def format_profile(model: str, side: int, result: dict, top: int = 12) -> str:
    """The profile as three plain-text tables (the ``top`` operators of the first)."""
    lines = [
        f"{model}, {side}x{side} LR -> x4, one forward: {result['seconds']:.3f} s "
        f"(mean of {result['repeats']} after a warm-up, without profiler or hooks)",
        "",
        f"{'operator (self time)':<40} {'calls':>6} {'ms':>9} {'share':>7}",
    ]
    for r in result["ops"][:top]:
        lines.append(f"{r['op'][:40]:<40} {r['calls']:>6} {r['ms']:>9.1f} {r['share']:>7.1%}")
    lines += ["", f"{'layer (with its children)':<40} {'type':<22} {'ms':>9} {'share':>7}"]
    for r in result["layers"]:
        lines.append(f"{r['layer'][:40]:<40} {r['type'][:22]:<22} {r['ms']:>9.1f} {r['share']:>7.1%}")
    lines += ["", f"{'convolution (in -> out, kernel, groups)':<40} {'calls':>6} {'ms':>9} {'GFLOP':>7} {'GFLOP/s':>8}"]
    for r in result["convolutions"]:
        shape = f"{r['kind']} {r['in_channels']}->{r['out_channels']} {r['kernel']} g{r['groups']}"
        lines.append(f"{shape:<40} {r['calls']:>6} {r['ms']:>9.1f} {r['gflop']:>7.2f} {r['gflops']:>8.1f}")
    return "\n".join(lines)
