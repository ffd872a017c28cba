"""Seeded ablation of NaLaDiT's attention on the embedded digits: the NaLa block against the model it replaced
(``preblock``), the block's parts one at a time, the tracked norm scale (our extension) and softmax.

Each run trains a digits config (``options/diffusion/naladit_digits*.yml``) with only ``seed``, ``output_dir``, the
budget (``max_steps``) and the variant's model fields (:data:`VARIANTS`) overridden, then scores the final pipeline
with ``nala-gen quality`` at its defaults (100 samples per class, 50 steps, guidance 2, sampling seed 0): both
judges' accuracy on the samples (the CNN and the independent SVC) and the Fréchet distance of the CNN's features
(lower is better).

    nala-bench dit-ablation [--steps 6000] [--seeds 0 1 2] [--variants preblock nala ...]
                            [--adopt preblock=naladit-digits] [--rescore] [--report-only]
    nala-bench dit-ablation --steps 3000 --seeds 0 --variants parts   # the block's parts, one at a time

Runs live under ``experiments/`` as ``dit_digits_<variant>_<steps>st_seed<seed>`` and resume from their newest
checkpoint (``nala-gen train --resume latest``), so the command can be rerun after any stop. A finished run's row
goes to the committed ledger ``benchmarks/results/dit_ablation_runs/<run>.json`` and is never trained again;
``--report-only`` rebuilds ``dit_ablation[_<steps>st].{json,png}`` from the ledger; ``--rescore`` scores again the
ledger's rows that lack a metric (scored before the second judge existed) whose pipeline is still here. Runs are
locked while trained, so two invocations can share the machine (one per core). ``--adopt VARIANT=MODEL`` scores an
existing pipeline (a folder or named weights) as that variant's seed-0 run instead of training it, when its
training record shows the same config, seed 0 and budget: CPU hours not spent twice on the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from nala_gen.attention.modules import with_kernel_keys
from nala_gen.bench.ablation_runs import Busy, run_lock, seed_statistics, write_row
from nala_gen.devices import cpu_model


@dataclass(frozen=True)
class Variant:
    """A training of the ablation: a digits config and the model fields it overrides (``--override model.K=V``)."""

    config: Path
    model: dict = field(default_factory=dict)
    about: str = ""


BLOCK = Path("options/diffusion/naladit_digits_block.yml")
PREBLOCK_KERNEL = {"angle_scale": "sqrt_d", "key_map": "direction"}  # the kernel options of the pre-block configs
VARIANTS = {
    # The shipped naladit-digits, which the block model (naladit-digits-block) was to replace: no RoPE, LePE or
    # gate, the kernel options of its time. The reference of every table.
    "preblock": Variant(Path("options/diffusion/naladit_digits.yml"), about="the model the block was to replace"),
    "nala": Variant(BLOCK, about="the paper's block, its parts started neutral (today's config)"),
    "nala_xavier": Variant(BLOCK, {"attention_init": "xavier"}, "the block as naladit-digits-block started"),
    "nala_no_rope": Variant(BLOCK, {"rope": False}, "the block without RoPE"),
    "nala_no_lepe": Variant(BLOCK, {"lepe": False}, "the block without LePE"),
    "nala_no_gate": Variant(BLOCK, {"gate": False}, "the block without the gate"),
    "nala_preblock_kernel": Variant(BLOCK, {"kernel_options": PREBLOCK_KERNEL}, "the block, the old kernel options"),
    "nala_norm_tracked": Variant(
        Path("options/diffusion/naladit_digits_norm_tracked.yml"), about="preblock with the tracked norm scale"
    ),
    "softmax_preblock": Variant(
        Path("options/diffusion/naladit_digits_softmax.yml"), about="preblock with softmax attention"
    ),
    "softmax": Variant(Path("options/diffusion/naladit_digits_softmax_block.yml"), about="the block with softmax"),
}
# What a variant changes against the reference's config (for the table): its model fields that differ.
MODEL_FIELDS = ("kernel", "kernel_options", "attention_norm_scale", "rope", "lepe", "gate", "attention_init")
# A training record that lacks a model field was made before the field existed, so with what the code did then.
RECORD_DEFAULTS = {"attention_init": "xavier"}
REFERENCE = "preblock"
# The pipelines' full budget: the kernels against each other and the block against the model it replaced.
FULL_BUDGET_VARIANTS = ("preblock", "nala", "nala_norm_tracked", "softmax_preblock", "softmax")
# The block's parts one at a time, at a short budget and one seed (make bench: --steps PARTS_STEPS --seeds 0).
PARTS_VARIANTS = ("preblock", "nala", "nala_xavier", "nala_no_rope", "nala_no_lepe", "nala_no_gate",
                  "nala_preblock_kernel")  # fmt: skip
PARTS_STEPS = 3000
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_STEPS = 6000  # the shipped digits pipelines' budget: about an hour each on one core
METRICS = ("accuracy", "svc_accuracy", "frechet_distance")
QUALITY = {"per_class": 100, "steps": 50, "cfg": 2.0, "seed": 0}  # nala-gen quality's defaults
LEDGER = Path("benchmarks/results/dit_ablation_runs")


def run_name(variant: str, steps: int, seed: int) -> str:
    return f"dit_digits_{variant}_{steps}st_seed{seed}"


def summary_stem(steps: int) -> str:
    return "dit_ablation" if steps == DEFAULT_STEPS else f"dit_ablation_{steps}st"


def variant_config(root: Path, variant: str) -> dict:
    """A variant's YAML with its model overrides, the model's deprecated kernel keys under today's names."""
    spec = VARIANTS[variant]
    config = yaml.safe_load((root / spec.config).read_text())
    return {**config, "model": {**with_kernel_keys(config.get("model") or {}), **spec.model}}


def change_of(root: Path, variant: str) -> dict:
    """The model fields in which the variant's config differs from the reference's."""
    model, ref = variant_config(root, variant)["model"], variant_config(root, REFERENCE)["model"]
    return {k: model.get(k) for k in MODEL_FIELDS if model.get(k) != ref.get(k)}


def score(model: str, quality: dict) -> dict:
    """``nala-gen quality`` of a pipeline folder or named weights."""
    from nala_gen.diffusion.loading import load_pipeline
    from nala_gen.diffusion.quality import evaluate

    pipe, _ = load_pipeline(model)
    return evaluate(pipe, quality["per_class"], quality["steps"], quality["cfg"], quality["seed"])


def _row(root: Path, variant: str, steps: int, seed: int, model: str, quality: dict, **extra) -> dict:
    scores = score(model, quality)
    return {
        "variant": variant,
        "config": str(VARIANTS[variant].config),
        "model_overrides": VARIANTS[variant].model,
        "change": change_of(root, variant),
        "steps": steps,
        "seed": seed,
        "accuracy": round(scores["accuracy"], 4),
        "svc_accuracy": round(scores["svc_accuracy"], 4),
        "svc_held_out_accuracy": round(scores["svc_held_out_accuracy"], 4),
        "frechet_distance": round(scores["frechet_distance"], 3),
        "frechet_distance_real_held_out": round(scores["frechet_distance_real_held_out"], 3),
        "quality": quality,
        "cpu": cpu_model(),
        **extra,
    }


def train_one(root: Path, variant: str, steps: int, seed: int, quality: dict = QUALITY, quiet: bool = True) -> dict:
    """Train (or resume, or reuse from the ledger) one run and score it; raises :class:`Busy` when another
    process is training it."""
    name = run_name(variant, steps, seed)
    ledger_path = root / LEDGER / f"{name}.json"
    row = ledger_row(ledger_path, quality)
    if row:
        return row
    with run_lock(root / "experiments" / f"{name}.lock"):
        row = ledger_row(ledger_path, quality)  # finished by another process meanwhile
        if row:
            return row
        output_dir = Path("experiments") / name
        overrides = [f"seed={seed}", f"output_dir={output_dir}", f"max_steps={steps}"]
        overrides += [f"model.{k}={json.dumps(v)}" for k, v in VARIANTS[variant].model.items()]
        if steps < 500:  # tiny budgets (tests): a checkpoint at the end at least
            overrides.append(f"checkpoint_every={max(1, steps)}")
        cmd = [sys.executable, "-m", "nala_gen.diffusion.cli", "train", "--config", str(VARIANTS[variant].config)]
        cmd += ["--override", *overrides, "--resume", "latest", *(["-q"] if quiet else [])]
        start = time.perf_counter()
        stderr = None if not quiet else subprocess.PIPE  # the trainer's progress goes to stderr
        proc = subprocess.run(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            raise RuntimeError(f"training {name} failed: {tail[0]}")
        info = json.loads((root / output_dir / "training_info.json").read_text())
        resumed = bool(info.get("resumed_from"))
        row = _row(
            root,
            variant,
            steps,
            seed,
            str(root / output_dir / "pipeline"),
            quality,
            # Wall time of an uninterrupted run (None when it resumed: its first part ran elsewhere or earlier).
            train_wall_s=None if resumed else round(time.perf_counter() - start, 1),
            s_per_step=info.get("s_per_step") if not resumed else None,
        )
        write_row(ledger_path, row)
        return row


def rescore(root: Path, path: Path) -> None:
    """Add the metrics a ledger row lacks, scoring its pipeline again (the run's folder, or the pipeline it adopted)
    with the row's own quality settings; a row whose pipeline is gone is left as it is, and said so."""
    row = json.loads(path.read_text())
    if all(row.get(m) is not None for m in METRICS):
        return
    folder = root / "experiments" / path.stem / "pipeline"
    model = str(folder) if folder.is_dir() else row.get("adopted_from")
    if model is None:
        print(f"{path.stem}: pipeline gone, not rescored", flush=True)
        return
    scores = score(model, row["quality"])
    for metric in ("svc_accuracy", "svc_held_out_accuracy"):
        row[metric] = round(scores[metric], 4)
    row["rescored_cpu"] = cpu_model()
    write_row(path, row)
    print(f"{path.stem}: rescored from {model}", flush=True)


def adopt(root: Path, variant: str, model: str, steps: int, quality: dict = QUALITY) -> dict:
    """Score ``model`` as the variant's seed-0 run, after checking its training record matches that run."""
    name = run_name(variant, steps, 0)
    ledger_path = root / LEDGER / f"{name}.json"
    row = ledger_row(ledger_path, quality)
    if row:
        return row
    record = training_record(model)
    mismatch = record_mismatch(record, variant_config(root, variant), VARIANTS[variant].config, steps)
    if mismatch:
        raise ValueError(f"{model} was not trained as {name}: {mismatch}")
    row = _row(root, variant, steps, 0, model, quality, adopted_from=model, trained_by=record["command"])
    write_row(ledger_path, row)
    return row


def ledger_row(path: Path, quality: dict) -> dict | None:
    """The ledger's row at ``path`` if it was scored with these quality settings (another scoring is redone)."""
    if not path.is_file():
        return None
    row = json.loads(path.read_text())
    return row if row.get("quality") == quality else None


def training_record(model: str) -> dict:
    """How a pipeline was trained: ``command``, ``steps``, ``seed`` (None if unrecorded) and ``model`` (its
    config), from a folder's ``training_info.json`` (in it or beside it) or a named weight card."""
    path = Path(model)
    for candidate in (path / "training_info.json", path.parent / "training_info.json"):
        if candidate.is_file():
            info = json.loads(candidate.read_text())
            config = info.get("config", {})
            config = {**config, "model": with_kernel_keys(config.get("model", {}))}  # older runs: older key names
            return {"command": info.get("command", ""), "steps": info.get("steps"), "seed": config.get("seed"),
                    "model": config["model"], "config": config}  # fmt: skip
    from nala_gen.weights import resolve

    card = resolve(model)
    return {"command": card.info.get("command", ""), "steps": card.info.get("steps"), "seed": None,
            "model": with_kernel_keys(card.config)}  # fmt: skip


def _agrees(recorded, wanted) -> bool:
    """Whether a recorded value is the config's: dicts key by key, only the keys the config gives (a record
    also lists the defaults the config leaves out)."""
    if isinstance(wanted, dict) and isinstance(recorded, dict):
        return all(_agrees(recorded.get(k), v) for k, v in wanted.items())
    return recorded == wanted


def record_mismatch(record: dict, config: dict, config_path: Path, steps: int) -> str | None:
    """Why a training record is not this config's run at ``steps`` and seed 0, or None when it is: the same
    step count, the config file named in its command with no overrides (so the file's seed, 0, applied) or seed
    0 recorded, and every model field of the config equal in the trained model's config."""
    command = record["command"].split()
    if record["steps"] != steps:
        return f"{record['steps']} steps, not {steps}"
    at = command.index("--config") + 1 if "--config" in command else len(command)
    if at >= len(command) or Path(command[at]) != config_path:
        return f"its command ({record['command']!r}) does not train {config_path}"
    if "config" in record:  # a run folder: its whole recorded config, but for what a run of the ablation overrides
        ignored = ("seed", "output_dir", "max_steps", "checkpoint_every", "log_every")  # none changes the weights
        trained = {k: v for k, v in record["config"].items() if k not in ignored}
        wanted = {k: v for k, v in config.items() if k not in ignored}
        differing = sorted(k for k in wanted if not _agrees(trained.get(k), wanted[k]))
        if differing:
            return f"config fields differ: {differing}"
    elif "--override" in command:  # a weight card records only its model and command: no overrides allowed
        return f"its command ({record['command']!r}) overrides the config"
    seed = record["seed"] if record["seed"] is not None else config["seed"]
    if seed != 0:
        return f"seed {seed}, not 0"
    trained_model = {**RECORD_DEFAULTS, **record["model"]}
    differing = [k for k, v in config["model"].items() if k in trained_model and trained_model[k] != v]
    return f"model fields differ: {differing}" if differing else None


def plot(summary: list[dict], steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(12, 3.4), dpi=110)
    names = [e["variant"] for e in summary]
    labels = ("accuracy (CNN judge)", "accuracy (SVC judge)", "Fréchet distance (lower is better)")
    for ax, metric, label in zip(axes, METRICS, labels):
        means = [e[metric] if e[metric] is not None else float("nan") for e in summary]  # nan: not scored
        errors = [e[f"{metric}_std"] or 0 for e in summary]
        ax.bar(names, means, yerr=errors, capsize=3, color="tab:blue")
        for i, (m, err) in enumerate(zip(means, errors)):
            if m == m:
                ax.text(i, m + err, f"{m:.3g}", ha="center", va="bottom", fontsize=7)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelsize=7, labelrotation=35)
    seeds = max(len(e["seeds"]) for e in summary)
    fig.suptitle(f"NaLaDiT on digits, {steps} steps, up to {seeds} seeds (mean ± sd)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench dit-ablation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps per run")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS))
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(FULL_BUDGET_VARIANTS),
        choices=[*VARIANTS, "parts"],
        help="'parts': the block's parts one at a time (%(default)s by default)",
    )
    parser.add_argument("--rescore", action="store_true", help="score again ledger rows that lack a metric")
    parser.add_argument("--adopt", nargs="+", default=[], metavar="VARIANT=MODEL", help="score MODEL as seed 0")
    parser.add_argument(
        "--report-only", action="store_true", help="summarise finished (and adopted) runs; train nothing"
    )
    parser.add_argument("--verbose", action="store_true", help="show the trainings' progress")
    parser.add_argument("--per-class", type=int, default=QUALITY["per_class"], help="quality: samples per class")
    parser.add_argument("--sample-steps", type=int, default=QUALITY["steps"], help="quality: sampling steps")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    root = Path.cwd()
    quality = {**QUALITY, "per_class": args.per_class, "steps": args.sample_steps}
    variants = [v for name in args.variants for v in (PARTS_VARIANTS if name == "parts" else (name,))]
    adopted = dict(item.split("=", 1) for item in args.adopt if "=" in item)
    if len(adopted) != len(args.adopt) or not set(adopted) <= set(VARIANTS):
        print(f"nala-bench dit-ablation: --adopt takes VARIANT=MODEL with VARIANT in {list(VARIANTS)}", file=sys.stderr)
        return 2
    for variant, model in adopted.items():  # scoring, not training: --report-only too
        try:
            row = adopt(root, variant, model, args.steps, quality)
        except (ValueError, OSError) as err:
            print(f"nala-bench dit-ablation: {err}", file=sys.stderr)
            return 1
        print(f"{variant:<18} seed 0  adopted {model}: accuracy {row['accuracy']:.3f}", flush=True)
    if not args.report_only:
        for seed in args.seeds:  # every variant at one seed before the next: a stop leaves comparable sets
            for variant in variants:
                try:
                    row = train_one(root, variant, args.steps, seed, quality, quiet=not args.verbose)
                except Busy:
                    print(f"{variant:<18} seed {seed}  being trained by another process: passed by", flush=True)
                    continue
                shown = f"accuracy {row['accuracy']:.3f}  Fréchet distance {row['frechet_distance']:.2f}"
                print(f"{variant:<18} seed {seed}  {shown}", flush=True)
    if args.rescore:
        for path in sorted((root / LEDGER).glob(f"dit_digits_*_{args.steps}st_seed*.json")):
            rescore(root, path)
    rows = [json.loads(p.read_text()) for p in sorted((root / LEDGER).glob(f"dit_digits_*_{args.steps}st_seed*.json"))]
    rows = [r for r in rows if r.get("quality") == quality]  # one scoring per table
    if not rows:
        print(f"nala-bench dit-ablation: no finished {args.steps}-step runs in {LEDGER}/", file=sys.stderr)
        return 1
    stats = seed_statistics(rows, METRICS, REFERENCE, list(VARIANTS), keys=("config", "change"))
    summary = {"budget": {"steps": args.steps}, "quality": quality, "reference": REFERENCE, "variants": stats}
    summary["runs"] = rows
    args.out.mkdir(parents=True, exist_ok=True)
    stem = summary_stem(args.steps)
    (args.out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    plot(stats, args.steps, args.out / f"{stem}.png")
    print(f"wrote {args.out / stem}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
