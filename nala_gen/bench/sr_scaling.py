"""Super-resolution cost against LR size: NaLaSR-light, ESRT and SwinIR-light, each point a fresh process.

Batch 1, fp32, x4, random input (cost does not depend on content), weights random (cost does not depend on them
either). Each worker caps its memory (``RLIMIT_DATA``, default 16 GiB of this machine's 24) so a configuration
that cannot fit is recorded as out of memory instead of taking the machine down. Also reports parameters and
FLOPs (``torch.utils.flop_counter``) at a stated input size.

    nala-bench sr [--sizes 64x64 128x128 192x192 256x280 320x320] [--models nalasr esrt swinir]
    nala-bench sr --device cuda --tag cuda ...   (benchmarks/gpu_check.sh: CUDA-synchronised timings and
                                                  torch.cuda.max_memory_allocated; no address-space cap there)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from nala_gen.bench.common import limit_memory, machine_info, run_worker, write_cost_results
from nala_gen.profiling import PeakMemory

SIZES = ("64x64", "128x128", "192x192", "256x280", "320x320")
MODELS = ("nalasr", "esrt", "swinir")
FLOPS_SIZE = (64, 64)


# SwinIR-light as in its paper and BasicSR's options (SwinIR ships inside basicsr).
SWINIR_LIGHT = {
    "in_chans": 3, "img_size": 64, "window_size": 8, "img_range": 1.0, "depths": [6, 6, 6, 6], "embed_dim": 60,
    "num_heads": [6, 6, 6, 6], "mlp_ratio": 2, "upsampler": "pixelshuffledirect", "resi_connection": "1conv",
}  # fmt: skip
ARCHS = {"nalasr": ("NaLaSR", {}), "esrt": ("ESRT", {}), "swinir": ("SwinIR", SWINIR_LIGHT)}


def build(model: str, scale: int = 4) -> torch.nn.Module:
    from nala_gen.sr.models import build_arch

    arch, config = ARCHS[model]
    return build_arch(arch, {**config, "upscale": scale})


def padded_input(model: str, h: int, w: int) -> torch.Tensor:
    # SwinIR needs multiples of its window (8); its own test scripts pad the same way.
    if model == "swinir":
        h, w = -(-h // 8) * 8, -(-w // 8) * 8
    return torch.rand(1, 3, h, w)


def _timed(net: torch.nn.Module, x: torch.Tensor) -> float:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    start = time.perf_counter()
    net(x)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return time.perf_counter() - start


def worker(model: str, size: str, repeats: int, mem_limit: int, device: str = "cpu") -> dict:
    if device == "cpu":
        limit_memory(mem_limit)  # on CUDA the allocator's own out-of-memory error is the guard
    h, w = map(int, size.split("x"))
    torch.manual_seed(0)
    net = build(model).eval().to(device)
    x = padded_input(model, h, w).to(device)
    runs = []
    with torch.inference_mode():
        if device != "cpu":
            _timed(net, x)  # warm-up: CUDA context, kernel selection (not counted)
        with PeakMemory(device) as memory:
            runs.append(_timed(net, x))
        runs.extend(_timed(net, x) for _ in range(repeats - 1))
    return {"status": "ok", "latency_s": statistics.median(runs), "runs_s": runs, "peak_extra_bytes": memory.peak_bytes}


def model_costs(model: str) -> dict:
    """Parameters and FLOPs (multiply-adds x 2) for one 64x64 LR input."""
    from torch.utils.flop_counter import FlopCounterMode

    net = build(model).eval()
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        net(padded_input(model, *FLOPS_SIZE))
    return {"params": sum(p.numel() for p in net.parameters()), "gflops_at_64x64": counter.get_total_flops() / 1e9}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench sr", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), help="LR sizes HxW")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mem-limit-gb", type=float, default=16.0, help="memory cap per worker (GiB)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--tag", default="", help="suffix of the result files: sr_scaling[_TAG].json/.png")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    limit = int(args.mem_limit_gb * 2**30)
    if args.device != "cpu" and not args.worker:  # what an out-of-memory point hit: the whole GPU
        limit = torch.cuda.get_device_properties(torch.device(args.device)).total_memory

    if args.worker:
        print(json.dumps(worker(*args.worker, args.repeats, limit, args.device)))
        return 0

    costs = {m: model_costs(m) for m in args.models}
    for m, c in costs.items():
        print(f"{m:<7} {c['params'] / 1e6:.3f} M params, {c['gflops_at_64x64']:.2f} GFLOPs at 64x64 LR", flush=True)
    rows = []
    for size in args.sizes:
        h, w = map(int, size.split("x"))
        for model in args.models:
            worker_args = [
                "--worker",
                model,
                size,
                "--repeats",
                str(args.repeats),
                "--mem-limit-gb",
                str(args.mem_limit_gb),
                "--device",
                args.device,
            ]
            result = run_worker("nala_gen.bench.sr_scaling", worker_args)
            row = {"model": model, "size": size, "tokens": h * w, "limit_bytes": limit, **result}
            rows.append(row)
            shown = (
                f"{row['latency_s']:8.2f} s {row['peak_extra_bytes'] / 2**30:7.2f} GiB"
                if row["status"] == "ok"
                else f"{row['status']}: {row.get('note', '')[:90]}"
            )
            print(f"{size:>8} ({h * w:>6} tokens) {model:<7} {shown}", flush=True)
    result = {
        "machine": machine_info(args.device),
        "scale": 4,
        "repeats": args.repeats,
        "mem_limit_bytes": limit,
        "costs": costs,
        "rows": rows,
    }
    stem = "sr_scaling" + (f"_{args.tag}" if args.tag else "")
    where = "this CPU" if args.device == "cpu" else result["machine"]["device_name"]
    write_cost_results(
        args.out,
        stem,
        result,
        "model",
        "LR tokens (pixels), x4, fp32, batch 1",
        f"Super-resolution cost vs input size on {where} (fresh process per point)",
        "s",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
