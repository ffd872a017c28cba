"""Writing sampled images: the grid of a class-conditional sample and an atomic, format-by-suffix save."""

from __future__ import annotations

import io
from pathlib import Path

from nala_gen.fileio import write_atomic


def make_grid(images: list, rows: int, cols: int):
    """PIL images (all the same size and mode), row-major -> one PIL image of rows x cols tiles."""
    from PIL import Image

    width, height = images[0].size
    grid = Image.new(images[0].mode, (cols * width, rows * height))
    for i, img in enumerate(images):
        grid.paste(img, ((i % cols) * width, (i // cols) * height))
    return grid


def image_format(path: Path) -> str:
    from PIL import Image

    fmt = Image.registered_extensions().get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell the image format of {path} from its suffix (use .png, .jpg, .webp...)")
    return fmt


def save_atomic(img, path: Path) -> Path:
    """Encode into a temporary file beside ``path``, then rename it into place (no half-written outputs)."""
    buffer = io.BytesIO()
    img.save(buffer, format=image_format(path))
    return write_atomic(path, buffer.getvalue())
