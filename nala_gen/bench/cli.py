"""``nala-bench``: the project's measurements, one sub-command each.

nala-bench attention   latency and memory vs tokens for each kernel (fresh process per point)
nala-bench entropy     attention entropy vs query norm for each kernel (PNG + JSON)
nala-bench trained-entropy   the same on trained models' own queries and keys, with Spearman correlations
nala-bench sr          SR models' latency and memory vs tokens (fresh process per point)
nala-bench peers       NaLaSR beside SRVGGNetCompact, EDSR, SwinIR, RRDBNet: params, FLOPs, MP/s, peak, Pareto
nala-bench sr-sets     PSNR/SSIM on Set5, Set14, B100, Urban100 (bicubic, shipped weights; published rows beside)
nala-bench sr-sets-cost the paper's Table 20 on this CPU: per set, x4, whole images: latency and peak, ESRT vs NaLaSR
nala-bench upscale     nala-sr upscale end to end: output megapixels per second and memory (fresh process per point)
nala-bench upscale-overhead one-image nala-sr upscale: wall beyond compute (probe cache on/off), engine vs bare forward
nala-bench upscale-memory   nala-sr upscale's process peak memory against its --memory-budget-mb (fresh processes)
nala-bench upscale-folder   folder jobs: images/s sequential, pipelined, batched and in two processes
nala-bench winograd    the Winograd 3x3 convolution against oneDNN's direct one: per shape and NaLaSR's whole forward
nala-bench train-speed NaLaSR training steps: LR-patch samples/s per variant (layout, bf16, compile, batch, patch)
nala-bench steps       a NaLaSR training step and a NaLaDiT sampling step, fused NaLa op on and off
nala-bench dit-sizes   one NaLaDiT sampling step against its softmax twin at 32, 64 and 128 px images
nala-bench sr-ablation NaLaSR trained with each attention type on an equal budget, PSNR/SSIM on the val split
nala-bench dit-ablation NaLaDiT on digits with NaLa, NaLa + tracked norm scale and softmax, seeded: accuracy, FD
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from nala_gen.bench.tables import Table, load, row


def entropy(argv: list[str]) -> int:
    from nala_gen.attention import entropy_vs_query_norm, kernel_names

    parser = argparse.ArgumentParser(prog="nala-bench entropy", description="Entropy vs query norm.")
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=["softmax", "nala", "nala_split", "relu", "elu1"],
        choices=kernel_names(),
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "entropy_vs_query_norm.png"
    result = entropy_vs_query_norm(tuple(args.kernels), save_png=png)
    (args.out / "entropy_vs_query_norm.json").write_text(json.dumps(result, indent=2))
    for kernel, series in result.items():
        ent = series["entropy"]
        print(
            f"{kernel:<11} entropy at |q|={series['norm'][0]:.2f}: {ent[0]:.3f}   "
            f"at |q|={series['norm'][-1]:.2f}: {ent[-1]:.3f}"
        )
    print(f"wrote {png}")
    return 0


# Sub-command -> module whose main(argv) runs it (imported only when chosen: each pulls in heavy dependencies).
COMMANDS = {
    "attention": "nala_gen.bench.attention_scaling",
    "trained-entropy": "nala_gen.bench.trained_entropy",
    "sr": "nala_gen.bench.sr_scaling",
    "peers": "nala_gen.bench.sr_scaling:peers_main",
    "sr-sets": "nala_gen.bench.sr_sets:quality_main",
    "sr-sets-cost": "nala_gen.bench.sr_sets:cost_main",
    "sr-ablation": "nala_gen.bench.sr_ablation",
    "dit-ablation": "nala_gen.bench.dit_ablation",
    "upscale": "nala_gen.bench.upscale_throughput",
    "upscale-overhead": "nala_gen.bench.upscale_overhead",
    "upscale-memory": "nala_gen.bench.upscale_memory",
    "upscale-folder": "nala_gen.bench.upscale_folder",
    "winograd": "nala_gen.bench.winograd_speed",
    "steps": "nala_gen.bench.step_timing",
    "train-speed": "nala_gen.bench.train_speed",
    "dit-sizes": "nala_gen.bench.dit_sizes",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in (*COMMANDS, "entropy"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[0] == "entropy":
        return entropy(argv[1:])
    module, _, function = COMMANDS[argv[0]].partition(":")
    return getattr(importlib.import_module(module), function or "main")(argv[1:])


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def entropy_random_table(norms: tuple[float, ...] = (0.25, 1.0, 2.0, 4.0, 8.0)) -> str:
    """Entropy of one fixed query direction at growing norms, against fixed random keys, per kernel."""
    data = load("entropy_vs_query_norm.json")
    lines = [
        "Attention entropy (nats) of one query direction scaled to each norm, against the same random keys "
        "(`nala-bench entropy`).",
        "",
        "| kernel | " + " | ".join(f"‖q‖ = {n:g}" for n in norms) + " | change |",
        "|---|" + "---|" * (len(norms) + 1),
    ]
    for kernel, series in data.items():
        at = dict(zip(series["norm"], series["entropy"]))
        cells = [f"{at[n]:.3f}" for n in norms]
        lines.append(row(f"`{kernel}`", *cells, f"{at[norms[-1]] - at[norms[0]]:+.3f}"))
    return "\n".join(lines)


TABLES = (Table("entropy-random", ("entropy_vs_query_norm.json",), entropy_random_table),)
