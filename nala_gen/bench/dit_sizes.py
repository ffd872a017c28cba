"""Where linear attention starts to pay in diffusion on this CPU: one sampling step of the shipped NaLaDiT against
its softmax twin as the image grows.

``nala-bench dit-sizes`` times one DDPM step of each named pipeline at each image side: the transformer's call on
a classifier-free-guidance batch (``--batch`` conditional + as many unconditional samples) and the scheduler's
``step``, in inference mode, fp32. The shipped digits models were trained at 16 px; they run at any side (sin-cos
positions and RoPE are computed for the grid), and a step's cost does not depend on what the weights learned, so
the larger sides measure the architecture at 4x the tokens per doubling (patch 2: 32 px = 256 tokens, 64 px = 1,024,
128 px = 4,096). The two models differ only in their attention kernel (the same block parts around it).

Each (model, side) point is a fresh process; ``--rounds`` alternates the models round by round (this VM's speed
drifts between processes), and a row is its median process, keeping every round's latency. JSON + PNG.

    nala-bench dit-sizes [--models naladit-digits-block naladit-digits-softmax-block] [--sides 32 64 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from nala_gen.bench.common import machine_info
from nala_gen.bench.tables import Table, cores, load, row
from nala_gen.bench.worker import run_fresh

# The measurement (each call a fresh process) and its points: MODELS × SIDES.
MEASURE = "nala_gen.bench.dit_sizes:worker"
MODELS = ("naladit-digits-block", "naladit-digits-softmax-block")
SIDES = (32, 64, 128)


def worker(model: str, side: int, batch: int, repeats: int) -> dict:
    """One model at one side in this (fresh) process: the median of ``repeats`` steps after a warm-up."""
    import torch

    from nala_gen.diffusion.loading import load_pipeline

    torch.manual_seed(0)
    pipe, _ = load_pipeline(model)
    transformer, scheduler = pipe.transformer.eval(), pipe.scheduler
    config = transformer.config
    scheduler.set_timesteps(50)
    t = scheduler.timesteps[len(scheduler.timesteps) // 2]
    latents = torch.randn(batch, config.in_channels, side, side)
    labels = torch.cat([torch.arange(batch) % config.num_classes, torch.full((batch,), config.num_classes)])

    def step() -> None:
        with torch.inference_mode():
            out = transformer(torch.cat([latents, latents]), t.expand(2 * batch), labels)
            sample = out.sample if hasattr(out, "sample") else out[0]
            cond, uncond = sample.chunk(2)
            scheduler.step(uncond + 2.0 * (cond - uncond), t, latents)

    step()  # warm-up: allocator, oneDNN primitives for these shapes
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        runs.append(time.perf_counter() - start)
    grid = side // config.patch_size
    return {
        "status": "ok",
        "latency_s": statistics.median(runs),
        "runs_s": runs,
        "tokens": grid * grid,
        "kernel": config.kernel,
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for model in dict.fromkeys(r["model"] for r in rows):
        ok = [r for r in rows if r["model"] == model and r["status"] == "ok"]
        ax.loglog([r["tokens"] for r in ok], [r["latency_s"] * 1e3 for r in ok], marker="o", label=model)
    ax.set_xlabel("image tokens per sample (patch 2)")
    ax.set_ylabel("one DDPM step, median (ms)")
    ax.set_title("NaLaDiT vs its softmax twin, one step (CFG batch), this CPU", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench dit-sizes", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--sides", nargs="+", type=int, default=list(SIDES))
    parser.add_argument("--batch", type=int, default=4, help="conditional samples (as many unconditional ride along)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per point, models alternated")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)

    rounds: dict[tuple[str, int], list[dict]] = {}
    for side in args.sides:
        for r in range(args.rounds):
            for model in args.models if r % 2 == 0 else reversed(args.models):
                kwargs = {"model": model, "side": side, "batch": args.batch, "repeats": args.repeats}
                result = run_fresh(MEASURE, kwargs)
                rounds.setdefault((model, side), []).append(result)
                shown = f"{result['latency_s'] * 1e3:.1f} ms" if result["status"] == "ok" else result.get("note", "")
                print(f"{side:>4} px  round {r + 1}  {model:<28} {shown}", flush=True)
    rows = []
    for (model, side), results in rounds.items():
        ok = sorted((res for res in results if res["status"] == "ok"), key=lambda res: res["latency_s"])
        if not ok:
            rows.append({"model": model, "side": side, **results[-1]})
            continue
        row = {"model": model, "side": side, **ok[len(ok) // 2]}  # the median process
        row["rounds_s"] = [res["latency_s"] for res in results if res["status"] == "ok"]
        rows.append(row)
    result = {
        "machine": machine_info("cpu"),
        "batch": args.batch,
        "cfg_batch": 2 * args.batch,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "rows": rows,
    }
    if len(args.models) == 2:  # the twin over NaLaDiT, round by round (paired: the same round's two processes)
        nala, other = args.models
        result["ratio_rounds"] = {
            str(side): [b / a for a, b in zip(*(rounds_s(rows, m, side) for m in (nala, other)))] for side in args.sides
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dit_sizes.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "dit_sizes.png")
    print(f"wrote {args.out / 'dit_sizes.json'} and .png")
    return 0


def rounds_s(rows: list[dict], model: str, side: int) -> list[float]:
    return next((r.get("rounds_s", []) for r in rows if r["model"] == model and r["side"] == side), [])


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def dit_sizes_table() -> str:
    """One DDPM step of NaLaDiT and its softmax twin as the image grows (nala-bench dit-sizes)."""
    data = load("dit_sizes.json")
    rows = {(r["model"], r["side"]): r for r in data["rows"] if r["status"] == "ok"}
    models = list(dict.fromkeys(r["model"] for r in data["rows"]))
    sides = sorted({r["side"] for r in data["rows"]})
    lines = [
        f"One step (a CFG batch of {data['cfg_batch']}: the transformer's call and the scheduler's step), fp32, "
        f"{cores(data['machine'])}; median of {data['repeats']} steps per process, the median of "
        f"{data['rounds']} processes per point with the models alternated round by round.",
        "",
        "| image side | tokens | " + " | ".join(f"`{m}`" for m in models) + " | softmax / NaLa, by round |",
        "|---|---|" + "---|" * len(models) + "---|",
    ]
    for side in sides:
        cells = [f"{rows[(m, side)]['latency_s'] * 1e3:.1f} ms" if (m, side) in rows else "–" for m in models]
        ratios = sorted(data.get("ratio_rounds", {}).get(str(side), []))
        shown = f"{ratios[(len(ratios) - 1) // 2]:.2f}× ({', '.join(f'{x:.2f}' for x in ratios)})" if ratios else "–"
        tokens = next((rows[(m, side)]["tokens"] for m in models if (m, side) in rows), "–")
        lines.append(row(f"{side} px", f"{tokens:,}" if tokens != "–" else tokens, *cells, shown))
    return "\n".join(lines)


TABLES = (Table("dit-sizes", ("dit_sizes.json",), dit_sizes_table),)
