"""Entropy vs query norm on trained models' own queries and keys (the paper's Figures 1 and 3).

For each trained model the queries and keys its attention actually sees are recorded
(:func:`nala_gen.attention.record_queries_keys`), then every query's attention entropy is computed under each
kernel (softmax, ReLU and ELU+1 linear, NaLa) from those same q and k, next to the query's norm. The paper's
claim: entropy falls as the norm grows for softmax and NaLa (negative Spearman correlation), while ReLU-style
linear attention is blind to the norm (correlation near zero).

Pairs (each NaLa model next to its softmax twin, trained identically):

* super-resolution: ``nalasr-light-x4`` and ``esrt-x4`` (the same layers with ESRT's split softmax), on the
  centre crop of the bundled LR sample (one transformer layer, every token);
* diffusion: ``naladit-digits`` and ``naladit-digits-softmax``, over a short class-conditional sampling run
  (every layer, every step, guided and unguided halves).

ESRT's own attention is softmax inside four token segments; here its q and k are scored with softmax over all
tokens, the global form the other kernels use. The ``nala`` column of a model that uses NaLa is scored with that
model's own options (a learned norm scale included), which the recorder hands over with each call; other models'
queries are scored with the default ``nala``. Models that are not installed are skipped with a note.

``--ablation-runs nala nala_norm_scale`` adds the seed-0 runs (``--ablation-seed`` for another) of ``nala-bench
sr-ablation`` (1,000 iterations, trained identically but for the variant's change) from ``experiments/``: the paired
comparison of the paper's kernel with the norm-scaled ones.

``--diffusion-runs experiments/naladit_digits_norm_tracked/pipeline`` scores pipeline folders of one's own
trainings (``nala-gen train`` writes one at the end) the same way as the shipped digits models.

The result file gathers rows across invocations: a model scored now replaces its row, the others stay as an
earlier run left them (a checkout without an ablation run's checkpoint keeps that run's row).

    nala-bench trained-entropy [--models ...] [--ablation-runs nala nala_norm_scale] [--ablation-seed 0]
                               [--diffusion-runs FOLDER ...] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from nala_gen.attention.modules import with_kernel_keys
from nala_gen.resources import sample_image

KERNELS = ("softmax", "relu", "elu1", "nala")
# model name -> (task, the kernel the model itself uses)
MODELS = {
    "nalasr-light-x4": ("sr", "nala"),
    "esrt-x4": ("sr", "softmax"),
    "naladit-digits": ("diffusion", "nala"),
    "naladit-digits-softmax": ("diffusion", "softmax"),
}
SR_SAMPLE = sample_image()
Records = list  # of nala_gen.attention.functional.RecordedCall


def sr_queries_keys(name: str, crop: int = 48, option: str | None = None) -> Records:
    """The attention calls while ``name`` (named weights, or a checkpoint with its ``option`` file) upscales the
    centre crop x crop of the LR sample."""
    from nala_gen.attention import record_queries_keys
    from nala_gen.sr.loading import load_sr_model
    from nala_gen.sr.upscale.imageio import read_image

    net, _ = load_sr_model(name, 4, option)
    img = read_image(SR_SAMPLE)
    top, left = (img.shape[0] - crop) // 2, (img.shape[1] - crop) // 2
    patch = torch.from_numpy(img[top : top + crop, left : left + crop, :3].astype(np.float32) / 255)
    with torch.no_grad(), record_queries_keys() as records:
        net(patch.permute(2, 0, 1)[None])
    return records


def diffusion_queries_keys(name: str, steps: int = 10, seed: int = 0) -> Records:
    """The (q, k) of every attention call while ``name`` samples one image of each class with guidance 2."""
    from nala_gen.attention import record_queries_keys
    from nala_gen.diffusion.loading import load_pipeline

    pipe, _ = load_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    classes = list(range(pipe.transformer.config.num_classes))
    with torch.no_grad(), record_queries_keys() as records:
        pipe(class_labels=classes, num_inference_steps=steps, guidance_scale=2.0, generator=torch.manual_seed(seed))
    return records


def _entropies(records: Records, query_scale: float = 1.0) -> dict[str, np.ndarray]:
    from nala_gen.attention import query_norm_entropy

    parts = []
    for call in records:
        q = call.q * query_scale
        part = query_norm_entropy(q, call.k, tuple(k for k in KERNELS if k != "nala"))
        own = call.options if call.kernel == "nala" else {}  # the model's own NaLa, norm scale and all
        part.update(query_norm_entropy(q, call.k, ("nala",), **own))
        parts.append(part)
    return {key: torch.cat([p[key] for p in parts]).numpy() for key in parts[0]}


def summarise(records: Records, own_kernel: str, points: int = 600, seed: int = 0) -> dict:
    """Per kernel: Spearman correlation of entropy with query norm across queries, mean entropy, the mean entropy
    change when every query is doubled in length (direction kept: the controlled form of the claim), and a
    scatter subsample."""
    from scipy.stats import spearmanr

    data = _entropies(records)
    doubled = _entropies(records, 2.0)
    pick = np.random.default_rng(seed).choice(len(data["norm"]), size=min(points, len(data["norm"])), replace=False)
    kernels = {}
    for kernel in KERNELS:
        rho = spearmanr(data["norm"], data[kernel]).statistic
        kernels[kernel] = {
            "spearman": round(float(rho), 4),
            "mean_entropy": round(float(data[kernel].mean()), 4),
            "entropy_change_at_2x_norm": round(float((doubled[kernel] - data[kernel]).mean()), 5),
            "entropy_sample": np.round(data[kernel][pick], 4).tolist(),
        }
    return {
        "own_kernel": own_kernel,
        "queries": int(len(data["norm"])),
        "tokens_per_call": int(records[0][0].shape[-2]),
        "calls": len(records),
        "median_norm": round(float(np.median(data["norm"])), 3),
        "norm_sample": np.round(data["norm"][pick], 4).tolist(),
        "kernels": kernels,
    }


def plot(results: dict, path: Path) -> None:
    """One row per model, one scatter panel per kernel, Spearman rho in each title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), len(KERNELS), figsize=(3.1 * len(KERNELS), 2.5 * len(results)), dpi=100)
    axes = np.atleast_2d(axes)
    for row, (name, res) in zip(axes, results.items()):
        for ax, kernel in zip(row, KERNELS):
            stats = res["kernels"][kernel]
            own = " (own)" if kernel == res["own_kernel"] else ""
            ax.scatter(res["norm_sample"], stats["entropy_sample"], s=3, alpha=0.4)
            ax.set_title(f"{name}: {kernel}{own}\nSpearman {stats['spearman']:+.2f}", fontsize=8)
            ax.tick_params(labelsize=7)
        row[0].set_ylabel("entropy (nats)", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("query norm ‖q‖", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from nala_gen.weights import WeightsError

    parser = argparse.ArgumentParser(prog="nala-bench trained-entropy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--ablation-runs", nargs="*", default=[], metavar="VARIANT", help="sr-ablation runs to score too"
    )
    parser.add_argument("--ablation-iters", type=int, default=1000)
    parser.add_argument("--ablation-seed", type=int, default=0, help="seed of the sr-ablation runs")
    parser.add_argument(
        "--diffusion-runs", nargs="*", default=[], type=Path, metavar="FOLDER", help="pipeline folders to score too"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    from nala_gen.bench.sr_ablation import VARIANTS, run_name

    results = {}
    jobs = [(name, *MODELS[name], None, None) for name in args.models]
    for variant in args.ablation_runs:
        if variant not in VARIANTS:
            parser.error(f"unknown ablation variant {variant!r}")
        run = run_name(variant, args.ablation_iters, args.ablation_seed)
        checkpoint = Path("experiments") / run / "models" / "net_g_latest.pth"
        own = "softmax" if variant == "emha" else VARIANTS[variant].get("kernel", "nala")
        label = f"ablation {variant}" + (f" seed {args.ablation_seed}" if args.ablation_seed else "")
        jobs.append((label, "sr", own, checkpoint, Path("experiments") / f"{run}.yml"))
    for folder in args.diffusion_runs:
        config = folder / "transformer" / "config.json"
        if not config.is_file():
            parser.error(f"{folder} is not a pipeline folder (no transformer/config.json)")
        own = with_kernel_keys(json.loads(config.read_text())).get("kernel", "nala")
        jobs.append((str(folder), "diffusion", own, None, None))
    for name, task, own, checkpoint, option in jobs:
        try:
            if checkpoint is not None:
                if not checkpoint.is_file():
                    raise WeightsError(f"{checkpoint} not found: run nala-bench sr-ablation first")
                records = sr_queries_keys(str(checkpoint), option=str(option))
            else:
                records = sr_queries_keys(name) if task == "sr" else diffusion_queries_keys(name)
        except WeightsError as err:
            print(f"skipped {name}: {err}")
            continue
        results[name] = {"task": task, **summarise(records, own)}
        res = results[name]
        print(f"{name}: {res['queries']} queries, median |q| {res['median_norm']}")
        for kernel, stats in res["kernels"].items():
            print(
                f"  {kernel:<8} Spearman(entropy, |q|) {stats['spearman']:+.3f}   "
                f"entropy change at 2x |q| {stats['entropy_change_at_2x_norm']:+.4f} nats"
            )
    if not results:
        print("no trained model found; nothing written")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "trained_entropy.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    results = {**kept, **results}  # rows scored now replace theirs; the others stay
    path.write_text(json.dumps(results, indent=1))
    plot(results, args.out / "trained_entropy.png")
    print(f"wrote {args.out / 'trained_entropy.json'} and {args.out / 'trained_entropy.png'}")
    return 0
