"""End-to-end upscaling throughput: the engine ``nala-sr upscale`` runs, in output megapixels per second.

Each point is a fresh process that loads shipped weights (``nala-sr models``), upscales the bundled sample
resized to a square LR input once to warm up (oneDNN primitives, the auto-tile probes), then ``--repeats`` times;
it reports the median latency (the readout ``nala-sr upscale --json`` prints), the cold first call, and the
largest peak memory of the timed calls. ``--tile auto`` uses a fixed ``--memory-budget-mb`` (not the free
memory of the moment) so the tiling, and with it the figure, is the same on every run.

``--keep-others`` reruns only the ``--models`` x ``--engines`` given and keeps the other rows of the existing JSON;
every row says which run measured it.

``--engines torch_eager`` runs NaLaSR with the fused NaLa op switched off (``NALA_GEN_FUSED=0``): the
before/after of that op on the whole job. With ``--engines torch onnxruntime`` each NaLaSR point also runs through
onnxruntime: the network exported once (``nala-sr export-onnx``, not timed) and driven by the same engine (tiles,
blending), so the two runtimes are compared side by side on the same job. ESRT does not export to ONNX (see
:mod:`nala_gen.sr.interop.onnx_export`).

    nala-bench upscale [--models nalasr-light-x4 esrt-x4] [--sides 125 250 500] [--tiles auto 128]
                       [--engines torch torch_eager onnxruntime] [--keep-others]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from nala_gen.bench.common import machine_info, rows_not_rerun, run_stamp, write_cost_results
from nala_gen.bench.tables import Table, load, row
from nala_gen.bench.worker import limit_memory, run_fresh

# The measurement (each call a fresh process) and its points: MODELS × SIDES × TILES × ENGINES.
MEASURE = "nala_gen.bench.upscale_throughput:worker"
MODELS = ("nalasr-light-x4", "esrt-x4")
SIDES = (125, 250, 500)  # LR sides: 0.25, 1 and 4 megapixels out at x4
TILES = ("auto", "128")
ENGINES = ("torch", "torch_eager", "onnxruntime")


def sample_input(side: int):
    """The bundled sample (a held-out photo's x4 LR), resized to side x side with Pillow's bicubic."""
    import numpy as np
    from PIL import Image

    from nala_gen.sr.demo import SAMPLE

    with Image.open(SAMPLE) as img:
        return np.asarray(img.convert("RGB").resize((side, side), Image.BICUBIC))


def worker(
    model: str, side: int, tile: str, repeats: int, budget_mb: float, device: str, mem_limit: int, onnx: str | None
) -> dict:
    from nala_gen.sr.loading import load_sr_model
    from nala_gen.sr.upscale.engine import Upscaler

    if device == "cpu":
        limit_memory(mem_limit)
    if onnx:
        from nala_gen.sr.interop.onnx_export import OnnxSR

        net = OnnxSR(onnx)
    else:
        net, _ = load_sr_model(model, 4)
    engine = Upscaler(net, 4, device, tile=tile if tile == "auto" else int(tile), memory_budget=int(budget_mb * 2**20))
    img = sample_input(side)
    _, cold = engine.upscale(img)
    readouts = [engine.upscale(img)[1] for _ in range(repeats)]
    latency = statistics.median(r.latency_s for r in readouts)
    w, h = cold.output_size
    return {
        "status": "ok",
        "latency_s": latency,
        "runs_s": [r.latency_s for r in readouts],
        "cold_s": cold.latency_s,
        "output_megapixels": w * h / 1e6,
        "megapixels_per_s": w * h / 1e6 / latency,
        "peak_extra_bytes": max(r.peak_mem_bytes for r in readouts),
        "tiles": cold.tiles,
        "tile_size": cold.tile_size,
        "tokens_per_pass": cold.tokens,
        "precision": cold.precision,
    }


def onnx_file(model: str, folder: str) -> str | None:
    """The model exported to ONNX in ``folder`` (once, not timed), or None for a network that does not export."""
    from nala_gen.sr.interop.onnx_export import export_onnx
    from nala_gen.sr.loading import load_sr_model

    net, info = load_sr_model(model, 4)
    if info["arch"] != "NaLaSR":
        print(f"{model:<16} onnxruntime: skipped ({info['arch']} does not export to ONNX)", flush=True)
        return None
    path = str(Path(folder) / f"{model}.onnx")
    export_onnx(net, path)
    return path


def merged_rows(previous: list[dict], rows: list[dict]) -> list[dict]:
    """The new rows, then the previous rows of (model, engine) pairs not rerun (marked "earlier run" where they
    predate run stamps), in the order of MODELS and ENGINES."""
    kept = rows_not_rerun(previous, rows, lambda r: (r["model"], r.get("engine", "torch")))
    models = {m: i for i, m in enumerate(MODELS)}

    def order(r: dict) -> tuple:
        return models.get(r["model"], len(MODELS)), r["model"], ENGINES.index(r.get("engine", "torch"))

    # sorted() is stable: each pair's rows keep their tile/side order
    return sorted([*rows, *kept], key=order)


def point(args, model: str, engine: str, onnx: str | None, tile: str, side: int, limit: int) -> dict:
    """One fresh worker process: (model, engine, tile, side) -> its row."""
    kwargs = {"model": model, "side": side, "tile": tile, "repeats": args.repeats}
    kwargs.update({"budget_mb": args.memory_budget_mb, "device": args.device, "mem_limit": limit, "onnx": onnx})
    env = {"NALA_GEN_FUSED": "0" if engine == "torch_eager" else "1"}
    result = run_fresh(MEASURE, kwargs, env, timeout=args.timeout)
    series = f"{model}, tile {tile}" + (f", {engine}" if engine != "torch" else "")
    row = {"model": model, "engine": engine, "tile": tile, "series": series, "lr_side": side, "run": args.run}
    row.update({"tokens": side * side, "limit_bytes": limit, **result})
    shown = (
        f"{row['output_megapixels']:5.2f} MP out in {row['latency_s']:6.2f} s = "
        f"{row['megapixels_per_s']:.3f} MP/s, peak {row['peak_extra_bytes'] / 2**20:6.0f} MiB, "
        f"{row['tiles']} tile(s) of {row['tile_size'] or side}"
        if row["status"] == "ok"
        else f"{row['status']}: {row.get('note', '')[:90]}"
    )
    print(f"{model:<16} {engine:<11} tile {tile:<5} {side:>4}x{side:<4} {shown}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench upscale", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="named x4 weights")
    parser.add_argument("--sides", nargs="+", type=int, default=list(SIDES), help="square LR input sides")
    parser.add_argument("--tiles", nargs="+", default=list(TILES), help="auto, 0 (one pass) or a tile side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-budget-mb", type=float, default=4096, help="budget for --tile auto")
    parser.add_argument("--mem-limit-gb", type=float, default=16.0, help="memory cap per worker on CPU (GiB)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["torch", "onnxruntime"],
        choices=ENGINES,
        help="runtimes of the network (torch_eager: torch with the fused NaLa op off, i.e. before it)",
    )
    parser.add_argument(
        "--keep-others",
        action="store_true",
        help="rerun only --models x --engines and keep the other rows of the existing upscale_throughput.json",
    )
    args = parser.parse_args(argv)
    limit = int(args.mem_limit_gb * 2**30)

    args.run = run_stamp()
    rows = []
    with tempfile.TemporaryDirectory() as onnx_dir:
        runs = [
            (m, e, onnx_file(m, onnx_dir) if e == "onnxruntime" else None) for m in args.models for e in args.engines
        ]
        for model, engine, onnx in runs:
            if engine == "onnxruntime" and onnx is None:
                continue  # not exportable (ESRT)
            if engine == "torch_eager" and not model.startswith("nalasr"):
                continue  # no NaLa inside: nothing to compare
            for tile in args.tiles:
                for side in args.sides:
                    rows.append(point(args, model, engine, onnx, tile, side, limit))

    stem = "upscale_throughput" + ("" if args.device == "cpu" else f"_{args.device.split(':')[0]}")
    previous = args.out / f"{stem}.json"
    if args.keep_others and previous.is_file():
        rows = merged_rows(json.loads(previous.read_text())["rows"], rows)
    machine = machine_info(args.device)
    result = {
        "machine": machine,
        "scale": 4,
        "input": "assets/chelsea_lr_x4.png resized (Pillow bicubic) to each LR side",
        "repeats": args.repeats,
        "memory_budget_mb": args.memory_budget_mb,
        "run": args.run,
        "rows": rows,
    }
    where = "this CPU" if args.device == "cpu" else machine["device_name"]
    write_cost_results(
        args.out,
        stem,
        result,
        "series",
        "LR input pixels (x4; output = 16x)",
        f"nala-sr upscale end to end on {where} (auto tiles from a {args.memory_budget_mb:.0f} MiB budget)",
        "s",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def upscale_table() -> str:
    data = load("upscale_throughput.json")
    rows = data["rows"]
    lines = [
        f"`nala-sr upscale`'s engine, x4, {rows[0].get('precision', 'fp32')}, {data['machine']['threads']} threads; "
        f"median of {data['repeats']} runs after a warm-up, fresh process per point; input: {data['input']}; "
        f"`--tile auto` with a {data['memory_budget_mb']:.0f} MiB budget.",
        "",
        "| model | runtime | tiles | LR in | MP out | latency | output MP/s | peak memory | passes (tile) | run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        size = f"{r['lr_side']}x{r['lr_side']}"
        engine, run = r.get("engine", "torch"), r.get("run", "earlier run")
        if r["status"] != "ok":
            lines.append(row(r["model"], engine, r["tile"], size, "", r["status"], "", "", "", run))
            continue
        mp, latency, rate = f"{r['output_megapixels']:.2f}", f"{r['latency_s']:.2f} s", f"{r['megapixels_per_s']:.3f}"
        peak, passes = f"{r['peak_extra_bytes'] / 2**20:,.0f} MiB", f"{r['tiles']} ({r['tile_size'] or 'whole'})"
        lines.append(row(r["model"], engine, r["tile"], size, mp, latency, rate, peak, passes, run))
    return "\n".join(lines)


TABLES = (Table("upscale-throughput", ("upscale_throughput.json",), upscale_table),)
