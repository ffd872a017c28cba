"""The field's standard test sets: quality (``nala-bench sr-sets``) and the paper's Table 20 on this CPU
(``nala-bench sr-sets-cost``).

Both read the sets in BasicSR's layout (``datasets/<Set>/GTmod12``, ``LRbicx{s}``), made from a folder of HR images
by ``nala-sr prepare benchmarks SRC``; a set that is missing is one line naming the folder and that command.

``sr-sets``: PSNR / SSIM on Y with ``crop_border = scale`` (BasicSR's metric functions, MATLAB-bicubic LR and
bicubic row: :mod:`nala_gen.sr.evaluate`) of bicubic and every shipped SR weight of each scale, on each set, through
the upscaling engine: each image whole where its pass fits the memory budget, in blended tiles where not (ESRT's
softmax on Urban100; the JSON counts the tiled images per model). Beside them the JSON keeps the published rows of
ESRT and of lightweight networks users know (:data:`PUBLISHED`, each trained on DIV2K, as their papers say), so that
the generated table puts ours and theirs side by side with our gap to ESRT.

``sr-sets-cost``: the paper's Table 20 setting on the CPU: x4, per set, each image whole in one pass (no tiles),
the module's own ``net(x)`` in inference mode (NaLaSR and ESRT run their inference graph), fp32, one fresh process
per network and set (its memory capped, so an image that cannot fit is recorded, not the machine taken down): mean
latency per image and the peak memory above the loaded process (:class:`~nala_gen.profiling.PeakMemory`), the
largest image's. The paper measured on a GPU; its own figures are kept in the JSON beside ours.

    nala-bench sr-sets [--data datasets] [--sets Set5 Set14 B100 Urban100] [--scales 2 4]
    nala-bench sr-sets-cost [--sets ...] [--subset Urban100:10] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from nala_gen.bench.tables import captioned, cores

SETS = ("Set5", "Set14", "B100", "Urban100")
PREPARE = "nala-sr prepare benchmarks SRC (e.g. ../shared/datasets/benchmark)"

# Published PSNR / SSIM (Y, crop = scale) from each network's paper; every one trained on DIV2K's 800 pictures.
PUBLISHED = {
    "ESRT": {
        "source": "Lu et al., Transformer for Single Image Super-Resolution (ESRT), CVPRW 2022, Table 2",
        "params": "751K (x4)",
        "x2": {"Set5": (38.03, 0.9600), "Set14": (33.75, 0.9184), "B100": (32.25, 0.9001), "Urban100": (32.58, 0.9318)},
        "x4": {"Set5": (32.19, 0.8947), "Set14": (28.69, 0.7833), "B100": (27.69, 0.7379), "Urban100": (26.39, 0.7962)},
    },
    "IMDN": {
        "source": "Hui et al., Lightweight Image Super-Resolution with Information Multi-distillation Network, ACM MM "
        "2019, Table 3",
        "params": "715K (x4)",
        "x2": {"Set5": (38.00, 0.9605), "Set14": (33.63, 0.9177), "B100": (32.19, 0.8996), "Urban100": (32.17, 0.9283)},
        "x4": {"Set5": (32.21, 0.8948), "Set14": (28.58, 0.7811), "B100": (27.56, 0.7353), "Urban100": (26.04, 0.7838)},
    },
    "SwinIR-light": {
        "source": "Liang et al., SwinIR: Image Restoration Using Swin Transformer, ICCVW 2021, Table 3 (lightweight)",
        "params": "897K (x4)",
        "x2": {"Set5": (38.14, 0.9611), "Set14": (33.86, 0.9206), "B100": (32.31, 0.9012), "Urban100": (32.76, 0.9340)},
        "x4": {"Set5": (32.44, 0.8976), "Set14": (28.77, 0.7858), "B100": (27.69, 0.7406), "Urban100": (26.47, 0.7980)},
    },
}

# The paper's Table 20 (NaLaSR against ESRT, x4, on a GPU): latency per image (ms) and memory (GB).
PAPER_TABLE20 = {
    "source": "arXiv 2506.21137, Table 20 (GPU, x4)",
    "ESRT": {"Set5": (195, 3.0), "Set14": (188, 7.0), "B100": (79, 2.2), "Urban100": (195, 69.0)},
    "NaLaSR": {"Set5": (159, 2.3), "Set14": (147, 2.9), "B100": (72, 2.1), "Urban100": (124, 5.3)},
}
COST_MODELS = {"esrt": "esrt-x4", "nalasr": "nalasr-light-x4"}  # Table 20's pair, as shipped


def set_folder(data: Path, name: str, scale: int | None = None) -> Path:
    """``data/name``, checked to hold GTmod12 (and LRbicx{scale}); a missing one is a one-line error naming the
    command that makes it."""
    folder = data / name
    for needed in ("GTmod12", *([f"LRbicx{scale}"] if scale else [])):
        if not (folder / needed).is_dir():
            raise FileNotFoundError(f"{folder / needed} not found: make it with {PREPARE} {data}")
    return folder


def shipped_models(scale: int) -> list[str]:
    """The shipped SR weights of ``scale``, by name."""
    from nala_gen import weights as W

    return [c.name for c in W.list_weights("sr") if c.config.get("upscale", 4) == scale]


def training_facts(model: str) -> dict:
    """What a shipped weight saw in training, from its card: iterations, batch, LR patch, LR patches seen."""
    from nala_gen import weights as W

    try:
        info = W.resolve(model, task="sr").info
    except W.WeightsError:  # a checkpoint path: nothing on record
        return {}
    facts = {k: info[k] for k in ("iterations", "batch", "lr_patch", "trained_on", "hardware") if k in info}
    if "iterations" in facts and "batch" in facts:
        facts["samples"] = facts["iterations"] * facts["batch"]
    return facts


def quality_main(argv: list[str] | None = None) -> int:
    from nala_gen.bench.common import machine_info, run_stamp, write_json
    from nala_gen.fileio import check_writable
    from nala_gen.sr.evaluate import evaluate

    parser = argparse.ArgumentParser(prog="nala-bench sr-sets", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("datasets"), help="where the prepared sets are")
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--scales", nargs="+", type=int, default=[2, 4], choices=[2, 3, 4])
    parser.add_argument("--models", nargs="+", help="default: bicubic and every shipped SR weight of each scale")
    parser.add_argument("--memory-budget-mb", type=float, default=4096, help="per image pass, for --tile auto")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--update",
        action="store_true",
        help="score only --models (e.g. newly shipped weights) and keep every other row of the existing sr_sets.json; "
        "the file records when each model was scored",
    )
    args = parser.parse_args(argv)
    if args.update and not args.models:
        parser.error("--update needs --models: the weights to score again")
    folders = {(s, name): set_folder(args.data, name, s) for s in args.scales for name in args.sets}
    target = check_writable(args.out / "sr_sets.json")
    run = run_stamp()
    result = {
        "machine": machine_info("cpu"),
        "run": run,
        "metric": "PSNR / SSIM on Y, crop_border = scale (BasicSR's calculate_psnr / calculate_ssim)",
        "memory_budget_mb": args.memory_budget_mb,
        "published": PUBLISHED,
        "scales": {},
        "trained": {},
        "scored": {},  # model -> the run that scored it
    }
    if args.update and target.is_file():
        kept = json.loads(target.read_text())
        result.update(scales=kept["scales"], trained=kept.get("trained", {}))
        every = {m for block in kept["scales"].values() for row in block.values() for m in row}
        result["scored"] = kept.get("scored") or {m: kept["run"] for m in sorted(every)}
    for scale in args.scales:
        models = args.models or ["bicubic", *shipped_models(scale)]
        result["trained"].update({m: training_facts(m) for m in models if m != "bicubic"})
        result["scored"].update({m: run for m in models})
        block = result["scales"].setdefault(f"x{scale}", {})
        for name in args.sets:
            start = time.perf_counter()
            scores = evaluate(
                folders[scale, name], scale, models, tile="auto", memory_budget=int(args.memory_budget_mb * 2**20)
            )
            block.setdefault(name, {}).update(
                {model: {k: r[k] for k in ("psnr", "ssim", "images", "tiled_images")} for model, r in scores.items()}
            )
            shown = "  ".join(f"{m} {r['psnr']:.2f}/{r['ssim']:.4f}" for m, r in scores.items())
            print(f"x{scale} {name:<9} {shown}  ({time.perf_counter() - start:.0f} s)", flush=True)
            write_json(target, result, quiet=True)  # after each set: a long run keeps what it measured
    print(f"wrote {target}")
    return 0


def _subset(paths: list[Path], count: int | None) -> list[Path]:
    """``count`` images spread evenly over the sorted set (all of them without a count)."""
    if not count or count >= len(paths):
        return paths
    return [paths[round(i * (len(paths) - 1) / (count - 1))] for i in range(count)] if count > 1 else paths[:1]


def cost_worker(model: str, folder: str | Path, count: int | None, mem_limit: int) -> dict:
    """One network on one set's x4 LR images in this (fresh) process: per image the latency of one whole pass and
    the peak memory above the process before it; an image that does not fit under ``mem_limit`` is recorded as
    out of memory and the next one runs."""
    import numpy as np
    import torch

    from nala_gen.bench.worker import limit_memory
    from nala_gen.profiling import PeakMemory, current_rss
    from nala_gen.sr.data import list_images, read_rgb
    from nala_gen.sr.loading import load_sr_model

    net = load_sr_model(COST_MODELS[model], 4)[0].eval().to(memory_format=torch.channels_last)
    paths = _subset(list_images(Path(folder) / "LRbicx4"), count)
    images = [torch.from_numpy(np.ascontiguousarray(read_rgb(p).transpose(2, 0, 1))).float().div(255) for p in paths]
    limit_memory(mem_limit)
    rows = []
    with torch.inference_mode():
        net(torch.rand(1, 3, 24, 24).contiguous(memory_format=torch.channels_last))  # warm-up: oneDNN, the op
        for path, img in zip(paths, images, strict=True):
            x = img[None].contiguous(memory_format=torch.channels_last)
            row = {"image": path.stem, "lr": [x.shape[3], x.shape[2]], "tokens": x.shape[2] * x.shape[3]}
            try:
                with PeakMemory("cpu") as memory:
                    start = time.perf_counter()
                    net(x)
                    seconds = time.perf_counter() - start
            except (MemoryError, RuntimeError) as err:  # RLIMIT_DATA: a failed allocation, the process intact
                if "memory" not in str(err).lower() and not isinstance(err, MemoryError):
                    raise
                rows.append({**row, "status": "oom"})
                continue
            rows.append({**row, "status": "ok", "latency_s": seconds, "peak_bytes": memory.peak_bytes})
    return {"status": "ok", "images": rows, "loaded_rss_bytes": current_rss()}


def summarise(images: list[dict]) -> dict:
    """A set's row: mean latency, the largest peak, and what did not fit (the largest image that did)."""
    ok = [r for r in images if r["status"] == "ok"]
    summary = {"images": len(images), "ran": len(ok)}
    if ok:
        summary["mean_latency_s"] = statistics.mean(r["latency_s"] for r in ok)
        summary["peak_bytes"] = max(r["peak_bytes"] for r in ok)
        largest = max(ok, key=lambda r: r["tokens"])
        summary["largest_ran"] = {"image": largest["image"], "lr": largest["lr"]}
    failed = [r for r in images if r["status"] != "ok"]
    if failed:
        summary["out_of_memory"] = [r["image"] for r in failed]
    return summary


def cost_main(argv: list[str] | None = None) -> int:
    from nala_gen.bench.common import machine_info, run_stamp, write_json
    from nala_gen.bench.worker import run_fresh
    from nala_gen.fileio import check_writable
    from nala_gen.sr.data import list_images

    parser = argparse.ArgumentParser(prog="nala-bench sr-sets-cost", description="The paper's Table 20 on this CPU.")
    parser.add_argument("--data", type=Path, default=Path("datasets"))
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--models", nargs="+", default=list(COST_MODELS), choices=list(COST_MODELS))
    parser.add_argument(
        "--subset",
        nargs="+",
        default=[],
        metavar="SET:N",
        help="time N images of SET spread evenly over it (both networks the same ones), e.g. Urban100:10",
    )
    parser.add_argument("--rounds", type=int, default=1, help="fresh processes per network and set, alternated")
    parser.add_argument("--mem-limit-gb", type=float, default=20.0, help="memory cap per worker (GiB)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    limit = int(args.mem_limit_gb * 2**30)
    counts = {}
    for spec in args.subset:
        name, _, number = spec.partition(":")
        if not number.isdigit() or int(number) < 1:
            raise ValueError(f"--subset {spec}: expected SET:N with N at least 1, e.g. Urban100:10")
        counts[name] = int(number)
    folders = {name: set_folder(args.data, name, 4) for name in args.sets}
    target = check_writable(args.out / "sr_sets_cost.json")
    result = {
        "machine": machine_info("cpu"),
        "run": run_stamp(),
        "scale": 4,
        "rounds": args.rounds,
        "mem_limit_bytes": limit,
        "models": {m: COST_MODELS[m] for m in args.models},
        "paper": PAPER_TABLE20,
        "set_images": {name: len(list_images(folder / "GTmod12")) for name, folder in folders.items()},
        "subsets": counts,  # SET: N images spread evenly over it, the same for both networks
        "sets": {},
    }
    for name, folder in folders.items():
        measured: dict[str, list[dict]] = {m: [] for m in args.models}
        for round_index in range(max(1, args.rounds)):
            for model in args.models if round_index % 2 == 0 else args.models[::-1]:
                kwargs = {"model": model, "folder": str(folder), "count": counts.get(name), "mem_limit": limit}
                measured[model].append(run_fresh("nala_gen.bench.sr_sets:cost_worker", kwargs, timeout=args.timeout))
        block = result["sets"][name] = {}
        for model, runs in measured.items():
            failed = [r for r in runs if r["status"] != "ok"]
            if failed:
                block[model] = failed[0]
                continue
            # per image, the median over rounds; the set's row from those
            images = [
                {**r, "latency_s": statistics.median(run["images"][i]["latency_s"] for run in runs)}
                if r["status"] == "ok" and all(run["images"][i]["status"] == "ok" for run in runs)
                else {**r, "status": "oom"}
                for i, r in enumerate(runs[0]["images"])
            ]
            block[model] = {**summarise(images), "per_image": images}
            row = block[model]
            shown = (
                f"{row['mean_latency_s'] * 1e3:8.1f} ms/image  peak {row['peak_bytes'] / 2**20:8,.0f} MiB"
                if row["ran"]
                else "nothing ran"
            )
            print(f"{name:<9} {model:<7} {row['ran']}/{row['images']} images  {shown}", flush=True)
        write_json(target, result, quiet=True)  # after each set: a long run keeps what it measured
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(quality_main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON these two commands write, declared for scripts/results_tables.py.


def _cell(psnr: float, ssim: float) -> str:
    return f"{psnr:.2f} / {ssim:.4f}"


def quality_table(result: dict, scale: str) -> str:
    """PSNR / SSIM per set at ``scale`` (``x4``): bicubic, ours, our gap to published ESRT, the published rows."""
    measured = result["scales"][scale]
    sets = list(measured)
    models = list(dict.fromkeys(m for row in measured.values() for m in row))
    published = {name: p for name, p in result["published"].items() if scale in p}
    lines = [
        "| " + " | ".join(["network", "trained on", *sets]) + " |",
        "|---|---|" + "---|" * len(sets),
    ]
    for model in models:
        if model == "bicubic":
            trained = "–"
        else:
            facts = result.get("trained", {}).get(model, {})
            seen = f"{facts['samples']:,} LR patches of {facts['lr_patch']}²" if "samples" in facts else "see its card"
            trained = f"this project's CPU training ({seen})"
        cells = [_cell(measured[s][model]["psnr"], measured[s][model]["ssim"]) for s in sets]
        tiled = sum(measured[s][model].get("tiled_images", 0) for s in sets)
        name = f"`{model}`" if model != "bicubic" else "bicubic"
        lines.append(f"| {name}{' (tiled†)' if tiled else ''} | {trained} | " + " | ".join(cells) + " |")
    esrt = published.get("ESRT", {}).get(scale, {})
    for model in models:
        if model != "bicubic" and all(s in esrt for s in sets):
            gaps = [f"{measured[s][model]['psnr'] - esrt[s][0]:+.2f} dB" for s in sets]
            lines.append(f"| `{model}` − published ESRT | | " + " | ".join(gaps) + " |")
    for name, p in published.items():
        cells = [_cell(*p[scale][s]) if s in p[scale] else "–" for s in sets]
        lines.append(f"| {name} (published, {p['params']} params) | DIV2K (800 pictures) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(result: dict) -> str:
    """The paper's Table 20 on this CPU beside the paper's own (GPU) rows: latency per image and peak memory per
    set, and the SAVE row (what NaLaSR saves against ESRT, in %)."""
    sets = list(result["sets"])
    paper = result["paper"]
    lines = ["| | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]

    def ours(model: str, name: str) -> str:
        row = result["sets"][name].get(model, {})
        if not row.get("ran"):
            return row.get("status", "not run")
        cell = f"{row['mean_latency_s'] * 1e3:,.0f} ms / {row['peak_bytes'] / 2**30:.2f} GiB"
        if row["ran"] < row["images"] or "out_of_memory" in row:
            largest = row["largest_ran"]
            cell += f" ({row['ran']} of {row['images']} fit; largest {largest['lr'][0]}x{largest['lr'][1]} LR)"
        return cell

    def saved(name: str) -> str:
        esrt, nalasr = result["sets"][name].get("esrt", {}), result["sets"][name].get("nalasr", {})
        if not (esrt.get("ran") and nalasr.get("ran")) or esrt["ran"] != nalasr["ran"]:
            return "–"
        latency = 100 * (1 - nalasr["mean_latency_s"] / esrt["mean_latency_s"])
        memory = 100 * (1 - nalasr["peak_bytes"] / esrt["peak_bytes"])
        return f"{latency:.1f} % / {memory:.1f} %"

    def counts(name: str) -> str:
        row = result["sets"][name].get("nalasr") or result["sets"][name].get("esrt") or {}
        timed, whole = row.get("images", "–"), result.get("set_images", {}).get(name)
        return f"{timed} of {whole} (spread evenly)" if whole and timed != whole else str(timed)

    lines.append("| images timed | " + " | ".join(counts(s) for s in sets) + " |")
    lines.append("| ESRT latency / peak (this CPU) | " + " | ".join(ours("esrt", s) for s in sets) + " |")
    lines.append("| NaLaSR latency / peak (this CPU) | " + " | ".join(ours("nalasr", s) for s in sets) + " |")
    lines.append("| saved (latency / memory, this CPU) | " + " | ".join(saved(s) for s in sets) + " |")
    for model in ("ESRT", "NaLaSR"):
        cells = [f"{paper[model][s][0]} ms / {paper[model][s][1]} G" if s in paper[model] else "–" for s in sets]
        lines.append(f"| {model} (paper, GPU) | " + " | ".join(cells) + " |")
    paper_saved = [
        f"{100 * (1 - paper['NaLaSR'][s][0] / paper['ESRT'][s][0]):.1f} % / "
        f"{100 * (1 - paper['NaLaSR'][s][1] / paper['ESRT'][s][1]):.1f} %"
        if s in paper["ESRT"]
        else "–"
        for s in sets
    ]
    lines.append("| saved (paper, GPU) | " + " | ".join(paper_saved) + " |")
    return "\n".join(lines)


def quality_caption(result: dict, scale: str) -> str:
    models = {m for row in result["scales"][scale].values() for m in row}
    earlier = sorted({f"`{m}` {r}" for m, r in result.get("scored", {}).items() if m in models and r != result["run"]})
    return (
        f"`nala-bench sr-sets` ({result['run']}; {cores(result['machine'])}): PSNR / SSIM on Y, crop = scale, "
        f"{scale}. Ours are the shipped weights; the published rows are each paper's own figures for networks "
        "trained on DIV2K."
        + (f" Scored in an earlier run (`--update` kept them): {', '.join(earlier)}." if earlier else "")
    )


def cost_caption(result: dict) -> str:
    return (
        f"`nala-bench sr-sets-cost` ({result['run']}; {cores(result['machine'])}, torch {result['machine']['torch']}; "
        f"each network and set in a fresh process capped at {result['mem_limit_bytes'] / 2**30:.0f} GiB): x4, every "
        "image whole in one pass, mean latency per image / peak memory above the loaded process (the set's largest)."
    )


TABLES = (
    *(
        captioned(
            f"sr-sets-{scale}",
            "sr_sets.json",
            partial(quality_caption, scale=scale),
            partial(quality_table, scale=scale),
        )
        for scale in ("x4", "x2")
    ),
    captioned("sr-sets-cost", "sr_sets_cost.json", cost_caption, cost_table),
)
