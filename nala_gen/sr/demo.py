"""``make demo``: upscale the bundled sample x4 with the shipped NaLaSR weights and write a comparison.

The sample (``assets/chelsea_lr_x4.png``) is the x4 MATLAB-bicubic LR of a 360 x 360 crop of scikit-image's
"chelsea" photo, which is in the embedded validation split (never trained on).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from nala_gen.resources import sample_image

from .evaluate import bicubic_upscale
from .loading import load_sr_model
from .upscale.engine import Upscaler
from .upscale.imageio import read_image, write_image_atomic

SAMPLE = sample_image()


def labelled(img: np.ndarray, text: str) -> Image.Image:
    panel = Image.fromarray(img).convert("RGB")
    canvas = Image.new("RGB", (panel.width, panel.height + 18), "white")
    canvas.paste(panel, (0, 18))
    ImageDraw.Draw(canvas).text((4, 3), text, fill="black")
    return canvas


def side_by_side(panels: list[Image.Image]) -> Image.Image:
    out = Image.new("RGB", (sum(p.width for p in panels) + 4 * (len(panels) - 1), panels[0].height), "white")
    x = 0
    for p in panels:
        out.paste(p, (x, 0))
        x += p.width + 4
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nala_gen.sr.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--input", type=Path, default=SAMPLE)
    parser.add_argument("--model", default="nalasr-light-x4")
    parser.add_argument("--out", type=Path, default=Path("outputs/demo"))
    args = parser.parse_args(argv)

    lr = read_image(args.input)
    model, info = load_sr_model(args.model, 4)
    sr, readout = Upscaler(model, 4).upscale(lr)
    result = write_image_atomic(sr, args.out / f"{args.input.stem}_nalasr_x4.png")
    nearest = np.asarray(Image.fromarray(lr).resize((lr.shape[1] * 4, lr.shape[0] * 4), Image.NEAREST))
    panels = [labelled(nearest, "input (nearest x4)"), labelled(bicubic_upscale(lr, 4), "bicubic x4")]
    panels.append(labelled(sr, f"{info['name']} x4"))
    comparison = args.out / "comparison.png"
    side_by_side(panels).save(comparison)
    print(
        f"upscaled {args.input} ({lr.shape[1]}x{lr.shape[0]}) with {info['name']} in {readout.latency_s:.2f} s, "
        f"peak {readout.peak_mem_bytes / 2**20:.0f} MiB, {readout.tokens:,} tokens"
    )
    print(f"result:     {result}")
    print(f"comparison: {comparison}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
