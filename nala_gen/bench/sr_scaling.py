"""Super-resolution cost: against LR size (``nala-bench sr``), and NaLaSR among its peers (``nala-bench peers``).

``nala-bench sr`` sweeps NaLaSR-light, ESRT and SwinIR-light over LR sizes (tokens), each point a fresh process.
``nala-bench peers`` (:func:`peers_main`) puts NaLaSR and ESRT beside the networks people run, as BasicSR ships
them: Real-ESRGAN's SRVGGNetCompact, EDSR-baseline, SwinIR-light and RRDBNet (ESRGAN), at 0.25, 1 and 4 output
megapixels: parameters, FLOPs per output megapixel, seconds, MP/s, achieved GFLOP/s and the process's peak
memory; a network that cannot run whole within the cap is run tiled by the upscaling engine and marked so; a
Pareto plot against the equal-budget PSNR of ``nala-bench sr-ablation`` where a network has one.

Batch 1, fp32, x4, random input (cost does not depend on content), weights random (cost does not depend on them
either). Each worker caps its memory (``RLIMIT_DATA``, default 16 GiB of this machine's 24) so a configuration
that cannot fit is recorded as out of memory instead of taking the machine down. Also reports parameters and
FLOPs (``torch.utils.flop_counter``) at a stated input size.

    nala-bench sr [--sizes 64x64 128x128 192x192 256x280 320x320] [--models nalasr esrt swinir]
    nala-bench sr --device cuda --tag cuda ...   (benchmarks/gpu_check.sh: CUDA-synchronised timings and
                                                  torch.cuda.max_memory_allocated; no address-space cap there)
    nala-bench peers [--sides 125 250 500] [--models nalasr esrt srvgg edsr swinir rrdb]
    nala-bench peers --profile nalasr srvgg [--sides 250]   (per operator and per layer: sr_profile.json)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from nala_gen.bench.common import machine_info, rows_not_rerun, run_stamp, write_cost_results
from nala_gen.bench.peers import PEERS, peer_network
from nala_gen.bench.worker import limit_memory, run_fresh
from nala_gen.profiling import PeakMemory

SIZES = ("64x64", "128x128", "192x192", "256x280", "320x320")
MODELS = ("nalasr", "esrt", "swinir")
BOARD = ("nalasr", "esrt", "srvgg", "edsr", "swinir", "rrdb")  # nala-bench peers
PEER_SIDES = (125, 250, 500)  # square LR inputs: 0.25, 1 and 4 megapixels out at x4
FLOPS_SIZE = (64, 64)


ARCHS = {"nalasr": ("NaLaSR", {}), "esrt": ("ESRT", {}), **PEERS}
# the sr-ablation variant that trains each network on the equal budget (its PSNR goes on the Pareto plot)
# board network -> the sr-ablation variant that gives its quality; SRVGGNetCompact's is the zero-init run (the same
# network: with BasicSR's init it learns nothing at the equal budget, see nala_gen.sr.archs.srvgg_zero_init_arch)
ABLATION_VARIANT = {"nalasr": "nala", "esrt": "emha", "srvgg": "srvgg_zero_init", "edsr": "edsr", "swinir": "swinir"}


def build(model: str, scale: int = 4) -> torch.nn.Module:
    from nala_gen.sr.loading import build_arch

    if model in PEERS:
        network = peer_network(model, scale)
        return build_arch(network.pop("type"), network)
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
    # the layers as the papers define them (NaLaSR's and ESRT's own net(x) runs their inference graph here: the
    # peer board times that)
    net = getattr(net, "forward_layers", net)
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
        getattr(net, "forward_layers", net)(padded_input(model, *FLOPS_SIZE))  # the layers, as worker times them
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
    args = parser.parse_args(argv)
    cap = int(args.mem_limit_gb * 2**30)  # each worker's, on CPU
    limit = cap  # what an out-of-memory point hit: the cap, or on CUDA the whole GPU
    if args.device != "cpu":
        limit = torch.cuda.get_device_properties(torch.device(args.device)).total_memory

    costs = {m: model_costs(m) for m in args.models}
    for m, c in costs.items():
        print(f"{m:<7} {c['params'] / 1e6:.3f} M params, {c['gflops_at_64x64']:.2f} GFLOPs at 64x64 LR", flush=True)
    rows = []
    for size in args.sizes:
        h, w = map(int, size.split("x"))
        for model in args.models:
            kwargs = {"model": model, "size": size, "repeats": args.repeats, "mem_limit": cap}
            result = run_fresh("nala_gen.bench.sr_scaling:worker", {**kwargs, "device": args.device})
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


def flops_of(fn):
    """(fn(), FLOPs it ran): ``torch.utils.flop_counter`` counts 2 x multiply-adds of convolutions, matmuls and
    attention; elementwise work is not counted."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        result = fn()
    return result, counter.get_total_flops()


def entry_precision(entry: str) -> tuple[str, str]:
    """A board entry, ``MODEL`` (fp32) or ``MODEL@bf16``, -> (model, precision)."""
    model, _, precision = entry.partition("@")
    return model, precision or "fp32"


def peer_worker(model: str, side: int, repeats: int, mem_limit: int, tiled: bool) -> dict:
    """One network at one LR side in this (fresh) process: the module's own ``net(x)`` in eval mode under
    ``torch.inference_mode()`` (channels-last, reused temporaries, as the engine runs it; NaLaSR and ESRT then run
    their inference graph), or the engine's auto tiles within a 4 GiB budget. The memory figures
    are read after an untimed warm-up pass and the timed ones, before the FLOPs are counted on one more pass: the
    counter is a measuring instrument (a dispatch mode over every op), and its pass grows the heap beyond what the
    network's own passes need."""
    import resource

    from nala_gen.profiling import current_rss, reused_large_temporaries

    model, precision = entry_precision(model)
    limit_memory(mem_limit)
    torch.manual_seed(0)
    net = build(model).eval().to(memory_format=torch.channels_last)  # the module itself, as a user calls it
    x = padded_input(model, side, side).contiguous(memory_format=torch.channels_last)
    loaded = current_rss()  # libraries, weights and the input: what the process holds before any pass
    # the engine's allocator setting for a pass (no page faults for each temporary), for every network alike; bf16
    # as the engine runs it (autocast)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.inference_mode(), reused_large_temporaries(), bf16:
        if tiled:
            import numpy as np

            from nala_gen.sr.upscale.engine import Upscaler

            engine = Upscaler(net, 4, "cpu", precision=precision, memory_budget=4 * 2**30)
            img = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)

            def one_pass():
                return engine.upscale(img)

            tiles = one_pass()[1].tiles  # warm-up

            def timed_pass() -> float:
                return one_pass()[1].latency_s
        else:

            def one_pass():
                return net(x)

            one_pass()  # warm-up
            tiles = 1

            def timed_pass() -> float:
                return _timed(net, x)

        runs = [timed_pass() for _ in range(repeats)]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        _, flops = flops_of(one_pass)
    latency = statistics.median(runs)
    out_mp = (side * 4) ** 2 / 1e6
    return {
        "status": "ok",
        "latency_s": latency,
        "runs_s": runs,
        "output_megapixels": out_mp,
        "megapixels_per_s": out_mp / latency,
        "gflop_per_mp": flops / 1e9 / out_mp,
        "gflops_achieved": flops / 1e9 / latency,
        "process_peak_bytes": peak,
        "loaded_rss_bytes": loaded,
        "pass_peak_bytes": peak - loaded,  # what the passes added on top of the loaded process
        "tiled": tiled,
        "tiles": tiles,
    }


def profile_worker(model: str, side: int, repeats: int) -> dict:
    """Per-operator and per-layer times of one whole-image forward in this (fresh) process, run as peer_worker
    runs it. The layers are those ``net(x)`` runs: for NaLaSR and ESRT, their fast inference form's."""
    from nala_gen.bench.sr_profile import profile_forward
    from nala_gen.profiling import reused_large_temporaries

    torch.manual_seed(0)
    net = build(model).eval().to(memory_format=torch.channels_last)
    form = getattr(net, "inference_form", None)  # NaLaSR's and ESRT's fast form, the module their net(x) runs
    net = net if form is None else form()
    x = padded_input(model, side, side).contiguous(memory_format=torch.channels_last)
    with reused_large_temporaries():  # as peer_worker and the engine run a pass
        return profile_forward(net, x, repeats)


def profiles(models: list[str], side: int, repeats: int, out: Path) -> int:
    """``--profile``: each network in a fresh process; JSON and the tables printed."""
    from nala_gen.bench.sr_profile import format_profile

    result = {"machine": machine_info("cpu"), "lr_side": side, "models": {}}
    for model in models:
        row = run_fresh("nala_gen.bench.sr_scaling:profile_worker", {"model": model, "side": side, "repeats": repeats})
        if "ops" not in row:
            print(f"{model}: {row.get('status')}: {row.get('note', '')}", file=sys.stderr)
            return 1
        result["models"][model] = row
        print(format_profile(model, side, row) + "\n", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sr_profile.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'sr_profile.json'}")
    return 0


def ablation_psnr(path: Path) -> dict[str, tuple[float, float | None, int]]:
    """network -> (mean PSNR, sd, seeds) of its equal-budget sr-ablation runs, where there are any."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    by_variant = {v["variant"]: v for v in data.get("variants", [])}
    return {
        model: (by_variant[v]["psnr"], by_variant[v]["psnr_std"], len(by_variant[v]["seeds"]))
        for model, v in ABLATION_VARIANT.items()
        if v in by_variant
    }


# weight-card arch -> its network on the peer board
BOARD_ARCH = {"NaLaSR": "nalasr", "ESRT": "esrt"}


def pareto_figure(rows: list[dict], psnr: dict, highlight: str | None = None):
    """PSNR (equal-budget ablation) against output MP/s at 1 MP; networks without a PSNR are listed aside.
    ``highlight``: a board network drawn larger and labelled as the chosen one (the app's Upscale tab)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    at_1mp = {r["model"]: r for r in rows if r["status"] == "ok" and round(r["output_megapixels"]) == 1}
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    missing = []
    for model, r in at_1mp.items():
        if model not in psnr:
            missing.append(model)
            continue
        mean, sd, _ = psnr[model]
        chosen = model == highlight
        ax.errorbar(r["megapixels_per_s"], mean, yerr=sd or 0, fmt="o", capsize=3, ms=11 if chosen else 6,
                    mec="black" if chosen else None, zorder=3 if chosen else 2)  # fmt: skip
        label = f"{model} (chosen)" if chosen else model
        ax.annotate(label, (r["megapixels_per_s"], mean), textcoords="offset points", xytext=(5, 4), fontsize=8,
                    fontweight="bold" if chosen else "normal")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("output MP/s at 1 MP out (this CPU, fp32)")
    ax.set_ylabel("PSNR-Y, mini val, x4, equal budget (dB)")
    note = f"; no equal-budget PSNR yet: {', '.join(missing)}" if missing else ""
    ax.set_title(f"Quality against speed{note}", fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_pareto(rows: list[dict], psnr: dict, path: Path) -> None:
    """:func:`pareto_figure` as a PNG."""
    pareto_figure(rows, psnr).savefig(path)


def plot_precisions(rows: list[dict], path: Path) -> None:
    """Seconds per whole-image forward of each board entry (network at a precision), grouped by output size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = list(dict.fromkeys(r["model"] for r in rows))
    sides = sorted({r["lr_side"] for r in rows})
    fig, ax = plt.subplots(figsize=(6.5, 3.6), dpi=110)
    width = 0.8 / len(entries)
    for i, entry in enumerate(entries):
        times = [
            next((r["latency_s"] for r in rows if r["model"] == entry and r["lr_side"] == s and r["status"] == "ok"), 0)
            for s in sides
        ]
        ax.bar([j + (i - (len(entries) - 1) / 2) * width for j in range(len(sides))], times, width, label=entry)
    ax.set_xticks(range(len(sides)), [f"{(4 * s) ** 2 / 1e6:.2g} MP out" for s in sides])
    ax.set_ylabel("seconds per forward (median process)")
    ax.set_title("x4 networks at fp32 and bf16 (autocast), this CPU", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def kept_rows(previous: dict, rows: list[dict], costs: dict) -> tuple[list[dict], dict]:
    """The new rows with the previous board's rows of the points not rerun (other networks, or the same network at
    other sides; marked with their own run, or "earlier run" for files from before runs were recorded), in board
    order; and the costs of all of them."""
    kept = rows_not_rerun(previous.get("rows", []), rows, lambda r: (r["model"], r["lr_side"]))
    rerun = {r["model"] for r in rows}
    order = list(ARCHS)
    rank = {model: i for i, model in enumerate(order)}
    merged = sorted([*rows, *kept], key=lambda r: (r["lr_side"], rank.get(entry_precision(r["model"])[0], len(order))))
    return merged, {**{m: c for m, c in previous.get("costs", {}).items() if m not in rerun}, **costs}


def replot(out: Path) -> int:
    """Refresh the board's quality side (``ablation_psnr`` and the Pareto plot) from sr_ablation.json; the
    timed rows are kept as measured."""
    board = out / "sr_peers.json"
    if not board.is_file():
        print(f"no {board}: run `nala-bench peers` first", file=sys.stderr)
        return 1
    result = json.loads(board.read_text())
    result["ablation_psnr"] = ablation_psnr(out / "sr_ablation.json")
    board.write_text(json.dumps(result, indent=1))
    plot_pareto(result["rows"], result["ablation_psnr"], out / "sr_peers.png")
    print(f"wrote {board} and {out / 'sr_peers.png'} (rows as measured at {result.get('run', '?')})")
    return 0


def _peer_point(model: str, side: int, args) -> dict:
    """One network at one size in a fresh process: whole, or tiled when whole does not fit the memory cap."""
    result = {}
    for tiled in (False, True):
        kwargs = {"model": model, "side": side, "repeats": args.repeats, "tiled": tiled}
        kwargs["mem_limit"] = int(args.mem_limit_gb * 2**30)
        result = run_fresh("nala_gen.bench.sr_scaling:peer_worker", kwargs, timeout=args.timeout)
        if result["status"] != "oom":
            break
    return result


def _median_process(results: list[dict]) -> dict:
    """The process of median latency among a point's rounds (its figures kept together: time, peak, FLOPs), with
    every round's latency when there were several; a point that failed in a round reports that failure."""
    failed = [r for r in results if r["status"] != "ok"]
    if failed:
        return failed[0]
    middle = sorted(results, key=lambda r: r["latency_s"])[(len(results) - 1) // 2]
    return middle if len(results) == 1 else {**middle, "rounds_latency_s": [r["latency_s"] for r in results]}


def cpu_slug(machine: dict) -> str:
    """A file name for the machine's board: its CPU model, and the cap when one stands in for another CPU
    (``amd-epyc``, ``amd-epyc-onednn-avx2``)."""
    words = re.findall(r"[a-z0-9]+", machine["cpu"].lower())
    slug = "-".join(w for w in words if w not in ("processor", "cpu", "r", "tm")) or "unknown-cpu"
    cap = machine.get("isa_caps", {}).get("ONEDNN_MAX_CPU_ISA")
    return slug + (f"-onednn-{cap.lower()}" if cap else "")


def write_per_cpu(args, rows: list[dict], costs: dict, limit: int, run: str) -> int:
    """The board as one CPU's file under ``peers_by_cpu/``: every row names the CPU and its flags."""
    machine = machine_info("cpu")
    for row in rows:
        row.update(cpu=machine["cpu"], cpu_flags=machine["cpu_flags"], isa_caps=machine["isa_caps"])
    result = {"machine": machine, "scale": 4, "repeats": args.repeats, "rounds": max(1, args.rounds), "run": run}
    result.update(mem_limit_bytes=limit, costs=costs, rows=rows)
    folder = args.out / "peers_by_cpu"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{cpu_slug(machine)}.json"
    path.write_text(json.dumps(result, indent=1))
    plot_pareto(rows, {}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def peers_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench peers", description="NaLaSR among the SR networks people use.")
    parser.add_argument("--models", nargs="+", default=list(BOARD), choices=list(ARCHS))
    parser.add_argument("--sides", nargs="+", type=int, default=list(PEER_SIDES), help="square LR sides")
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=["fp32"],
        choices=["fp32", "bf16"],
        help="each network at each (bf16: autocast, as the engine runs it; needs a CPU with AVX512_BF16 or AMX); "
        "other than fp32 alone, the board goes to sr_peers_precision.json",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="fresh processes per point, the networks of a size alternated round by round (their order reversed "
        "every other round); a row is its median process, and keeps every round's latency, so that ratios can be "
        "taken round by round (this VM's speed drifts from process to process)",
    )
    parser.add_argument("--mem-limit-gb", type=float, default=16.0, help="memory cap per worker (GiB)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--profile",
        nargs="+",
        metavar="MODEL",
        choices=list(ARCHS),
        help="instead of the board: where these networks' forwards spend their time, per operator and per layer, "
        "at the first --sides value (sr_profile.json)",
    )
    parser.add_argument(
        "--skip",
        nargs="+",
        default=[],
        metavar="MODEL:SIDE",
        help="points not to run (their rows say so), e.g. esrt:500 (quadratic attention: over 20 minutes)",
    )
    parser.add_argument(
        "--keep-others",
        action="store_true",
        help="rerun only --models at --sides and keep every other row of the existing sr_peers.json (other networks, "
        "other sides; each row says which run measured it)",
    )
    parser.add_argument(
        "--per-cpu",
        action="store_true",
        help="write the board to peers_by_cpu/<cpu>.json (one file per CPU model, and per stand-in such as "
        "ONEDNN_MAX_CPU_ISA=AVX2), which the docs render one table each, instead of sr_peers.json",
    )
    parser.add_argument(
        "--replot",
        action="store_true",
        help="time nothing: redraw sr_peers.png and its PSNR figures from the existing sr_peers.json and the current "
        "sr_ablation.json (after more equal-budget trainings have finished)",
    )
    args = parser.parse_args(argv)
    limit = int(args.mem_limit_gb * 2**30)
    if args.replot:
        return replot(args.out)
    if args.profile:
        return profiles(args.profile, args.sides[0], args.repeats, args.out)
    if "bf16" in args.precisions:
        from nala_gen.devices import cpu_model, cpu_native_bf16

        if not cpu_native_bf16():
            print(f"nala-bench peers: error: bf16: this CPU ({cpu_model()}) has no AVX512_BF16 or AMX", file=sys.stderr)
            return 1
    # board entries: each network at each precision, "MODEL" for fp32 and "MODEL@bf16"
    entries = [m if p == "fp32" else f"{m}@{p}" for m in args.models for p in args.precisions]
    costs = {}
    for entry in entries:
        net = build(entry_precision(entry)[0])
        costs[entry] = {"arch": ARCHS[entry_precision(entry)[0]][0], "params": sum(p.numel() for p in net.parameters())}
    run = run_stamp()
    rounds = max(1, args.rounds)
    rows = []
    for side in args.sides:
        measured: dict[str, list[dict]] = {entry: [] for entry in entries}
        for round_index in range(rounds):
            for model in entries if round_index % 2 == 0 else entries[::-1]:
                if f"{model}:{side}" in args.skip:
                    if not measured[model]:
                        measured[model].append({"status": "skipped", "note": "not run (--skip)"})
                    continue
                measured[model].append(_peer_point(model, side, args))
        for model in entries:
            row = {"model": model, "lr_side": side, **costs[model], **_median_process(measured[model]), "run": run}
            row["precision"] = entry_precision(model)[1]
            rows.append(row)
            shown = (
                f"{row['latency_s']:7.2f} s  {row['megapixels_per_s']:.3f} MP/s  {row['gflop_per_mp']:7.1f} GFLOP/MP  "
                f"{row['gflops_achieved']:5.1f} GFLOP/s  peak {row['process_peak_bytes'] / 2**20:,.0f} MiB"
                + (f"  (tiled: {row['tiles']} tiles)" if row["tiled"] else "")
                + (f"  rounds {', '.join(f'{t:.2f}' for t in row['rounds_latency_s'])} s" if rounds > 1 else "")
                if row["status"] == "ok"
                else f"{row['status']}: {row.get('note', '')[:80]}"
            )
            print(f"{model:<7} {side:>4}² LR  {shown}", flush=True)
    if args.per_cpu:
        return write_per_cpu(args, rows, costs, limit, run)
    stem = "sr_peers" if args.precisions == ["fp32"] else "sr_peers_precision"
    previous = args.out / f"{stem}.json"
    if args.keep_others and previous.is_file():
        rows, costs = kept_rows(json.loads(previous.read_text()), rows, costs)
    psnr = ablation_psnr(args.out / "sr_ablation.json")
    result = {"machine": machine_info("cpu"), "scale": 4, "repeats": args.repeats, "rounds": rounds}
    result["mem_limit_bytes"] = limit
    result["run"] = run
    result.update(costs=costs, rows=rows, ablation_psnr=psnr)
    args.out.mkdir(parents=True, exist_ok=True)
    result["precisions"] = args.precisions
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    if stem == "sr_peers":
        plot_pareto(rows, psnr, args.out / f"{stem}.png")
    else:
        plot_precisions(rows, args.out / f"{stem}.png")
    print(f"wrote {args.out / stem}.json and {args.out / stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
