"""PSNR / SSIM of named models and bicubic on a benchmark-layout folder (``GTmod12`` + ``LRbicx{s}``).

Y channel with ``crop_border = scale``, BasicSR's metric functions: the convention of super-resolution papers.
Bicubic is MATLAB's (``basicsr.utils.matlab_functions.imresize``), as in the papers' bicubic rows.

    nala-sr evaluate --data datasets/mini/val --scale 4 --models bicubic esrt-x4 nalasr-light-x4

A model given as ``NAME@PRECISION`` (``nalasr-light-x4@bf16``) runs at that precision (the upscaler's ``fp32``,
``bf16`` or ``fp16``; plain names at the upscaler's default, fp32 on a CPU), and is reported under that spec,
beside the row of the same weights without it.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import numpy as np

from nala_gen.cliargs import bounded, tile_setting
from nala_gen.fileio import check_readable, check_writable, update_json

from .data import list_images, read_rgb


def bicubic_upscale(lr: np.ndarray, scale: int) -> np.ndarray:
    from basicsr.utils.matlab_functions import imresize

    up = imresize(lr.astype(np.float32) / 255.0, scale)
    return np.clip(np.round(up * 255.0), 0, 255).astype(np.uint8)


def score(sr: np.ndarray, gt: np.ndarray, scale: int) -> tuple[float, float]:
    """(PSNR, SSIM) on Y, border of ``scale`` pixels cropped; RGB uint8 (H, W, 3) inputs."""
    from basicsr.metrics import calculate_psnr, calculate_ssim

    # BasicSR's Y conversion expects BGR order (it reads images with OpenCV).
    sr_bgr, gt_bgr = sr[..., ::-1].astype(np.float64), gt[..., ::-1].astype(np.float64)
    kwargs = {"crop_border": scale, "input_order": "HWC", "test_y_channel": True}
    return calculate_psnr(sr_bgr, gt_bgr, **kwargs), calculate_ssim(sr_bgr, gt_bgr, **kwargs)


def _read(path: Path) -> np.ndarray:
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path} is missing (every GTmod12 image needs its LR copy)")
    check_readable(path, folder=False)  # a symlink loop, a dangling link, no permission, a folder: said as such
    try:
        return read_rgb(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not a readable image ({type(err).__name__})") from None


def read_pair(gt_path: Path, lr_path: Path, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """(GT, LR) RGB uint8 images whose sizes agree with ``scale``; a one-line error otherwise."""
    gt, lr = _read(gt_path), _read(lr_path)
    if gt.shape[:2] != (lr.shape[0] * scale, lr.shape[1] * scale):
        raise ValueError(
            f"{gt_path.name}: GT is {gt.shape[1]}x{gt.shape[0]} but its LR x{scale} is "
            f"{lr.shape[1] * scale}x{lr.shape[0] * scale}"
        )
    return gt, lr


def model_precision(spec: str) -> tuple[str, str]:
    """``NAME@PRECISION`` -> (NAME, PRECISION); a spec without a known precision suffix -> (spec, ``auto``)."""
    from .upscale.engine import PRECISIONS

    name, _, precision = spec.rpartition("@")
    return (name, precision) if name and precision in PRECISIONS else (spec, "auto")


def evaluate(
    data: Path,
    scale: int,
    models: list[str],
    option: Path | None = None,
    tile: int | str = 0,
    memory_budget: int | None = None,
) -> dict[str, dict]:
    """``{model: {"psnr": mean, "ssim": mean, "images": n, "tiled_images": n, "per_image": {...}}}`` over the
    folder's images.

    ``models``: ``bicubic``, names, weight paths, or BasicSR ``.pth`` checkpoints described by ``option``; each
    optionally ``@fp32``, ``@bf16`` or ``@fp16`` (the precision it runs at; the upscaler's ``auto`` without).
    ``tile``: the upscaler's (0: each image whole; ``auto``: whole where the job fits the memory budget, tiled
    where it does not, as a quadratic attention needs on large pictures).
    ``memory_budget``: bytes per job for ``tile="auto"`` (default: half of the host's available memory, which two
    evaluations side by side would both claim).
    """
    from .loading import load_sr_model
    from .upscale.engine import Upscaler

    missing = not os.path.lexists(data) or (data.is_dir() and not os.path.lexists(data / "GTmod12"))
    if missing:  # a path that is there but broken (a loop, a file) is said as such by the read below
        raise FileNotFoundError(
            f"{data / 'GTmod12'} not found: make it with nala-sr prepare benchmarks SRC (the standard test sets from "
            "a folder of their HR images) or nala-sr prepare mini (the embedded set)"
        )
    gt_paths = list_images(data / "GTmod12")
    if not gt_paths:
        raise FileNotFoundError(f"no images in {data / 'GTmod12'} (nala-sr prepare mini makes the embedded set)")
    results = {}
    engines = {}  # every model's engine first: a precision this machine cannot run fails before any image
    for spec in models:
        name, precision = model_precision(spec)
        if name != "bicubic":
            net = load_sr_model(name, scale, option)[0]
            engines[spec] = Upscaler(net, scale, precision=precision, tile=tile, memory_budget=memory_budget)
    for name in models:
        engine = engines.get(name)
        per_image, tiled = {}, 0
        for gt_path in gt_paths:
            gt, lr = read_pair(gt_path, data / f"LRbicx{scale}" / gt_path.name, scale)
            if engine is None:
                sr = bicubic_upscale(lr, scale)
            else:
                sr, info = engine.upscale(lr)
                tiled += info.tiles > 1
            per_image[gt_path.stem] = score(sr, gt, scale)
        results[name] = {
            "psnr": statistics.mean(p for p, _ in per_image.values()),
            "ssim": statistics.mean(s for _, s in per_image.values()),
            "images": len(per_image),
            "tiled_images": tiled,  # images the memory budget split into blended tiles (0: each image whole)
            "per_image": per_image,
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-sr evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("datasets/mini/val"))
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["bicubic"])
    parser.add_argument("--opt", type=Path, help="BasicSR option file describing .pth checkpoints' network")
    parser.add_argument(
        "-t", "--tile", type=tile_setting, default=0, help="0 (each image whole; default), auto or pixels"
    )
    parser.add_argument(
        "--memory-budget-mb", type=bounded(float, 1), help="memory per job for --tile auto (default: half of free)"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.json:  # refused before the evaluation, not after it (the results file is read, then replaced)
        check_writable(args.json)
        if os.path.lexists(args.json):
            check_readable(args.json, folder=False)
    from .upscale.engine import budget_bytes

    results = evaluate(args.data, args.scale, args.models, args.opt, args.tile, budget_bytes(args.memory_budget_mb))
    print(f"| x{args.scale} on {args.data} | PSNR (Y) | SSIM (Y) |\n|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['psnr']:.2f} | {r['ssim']:.4f} |")
    if args.json:
        block = {"data": str(args.data), "metric": "Y channel, crop = scale", **results}
        update_json(args.json, f"x{args.scale}", block)
    return 0
