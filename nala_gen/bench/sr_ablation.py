"""Equal-budget ablation of NaLaSR's attention: one network field changed, everything else identical.

Each variant is trained by BasicSR from the ×4 mini option file (same data, seed, batch, patch size, optimiser
and loss; only ``network_g`` fields of the variant, the run name and the budget change, and the budget brings its
own short-run schedule: no EMA, LR halved at 1/2, 3/4 and 11/12 of it), then scored on the embedded validation
split (PSNR/SSIM on Y, crop = scale, the same code as ``nala-sr evaluate``). ``emha`` is ESRT itself (the same
layout with its split-softmax attention). ``srvgg``, ``edsr`` and ``swinir`` are the peers people run (BasicSR's
SRVGGNetCompact, EDSR-baseline, SwinIR-light), trained the same way for the peer board; they are not in the
default set.

    nala-bench sr-ablation [--iters 1000] [--seeds 0 1 2] [--variants nala emha relu ...] [--photos] [--report-only]

Runs are kept under ``experiments/`` as ``ablation_x4_<variant>_<iters>it_seed<seed>``; an interrupted one resumes
(BasicSR's ``--auto_resume``), so the command can be rerun after a stop. A finished run's result row goes to a
ledger, ``benchmarks/results/sr_ablation_runs/<run>.json``, which is committed: a run in the ledger is not trained
again, even in a checkout without ``experiments/`` (the checkpoints are a cache, the ledger is the record). The
summary JSON and PNG gather every ledger row of the budget: per variant the mean and sample standard deviation
over its seeds, and against ``nala`` (the paper's) the difference of means with its standard error, flagged
where it exceeds two standard errors.
Where the photo set is built (``nala-sr prepare photos``), every new run is also scored on its held-out split;
``--photos`` adds those figures to runs finished before, retraining a run from its seeded option where its
checkpoint is gone (its rerun's mini-val PSNR is kept beside the recorded one). The summary then has a
``photos`` block of the same statistics over the runs scored there.
``--report-only`` rebuilds them from finished runs without training anything. Several invocations may run side by
side (one per core, e.g. with the seeds in another order): a run being trained by a live process is locked
(``experiments/<run>.lock`` holds its pid) and the others pass it by.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from nala_gen.bench.ablation_runs import Busy, run_lock, seed_statistics, write_row
from nala_gen.bench.peers import PEERS, PUBLISHED_X4, peer_network
from nala_gen.bench.tables import Table, load, row

BASE_OPTION = Path("options/train/NaLaSR/train_NaLaSR_light_x4_mini.yml")
ESRT_NETWORK = {"type": "ESRT", "upscale": 4, "num_feat": 32, "num_block": 3, "num_et": 1, "num_heads": 8}
# variant -> network_g fields it changes (a "type" replaces the whole network_g)
VARIANTS: dict[str, dict] = {
    "nala": {},
    "nala_key_direction": {"kernel_options": {"key_map": "direction"}},
    "nala_angle_sqrt_d": {"kernel_options": {"angle_scale": "sqrt_d"}},
    "nala_norm_scale": {"norm_scale": "learned"},
    "nala_norm_tracked": {"norm_scale": "tracked"},
    # the paper's lam = 3 widened to 4.5: the tracked gamma's doubling moves the power by lam * 0.30
    "nala_norm_tracked_lam45": {"norm_scale": "tracked", "kernel_options": {"lam": 4.5}},
    "nala_split": {"kernel": "nala_split"},
    "emha": ESRT_NETWORK,
    "softmax": {"kernel": "softmax"},
    "relu": {"kernel": "relu"},
    "elu1": {"kernel": "elu1"},
    "focused": {"kernel": "focused"},
    "no_rope": {"rope": False},
    "no_lepe": {"lepe": False},
    "no_gate": {"gate": False},
    **{name: peer_network(name) for name in PEERS},  # whole networks: the peer board's, trained the same way
    # SRVGGNetCompact started from its nearest-neighbour base (nala_gen.sr.archs.srvgg_zero_init_arch): with BasicSR's
    # init it learns nothing at this budget
    "srvgg_zero_init": {**peer_network("srvgg"), "type": "SRVGGNetCompactZeroInit"},
}
DEFAULT_VARIANTS = ("nala", "nala_norm_scale", "emha", "relu", "elu1", "focused", "no_rope", "no_lepe", "no_gate")
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_ITERS = 1000
REFERENCE = "nala"  # the variant every other one is compared with
# The short-run schedule, fixed here rather than scaled from the base file so a longer shipped run does not move it.
MILESTONE_FRACTIONS = (1 / 2, 3 / 4, 11 / 12)
VAL_DATA = Path("datasets/mini/val")
PHOTO_VAL = Path("datasets/photos/val")  # the photo set's held-out pictures (nala-sr prepare photos), when built
# Memory per photo-scoring job, fixed: with the default (half of what is free) two streams scoring ESRT at once
# each claimed half and together overran the host.
PHOTO_SCORE_BUDGET = 4 * 2**30
LEDGER = Path("benchmarks/results/sr_ablation_runs")  # one committed JSON row per finished run


def summary_stem(iters: int) -> str:
    """The summary's file name: ``sr_ablation`` for the default budget, ``sr_ablation_<iters>it`` for others."""
    return "sr_ablation" if iters == DEFAULT_ITERS else f"sr_ablation_{iters}it"


def run_name(variant: str, iters: int, seed: int = 0) -> str:
    return f"ablation_x4_{variant}_{iters}it_seed{seed}"


def ablation_option(base: dict, variant: str, iters: int, seed: int = 0) -> dict:
    """The base options with only the variant's network fields, the name, the seed and the budget (with its
    schedule) changed."""
    opt = json.loads(json.dumps(base))  # deep copy of plain YAML data
    opt["name"] = run_name(variant, iters, seed)
    opt["manual_seed"] = seed
    change = VARIANTS[variant]
    opt["network_g"] = dict(change) if "type" in change else {**opt["network_g"], **change}
    if opt["network_g"].get("window_size"):  # SwinIR: BasicSR's own model pads its validation inputs to the window
        opt["model_type"] = "SwinIRModel"
    opt["train"]["total_iter"] = iters
    opt["train"]["scheduler"]["milestones"] = [round(f * iters) for f in MILESTONE_FRACTIONS]
    # A 0.999 EMA over a few hundred iterations is still mostly its random init.
    opt["train"]["ema_decay"] = 0
    opt["val"]["val_freq"] = iters
    # Four resumable states per run (a stop loses at most a quarter of it); saving draws no random numbers.
    opt["logger"]["save_checkpoint_freq"] = min(base["logger"]["save_checkpoint_freq"], max(1, iters // 4))
    return opt


def train_one(variant: str, iters: int, root: Path, seed: int = 0) -> dict:
    """Train (or resume, or reuse) one run and score its final weights; returns its result row. Raises
    :class:`Busy` when another process is training it."""

    name = run_name(variant, iters, seed)
    run_dir = root / "experiments" / name
    ledger_path = root / LEDGER / f"{name}.json"
    if ledger_path.is_file():
        return json.loads(ledger_path.read_text())
    with run_lock(root / "experiments" / f"{name}.lock"):
        return _train_and_score(variant, iters, root, seed, name, run_dir, ledger_path)


def _checkpoint(run_dir: Path) -> Path:
    return run_dir / "models" / "net_g_latest.pth"  # BasicSR writes it when training ends


def _photos_built(root: Path) -> bool:
    return (root / PHOTO_VAL / "GTmod12").is_dir()


def _write_option(variant, iters, root, seed, name) -> Path:
    option_path = root / "experiments" / f"{name}.yml"
    option_path.parent.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load((root / BASE_OPTION).read_text())
    option_path.write_text(yaml.safe_dump(ablation_option(base, variant, iters, seed)))
    return option_path


def _train(option_path: Path, run_dir: Path, name: str, root: Path) -> float | None:
    """Train (or resume) the run with BasicSR; its wall time, or None when it resumed an earlier start."""
    states = run_dir / "training_states"
    resumed = states.is_dir() and any(states.iterdir())
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "nala_gen.sr.train", "-opt", str(option_path), "--auto_resume"]
    # BasicSR logs every line to experiments/NAME/*.log as well; keep the console to one line per run.
    proc = subprocess.run(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise RuntimeError(f"training {name} failed: {tail[0]} (log under {run_dir})")
    return None if resumed else round(time.perf_counter() - start, 1)


def _score(
    data: Path, checkpoint: Path, option_path: Path, tile: int | str = 0, memory_budget: int | None = None
) -> dict:
    from nala_gen.sr.evaluate import evaluate

    scores = evaluate(data, 4, [str(checkpoint)], option_path, tile, memory_budget)[str(checkpoint)]
    return {"psnr": round(scores["psnr"], 3), "ssim": round(scores["ssim"], 4)}


def _photo_scores(root: Path, checkpoint: Path, option_path: Path) -> dict:
    """``photos_psnr`` and ``photos_ssim`` on the photo set's held-out split, or nothing where it is not built."""
    if not _photos_built(root):
        return {}
    # Pictures of up to 4 MP out: whole where the job fits, tiled where it does not (ESRT's softmax).
    scores = _score(root / PHOTO_VAL, checkpoint, option_path, "auto", PHOTO_SCORE_BUDGET)
    return {"photos_psnr": scores["psnr"], "photos_ssim": scores["ssim"]}


def _train_and_score(variant, iters, root, seed, name, run_dir, ledger_path) -> dict:
    option_path = _write_option(variant, iters, root, seed, name)
    train_s = _train(option_path, run_dir, name, root)
    checkpoint = _checkpoint(run_dir)
    row = {
        "variant": variant,
        "network_g": VARIANTS[variant],
        "iters": iters,
        "seed": seed,
        **_score(root / VAL_DATA, checkpoint, option_path),
        # Wall time of an uninterrupted run on this machine (None when it was resumed across sessions).
        "train_wall_s": train_s,
        **_photo_scores(root, checkpoint, option_path),
    }
    write_row(ledger_path, row)
    return row


def add_photo_scores(variant: str, iters: int, root: Path, seed: int = 0) -> dict:
    """Give a finished run's ledger row its held-out photo figures. A run scored before the photo set existed
    whose checkpoint is gone is trained again from its seeded option first; the row then also keeps that
    retraining's own mini-val PSNR (``psnr_rerun``), so a reader sees whether it reproduced the recorded one.
    Raises :class:`Busy` when another process holds the run."""
    name = run_name(variant, iters, seed)
    ledger_path = root / LEDGER / f"{name}.json"
    if not _photos_built(root):
        return json.loads(ledger_path.read_text())
    run_dir = root / "experiments" / name
    with run_lock(root / "experiments" / f"{name}.lock"):
        row = json.loads(ledger_path.read_text())  # read under the lock: another process may have scored it
        if "photos_psnr" in row:
            return row
        option_path = _write_option(variant, iters, root, seed, name)
        checkpoint = _checkpoint(run_dir)
        if not checkpoint.is_file():
            _train(option_path, run_dir, name, root)
            row["psnr_rerun"] = _score(root / VAL_DATA, checkpoint, option_path)["psnr"]
        row.update(_photo_scores(root, checkpoint, option_path))
        write_row(ledger_path, row)
    return row


def summarise(rows: list[dict]) -> list[dict]:
    """Per variant: seeds, mean and sample standard deviation of PSNR and SSIM; against REFERENCE, the
    difference of mean PSNR with its standard error and whether it exceeds two of them."""
    return seed_statistics(rows, ("psnr", "ssim"), REFERENCE, list(VARIANTS))


def plot(summary: list[dict], rows: list[dict], bicubic: float, iters: int, path: Path) -> None:
    """One line per variant: each seed's PSNR as a dot and the mean ± 2 standard errors as a bar, on an axis
    centred on REFERENCE's mean so differences of hundredths of a dB stay visible; variants far off that
    window (a collapsed training, a bigger network) are drawn at its edge with their figure written out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = next((e["psnr"] for e in summary if e["variant"] == REFERENCE), summary[0]["psnr"])
    half_width = 0.45
    low, high = reference - half_width, reference + half_width
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(summary) + 1.2), dpi=110)
    for y, entry in enumerate(summary):
        seed_psnrs = [r["psnr"] for r in rows if r["variant"] == entry["variant"]]
        mean = entry["psnr"]
        if not low <= mean <= high:
            edge = low if mean < low else high
            ax.annotate(
                f"{mean:.2f} dB (off scale)",
                (edge, y),
                xytext=(-4 if mean > high else 4, 0),
                textcoords="offset points",
                ha="right" if mean > high else "left",
                va="center",
                fontsize=7,
            )
            continue
        ax.scatter([min(max(p, low), high) for p in seed_psnrs], [y] * len(seed_psnrs), s=12, color="gray", zorder=2)
        two_se = 2 * entry["psnr_std"] / len(seed_psnrs) ** 0.5 if entry["psnr_std"] else 0
        ax.errorbar(mean, y, xerr=two_se, fmt="D", color="tab:blue", markersize=5, capsize=3, zorder=3)
    ax.axvline(reference, color="tab:blue", linewidth=0.8, alpha=0.5)
    if low <= bicubic <= high:
        ax.axvline(bicubic, color="gray", linestyle="--", label=f"bicubic {bicubic:.2f} dB")
    ax.set_xlim(low, high)
    ax.set_yticks(range(len(summary)), [e["variant"] for e in summary], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"PSNR-Y (dB), mini val, x4 (bicubic {bicubic:.2f} dB); line: {REFERENCE}'s mean")
    seeds = max(len(e["seeds"]) for e in summary)
    ax.set_title(
        f"NaLaSR-light ablation, {iters} iterations: seeds (dots), mean ± 2 SE (up to {seeds} seeds)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench sr-ablation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=DEFAULT_ITERS, help="training iterations per run")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS), help="seeds of each variant")
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--report-only", action="store_true", help="summarise finished runs; train nothing")
    parser.add_argument(
        "--photos",
        action="store_true",
        help="also score the runs on the photo set's held-out split (retraining those whose checkpoint is gone)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not (VAL_DATA / "GTmod12").is_dir():
        print(f"no validation split at {VAL_DATA}: run `nala-sr prepare mini` first", file=sys.stderr)
        return 1
    from nala_gen.sr.evaluate import evaluate

    root = Path.cwd()
    if not args.report_only:
        for seed in args.seeds:  # every variant at one seed before the next seed: a stop leaves comparable sets
            for variant in args.variants:
                try:
                    row = train_one(variant, args.iters, root, seed)
                    if args.photos:
                        row = add_photo_scores(variant, args.iters, root, seed)
                except Busy:
                    print(f"{variant:<18} seed {seed}  being trained by another process: passed by", flush=True)
                    continue
                shown = f"PSNR {row['psnr']:.3f} dB  SSIM {row['ssim']:.4f}"
                if "photos_psnr" in row:
                    shown += f"  held-out photos {row['photos_psnr']:.3f} dB / {row['photos_ssim']:.4f}"
                print(f"{variant:<18} seed {seed}  {shown}", flush=True)
    done = sorted((root / LEDGER).glob(f"ablation_x4_*_{args.iters}it_seed*.json"))
    rows = [json.loads(p.read_text()) for p in done]
    if not rows:
        print(f"no finished {args.iters}-iteration runs in {LEDGER}/", file=sys.stderr)
        return 1
    bicubic = evaluate(root / VAL_DATA, 4, ["bicubic"])["bicubic"]
    stats = summarise(rows)
    summary = {
        "budget": {"iters": args.iters, "base_option": str(BASE_OPTION), "val_data": str(VAL_DATA)},
        "bicubic": {"psnr": round(bicubic["psnr"], 3), "ssim": round(bicubic["ssim"], 4)},
        "reference": REFERENCE,
        "variants": stats,
        "runs": rows,
    }
    photo_rows = [r for r in rows if "photos_psnr" in r]
    if photo_rows:  # the held-out photos: only the runs scored there, so their seeds may be fewer
        photo_bicubic = evaluate(root / PHOTO_VAL, 4, ["bicubic"])["bicubic"]
        summary["photos"] = {
            "val_data": str(PHOTO_VAL),
            "bicubic": {"psnr": round(photo_bicubic["psnr"], 3), "ssim": round(photo_bicubic["ssim"], 4)},
            "variants": seed_statistics(photo_rows, ("photos_psnr", "photos_ssim"), REFERENCE, list(VARIANTS)),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = summary_stem(args.iters)
    (args.out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    plot(stats, rows, summary["bicubic"]["psnr"], args.iters, args.out / f"{stem}.png")
    print(f"wrote {args.out / stem}.json and .png")
    return 0


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def sr_ablation_table(name: str = "sr_ablation.json") -> str:
    data = load(name)
    bic = data["bicubic"]
    variants = data.get("variants") or [{**r, "seeds": [r.get("seed", 0)], "psnr_std": None} for r in data["runs"]]
    lines = [
        f"NaLaSR-light x4, {data['budget']['iters']} iterations per run from `{data['budget']['base_option']}` "
        f"(batch 8, LR patch 32, only the variant's `network_g` fields and the seed changed; `emha` is ESRT); "
        f"PSNR/SSIM on Y, crop 4, `{data['budget']['val_data']}`; mean ± sample standard deviation over the seeds; "
        f"Δ against `{data.get('reference', 'nala')}` with its standard error (* beyond two).",
        "",
        "| variant | network_g change | seeds | PSNR (Y) | SSIM (Y) | vs bicubic | Δ PSNR vs nala |",
        "|---|---|---|---|---|---|---|",
        f"| (bicubic) | – | – | {bic['psnr']:.2f} | {bic['ssim']:.4f} | – | |",
    ]
    for e in variants:
        change = ", ".join(f"{k}: {v}" for k, v in e["network_g"].items()) if e["network_g"] else "(the default)"
        if "type" in e["network_g"]:  # a whole network: ESRT, or a peer from BasicSR
            change = e["network_g"]["type"] + ("" if e["network_g"]["type"] == "ESRT" else " (BasicSR)")
        spread = f" ± {e['psnr_std']:.2f}" if e.get("psnr_std") is not None else ""
        ssim_spread = f" ± {e['ssim_std']:.4f}" if e.get("ssim_std") is not None else ""
        delta = ""
        if "psnr_vs_reference" in e:
            star = "*" if e["psnr_beyond_two_se"] else ""
            delta = f"{e['psnr_vs_reference']:+.2f} ± {e['psnr_vs_reference_se']:.2f}{star}"
        lines.append(
            f"| {e['variant']} | {change} | {len(e['seeds'])} | {e['psnr']:.2f}{spread} | {e['ssim']:.4f}{ssim_spread} "
            f"| {e['psnr'] - bic['psnr']:+.2f} dB | {delta} |"
        )
    return "\n".join(lines)


def sr_peer_quality_table() -> str:
    """The peers' equal-budget quality here (sr_ablation.json: the mini val split and, for the runs scored there,
    the photo set's held-out split) beside their published figures (peers.PUBLISHED_X4)."""
    data = load("sr_ablation.json")
    variants = {e["variant"]: e for e in data["variants"]}
    photos = data.get("photos")
    on_photos = {e["variant"]: e for e in photos["variants"]} if photos else {}
    board = [
        ("nalasr", "nala"),
        ("esrt", "emha"),
        ("srvgg (BasicSR's init)", "srvgg"),
        ("srvgg (zero-init last conv)", "srvgg_zero_init"),
        ("edsr", "edsr"),
        ("swinir", "swinir"),
        ("rrdb", None),
    ]
    photo_note = (
        f" The held-out photos (`{photos['val_data']}`, `nala-bench sr-ablation --photos`: the same trained "
        f"weights; bicubic {photos['bicubic']['psnr']:.2f} / {photos['bicubic']['ssim']:.4f}) are pictures of "
        "another kind and size than the ten training photos."
        if photos
        else " The photo set's held-out split: not scored yet (`nala-bench sr-ablation --photos`)."
    )
    lines = [
        f"Here: {data['budget']['iters']} iterations each, trained exactly as NaLaSR (`nala-bench sr-ablation`), "
        f"PSNR/SSIM on Y of `{data['budget']['val_data']}`, mean ± sd over the seeds.{photo_note} Published: the "
        "papers' own x4 figures on Set5 and Urban100 (trained on DIV2K or DF2K for hundreds of thousands of "
        "iterations; not measured here, not comparable with the columns before them).",
        "",
        "| network | here: PSNR / SSIM (seeds) | here, held-out photos | published Set5 x4 | published Urban100 x4 "
        "| published source |",
        "|---|---|---|---|---|---|",
    ]

    def shown(pair):
        return "–" if pair is None else f"{pair[0]:.2f} / {pair[1]:.4f}"

    def measured(e, prefix=""):
        sd = f" ± {e[prefix + 'psnr_std']:.2f}" if e.get(prefix + "psnr_std") is not None else ""
        return f"{e[prefix + 'psnr']:.2f}{sd} / {e[prefix + 'ssim']:.4f} ({len(e['seeds'])})"

    for label, variant in board:
        network = label.split()[0]
        e = variants.get(variant)
        if e is None:
            here = "not trained (speed only)" if variant is None else "not trained yet"
        else:
            here = measured(e)
        there = measured(on_photos[variant], "photos_") if variant in on_photos else "–"
        published = PUBLISHED_X4[network]
        lines.append(
            row(label, here, there, shown(published["set5"]), shown(published["urban100"]), published["source"])
        )
    return "\n".join(lines)


TABLES = (
    Table("sr-ablation", ("sr_ablation.json",), sr_ablation_table),
    Table("sr-ablation-500it", ("sr_ablation_500it.json",), lambda: sr_ablation_table("sr_ablation_500it.json")),
    Table("sr-peer-quality", ("sr_ablation.json",), sr_peer_quality_table),
)
