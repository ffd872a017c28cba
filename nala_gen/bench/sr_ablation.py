"""Equal-budget ablation of NaLaSR's attention: one network field changed, everything else identical.

Each variant is trained by BasicSR from the ×4 mini option file (same data, seed, batch, patch size, optimiser
and loss; only ``network_g`` fields of the variant, the run name and the budget change, and the budget brings its
own short-run schedule: no EMA, LR halved at 1/2, 3/4 and 11/12 of it), then scored on the embedded validation
split (PSNR/SSIM on Y, crop = scale, the same code as ``nala-sr evaluate``). ``emha`` is ESRT itself (the same
layout with its split-softmax attention).

    nala-bench sr-ablation [--iters 1000] [--variants nala emha softmax relu elu1] [--out benchmarks/results]

Runs are kept under ``experiments/`` as ``ablation_x4_<variant>_<iters>it``; a finished run is not trained again
and an interrupted one resumes (BasicSR's ``--auto_resume``), so the command can be rerun after a stop. Each run
writes its result next to its checkpoints; the summary JSON and PNG gather every finished run of the budget.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

BASE_OPTION = Path("options/train/NaLaSR/train_NaLaSR_light_x4_mini.yml")
ESRT_NETWORK = {"type": "ESRT", "upscale": 4, "num_feat": 32, "num_block": 3, "num_et": 1, "num_heads": 8}
# variant -> network_g fields it changes (a "type" replaces the whole network_g)
VARIANTS: dict[str, dict] = {
    "nala": {},
    "nala_key_direction": {"kernel_options": {"key_map": "direction"}},
    "nala_angle_sqrt_d": {"kernel_options": {"angle_scale": "sqrt_d"}},
    "nala_split": {"attn_type": "nala_split"},
    "emha": ESRT_NETWORK,
    "softmax": {"attn_type": "softmax"},
    "relu": {"attn_type": "relu"},
    "elu1": {"attn_type": "elu1"},
    "no_rope": {"rope": False},
    "no_lepe": {"lepe": False},
    "no_gate": {"gate": False},
}
DEFAULT_VARIANTS = ("nala", "nala_key_direction", "emha", "softmax", "relu", "elu1")
# The short-run schedule, fixed here rather than scaled from the base file so a longer shipped run does not move it.
MILESTONE_FRACTIONS = (1 / 2, 3 / 4, 11 / 12)
VAL_DATA = Path("datasets/mini/val")


def run_name(variant: str, iters: int) -> str:
    return f"ablation_x4_{variant}_{iters}it"


def ablation_option(base: dict, variant: str, iters: int) -> dict:
    """The base options with only the variant's network fields, the name and the budget (with its schedule)
    changed."""
    opt = json.loads(json.dumps(base))  # deep copy of plain YAML data
    opt["name"] = run_name(variant, iters)
    change = VARIANTS[variant]
    opt["network_g"] = dict(change) if "type" in change else {**opt["network_g"], **change}
    opt["train"]["total_iter"] = iters
    opt["train"]["scheduler"]["milestones"] = [round(f * iters) for f in MILESTONE_FRACTIONS]
    # A 0.999 EMA over a few hundred iterations is still mostly its random init.
    opt["train"]["ema_decay"] = 0
    opt["val"]["val_freq"] = iters
    opt["logger"]["save_checkpoint_freq"] = min(base["logger"]["save_checkpoint_freq"], iters)
    return opt


def train_one(variant: str, iters: int, root: Path) -> dict:
    """Train (or resume, or reuse) one run and score its final weights; returns its result row."""
    from nala_gen.sr.evaluate import evaluate

    name = run_name(variant, iters)
    run_dir = root / "experiments" / name
    result_path = run_dir / "ablation_result.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    option_path = root / "experiments" / f"{name}.yml"
    option_path.parent.mkdir(parents=True, exist_ok=True)
    option_path.write_text(yaml.safe_dump(ablation_option(yaml.safe_load(BASE_OPTION.read_text()), variant, iters)))
    states = run_dir / "training_states"
    resumed = states.is_dir() and any(states.iterdir())
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "nala_gen.sr.train", "-opt", str(option_path), "--auto_resume"]
    # BasicSR logs every line to experiments/NAME/*.log as well; keep the console to one line per run.
    proc = subprocess.run(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise RuntimeError(f"training {name} failed: {tail[0]} (log under {run_dir})")
    train_s = time.perf_counter() - start
    checkpoint = run_dir / "models" / "net_g_latest.pth"  # BasicSR writes it when training ends
    scores = evaluate(root / VAL_DATA, 4, [str(checkpoint)], option=option_path)[str(checkpoint)]
    row = {
        "variant": variant,
        "network_g": VARIANTS[variant],
        "iters": iters,
        "psnr": round(scores["psnr"], 3),
        "ssim": round(scores["ssim"], 4),
        # Wall time of an uninterrupted run on this machine (None when it was resumed across sessions).
        "train_wall_s": None if resumed else round(train_s, 1),
    }
    result_path.write_text(json.dumps(row, indent=1))
    return row


def plot(rows: list[dict], bicubic: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=110)
    ax.bar([r["variant"] for r in rows], [r["psnr"] for r in rows], color="tab:blue")
    ax.axhline(bicubic, color="gray", linestyle="--", label=f"bicubic {bicubic:.2f} dB")
    low = min([bicubic, *(r["psnr"] for r in rows)]) - 0.3
    ax.set_ylim(low, max(r["psnr"] for r in rows) + 0.2)
    for i, r in enumerate(rows):
        ax.text(i, r["psnr"] + 0.02, f"{r['psnr']:.2f}", ha="center", fontsize=8)
    ax.set_ylabel("PSNR-Y (dB), mini val, x4")
    ax.set_title(f"NaLaSR-light, attention ablation ({rows[0]['iters']} iterations each)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench sr-ablation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=1000, help="training iterations per attention type")
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not (VAL_DATA / "GTmod12").is_dir():
        print(f"no validation split at {VAL_DATA}: run `nala-sr prepare mini` first", file=sys.stderr)
        return 1
    from nala_gen.sr.evaluate import evaluate

    root = Path.cwd()
    for variant in args.variants:
        row = train_one(variant, args.iters, root)
        print(f"{variant:<18} {row['iters']} iters  PSNR {row['psnr']:.3f} dB  SSIM {row['ssim']:.4f}", flush=True)
    done = [root / "experiments" / run_name(v, args.iters) / "ablation_result.json" for v in VARIANTS]
    rows = [json.loads(p.read_text()) for p in done if p.is_file()]
    bicubic = evaluate(root / VAL_DATA, 4, ["bicubic"])["bicubic"]
    summary = {
        "budget": {"iters": args.iters, "base_option": str(BASE_OPTION), "val_data": str(VAL_DATA)},
        "bicubic": {"psnr": round(bicubic["psnr"], 3), "ssim": round(bicubic["ssim"], 4)},
        "runs": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sr_ablation.json").write_text(json.dumps(summary, indent=1))
    plot(rows, summary["bicubic"]["psnr"], args.out / "sr_ablation.png")
    print(f"wrote {args.out / 'sr_ablation.json'} and {args.out / 'sr_ablation.png'}")
    return 0
