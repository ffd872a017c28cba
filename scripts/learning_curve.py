"""A BasicSR run's learning curve: validation PSNR per set against LR patches seen, from its logs.

    python scripts/learning_curve.py experiments/NaLaSR_light_x4_sets --start nalasr-light-x4 \\
        --target Set5=31.8 --target Urban100=25.6 --out benchmarks/results/sr_learning_curve_x4

Reads every ``*.log`` of the run folder (a resumed run writes one per start; later logs win for an iteration they
repeat), takes each ``Validation <set>`` block's ``# psnr`` at the training iteration logged before it, and writes
``OUT.json`` and ``OUT.png``: PSNR against samples seen (iterations x the option file's batch). ``--start NAME``
puts the starting weights' PSNR (``benchmarks/results/sr_sets.json``, same scale) at zero samples. ``--target
SET=dB`` draws the target and projects, from a straight line through the last points against log(samples), the
samples at which it would be reached (a projection, stated as one; None where the curve is not rising).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ITER = re.compile(r"iter:\s*([\d,]+)")
VALIDATION = re.compile(r"Validation (\S+)")
PSNR = re.compile(r"# psnr: ([\d.]+)")


def read_curve(run: Path) -> dict[str, dict[int, float]]:
    """{set: {iteration: PSNR}} from the run's logs, oldest log first."""
    curve: dict[str, dict[int, float]] = {}
    for log in sorted(run.glob("*.log")):
        iteration, current = 0, None
        for line in log.read_text().splitlines():
            if (m := ITER.search(line)) and "Validation" not in line and "Best" not in line:
                iteration = int(m.group(1).replace(",", ""))
            if m := VALIDATION.search(line):
                current = m.group(1).rstrip(",")
            elif current and (m := PSNR.search(line)):
                curve.setdefault(current, {})[iteration] = float(m.group(1))
                current = None
    return curve


def projection(points: list[tuple[int, float]], target: float, last: int = 4) -> float | None:
    """Samples at which a straight line through the last ``last`` (samples, PSNR) points against log(samples)
    reaches ``target``; None where it does not rise or there are fewer than two points."""
    points = [(s, p) for s, p in points if s > 0][-last:]
    if len(points) < 2:
        return None
    xs, ys = [math.log(s) for s, _ in points], [p for _, p in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    if slope <= 0:
        return None
    return math.exp(mean_x + (target - mean_y) / slope)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="the run's folder (experiments/NAME)")
    parser.add_argument("--start", help="the weights the run started from: their sr_sets.json row is sample 0")
    parser.add_argument("--target", action="append", default=[], metavar="SET=dB")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.png")
    args = parser.parse_args(argv)
    options = sorted(args.run.glob("*.yml"))
    if not options:
        print(f"learning_curve: error: no option file in {args.run}", file=sys.stderr)
        return 1
    opt = yaml.safe_load(options[0].read_text())
    batch, scale = opt["datasets"]["train"]["batch_size_per_gpu"], opt["scale"]
    patch = opt["datasets"]["train"]["gt_size"] // scale
    curve = read_curve(args.run)
    series = {name: [(it * batch, psnr) for it, psnr in sorted(points.items())] for name, points in curve.items()}
    if args.start:
        sets = json.loads((ROOT / "benchmarks" / "results" / "sr_sets.json").read_text())["scales"][f"x{scale}"]
        for name in series:
            if name in sets and args.start in sets[name]:
                series[name].insert(0, (0, sets[name][args.start]["psnr"]))
    targets = {name: float(db) for name, _, db in (t.partition("=") for t in args.target)}
    result = {
        "run": str(args.run),
        "scale": scale,
        "batch": batch,
        "lr_patch": patch,
        "start": args.start,
        "series": {name: [{"samples": s, "psnr": p} for s, p in points] for name, points in series.items()},
        "targets": targets,
        "projected_samples": {name: projection(series.get(name, []), db) for name, db in targets.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series) or 1, figsize=(5 * max(1, len(series)), 3.6), squeeze=False)
    for ax, (name, points) in zip(axes[0], series.items()):
        ax.plot([s for s, _ in points], [p for _, p in points], marker="o")
        if name in targets:
            ax.axhline(targets[name], color="gray", linestyle="--", label=f"target {targets[name]} dB")
            ax.legend(fontsize=8)
        ax.set_title(f"{name}, x{scale}")
        ax.set_xlabel(f"LR patches of {patch}² seen")
        ax.set_ylabel("PSNR (Y, dB)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{args.run.name}: validation PSNR against samples seen")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    plt.close(fig)
    for name, points in series.items():
        shown = ", ".join(f"{s:,}: {p:.2f}" for s, p in points)
        print(f"{name}: {shown}")
    for name, samples in result["projected_samples"].items():
        shown = f"projected at ~{samples:,.0f} samples" if samples else "no projection (too few points, or falling)"
        print(f"{name} target {targets[name]} dB: {shown}")
    print(f"wrote {args.out.with_suffix('.json')} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
