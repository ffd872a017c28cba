"""``nala-gen``: sample, train, list and export NaLaDiT / NaLaSiT class-conditional image models.

nala-gen sample --model NAME_OR_DIR [--class 3|three|3,7|all] [--grid N] [--steps 50] [--cfg 2] [--seed 0]
                [--scheduler ddpm|ddim|dpm|euler|heun] [--size PX] [--zoom K] [-o out.png] [--json]
nala-gen train --config options/diffusion/naladit_digits.yml [--override key=value ...] [--resume latest|PATH]
nala-gen models
nala-gen export RUN_DIR_OR_PIPELINE --name NAME [--out weights]
nala-gen quality --model NAME_OR_DIR [--per-class 100] [--steps 50] [--cfg 2] [--json FILE]

``sample`` writes one image: one row per requested class, ``--grid N`` samples of that class side by side (so
``--class 3 --grid 8`` is a row of eight 3s, ``--class all --grid 4`` a 10 x 4 grid for digits). ``--model`` is a
pipeline folder (``OUTPUT_DIR/pipeline`` of a training) or a named weight (``nala-gen models``) whose sha256 is
checked first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from nala_gen.cliargs import bounded, error_line, run_command

from .images import image_format, make_grid, save_atomic
from .loading import SCHEDULERS, load_pipeline, new_scheduler, parse_classes


def parse_size(text: str) -> tuple[int, int]:
    """``32`` or ``32x48`` (height x width) -> (height, width)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} is not PX or HxW") from None
    if len(parts) not in (1, 2) or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} is not PX or HxW")
    return (parts[0], parts[-1])


# ------------------------------------------------------------------------------------------------------ commands
def sample(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nala-gen sample", description="Class-conditional samples of a NaLaDiT.")
    parser.add_argument("-m", "--model", required=True, help="pipeline folder or named weights (nala-gen models)")
    parser.add_argument("-c", "--class", dest="classes", default="all", help="id, name, comma list, or all")
    parser.add_argument(
        "--grid", type=bounded(int, 1, 64), default=1, help="samples per class, side by side (default 1, up to 64)"
    )
    parser.add_argument("--steps", type=bounded(int, 1, 1000), default=50, help="scheduler steps (default 50)")
    parser.add_argument(
        "--cfg", type=bounded(float, 1, 100), default=1.0, help="classifier-free guidance scale (1: off, up to 100)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scheduler", choices=list(SCHEDULERS), help="default: the saved one")
    parser.add_argument("--size", type=parse_size, help="sample size PX or HxW (default: the training size)")
    parser.add_argument(
        "--zoom", type=bounded(int, 1, 32), default=1, help="enlarge the written image K times (nearest, up to 32)"
    )
    parser.add_argument("-o", "--output", type=Path, default=Path("sample.png"))
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--json", action="store_true", help="print one JSON object (readout) instead of the path")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    import torch
    from PIL import Image

    from nala_gen.devices import pick_device
    from nala_gen.fileio import check_readable, check_writable
    from nala_gen.weights import WeightsError

    try:
        image_format(args.output)
        check_writable(args.output)  # before the pipeline loads and samples, not after
        if os.path.lexists(args.model):  # a pipeline folder (else a name): a broken link or no permission, said so
            check_readable(args.model)
        pipe, name = load_pipeline(args.model)
        if args.scheduler:
            pipe.scheduler = new_scheduler(pipe, args.scheduler)
        scheduler = type(pipe.scheduler).__name__
        classes = parse_classes(args.classes, pipe)
        device = pick_device(args.device)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=args.quiet or args.json)
        height, width = args.size or (None, None)
        labels = [c for c in classes for _ in range(args.grid)]
        images = pipe(
            labels,
            num_inference_steps=args.steps,
            guidance_scale=args.cfg,
            generator=torch.Generator().manual_seed(args.seed),
            height=height,
            width=width,
        ).images
        grid = make_grid(images, len(classes), args.grid)
        if args.zoom > 1:
            grid = grid.resize((grid.width * args.zoom, grid.height * args.zoom), Image.Resampling.NEAREST)
        save_atomic(grid, args.output)
    except (WeightsError, ValueError, OSError) as err:
        print(f"nala-gen sample: error: {error_line(err).splitlines()[0]}", file=sys.stderr)
        return 1
    readout = pipe.last_readout
    record = {
        "output": str(args.output),
        "model": name,
        "classes": classes,
        "labels": [pipe.id2label.get(c, "unconditional") for c in classes],
        "grid": args.grid,
        "image_size": [images[0].height, images[0].width],
        "output_size": [grid.height, grid.width],
        "scheduler": scheduler,
        "cfg": args.cfg,
        "seed": args.seed,
        **{k: readout[k] for k in ("latency_s", "peak_mem_bytes", "tokens", "steps", "model_evals", "batch")},
        **{k: readout[k] for k in ("mode", "kernel", "device")},
    }
    print(json.dumps(record) if args.json else args.output, flush=True)
    return 0


def models(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="nala-gen models", description="List the named diffusion weights.").parse_args(argv)
    from nala_gen.weights import broken_cards, list_weights

    cards = list_weights("diffusion")
    for path, reason in broken_cards():
        print(f"warning: skipped a broken weight card {path}: {reason}", file=sys.stderr)
    if not cards:
        print("no named diffusion weights installed (train one, then nala-gen export)")
    for card in cards:
        steps = card.info.get("steps")
        extra = f"; {steps} steps on {card.info.get('data', {}).get('source', '?')}" if steps else ""
        print(f"{card.name:<24} {card.arch:<8} {card.payload}{extra}")
    return 0


# What a diffusion weight card keeps from the run's training_info.json: what it learned from, for how long, how.
CARD_INFO_KEYS = (
    "steps", "steps_this_run", "resumed_from", "wall_time_s", "s_per_step", "cpu_s_per_step", "num_processes",
    "device", "objective", "data", "params", "command",
)  # fmt: skip


def current_config_names(folder: Path) -> dict:
    """A pipeline folder's transformer config, its deprecated kernel keys (``attention_kernel``, ...) rewritten in
    place under today's names (``kernel``, ``kernel_options``), as ``save_pretrained`` writes the file."""
    from nala_gen.attention.modules import KERNEL_KEY_DEFAULTS, with_kernel_keys

    path = folder / "transformer" / "config.json"
    config = json.loads(path.read_text())
    current = with_kernel_keys(config)
    if current != config:
        current = {**KERNEL_KEY_DEFAULTS, **current}  # every field, as saving writes them (an old null is dropped)
        path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    return current


def export_pipeline(source: Path, name: str, out: Path) -> Path:
    """Copy a trained pipeline to ``out/NAME/`` and write its card ``out/NAME.json`` (with the folder's sha256).

    ``source`` is a training's ``output_dir`` (its ``pipeline/`` and ``training_info.json`` are used) or a
    pipeline folder. A config saved with deprecated key names is exported under today's.
    """
    from nala_gen.weights import sha256_of

    pipeline = source / "pipeline" if (source / "pipeline" / "model_index.json").is_file() else source
    if not (pipeline / "model_index.json").is_file():
        raise ValueError(f"{source} is neither a training output folder nor a pipeline folder")
    info_path = pipeline.parent / "training_info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    scheduler = json.loads((pipeline / "scheduler" / "scheduler_config.json").read_text())
    arch = "NaLaSiT" if "FlowMatch" in scheduler.get("_class_name", "") else "NaLaDiT"
    out.mkdir(parents=True, exist_ok=True)
    target, tmp = out / name, out / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(pipeline, tmp)
    config = current_config_names(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    card = {
        "name": name,
        "task": "diffusion",
        "arch": arch,
        "config": {k: v for k, v in config.items() if not k.startswith("_")},
        "payload": name,
        "sha256": sha256_of(target),
        "info": {k: info[k] for k in CARD_INFO_KEYS if k in info},
    }
    card_path = out / f"{name}.json"
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return card_path


def export(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nala-gen export", description="A trained pipeline -> named weights.")
    parser.add_argument("source", type=Path, help="a training's output_dir or its pipeline folder")
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", type=Path, help="weights folder (default: the user's, searched by every command)")
    args = parser.parse_args(argv)
    from nala_gen.weights import user_weights_dir

    card = export_pipeline(args.source, args.name, args.out or user_weights_dir())
    print(f"wrote {card} and {card.with_suffix('')}/")
    return 0


def train(argv: list[str]) -> int:
    from .train import main as run

    return run(argv)


def quality(argv: list[str]) -> int:
    from .quality import main as run

    return run(argv)


COMMANDS = {"sample": sample, "train": train, "models": models, "export": export, "quality": quality}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]

    return run_command(f"nala-gen {command}", lambda: COMMANDS[command](rest))  # bad paths and values: one line


if __name__ == "__main__":
    sys.exit(main())
