"""Data preparation in BasicSR's layouts, with no network access.

* ``prepare_div2k``: DIV2K_train_HR -> overlapping HR sub-images and their MATLAB-bicubic LR copies per scale
  (``DIV2K_train_HR_sub``, ``DIV2K_train_LR_bicubic/X{s}_sub``), optionally as LMDB with ``meta_info.txt``.
* ``write_benchmark_split``: HR images -> ``GTmod12`` (cropped to a multiple of 12, so x2/x3/x4 all divide)
  and ``LRbicx{s}``, the layout of BasicSR's Set5/Set14/B100/Urban100/Manga109 folders (the test sets themselves:
  :mod:`.standard`).
* ``prepare_mini``: the embedded set, built from the photos that ship inside scikit-image and scikit-learn:
  a train split in the DIV2K sub-image layout and a held-out validation split in the benchmark layout.

LR images come from ``basicsr.utils.matlab_functions.imresize``, the MATLAB-compatible bicubic the
benchmarks were made with; LR sub-images are the bicubic copies of the HR sub-images. Every input is checked
to open and the output folder to be writable before the first image is written, and each PNG is written
atomically, so a bad path never leaves half a dataset or half an image.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from nala_gen.fileio import check_readable, check_writable, write_atomic

SCALES = (2, 3, 4)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")

# The embedded set. Validation photos are never seen in training: the two scikit-learn photos and two
# scikit-image ones. Grayscale training photos are replicated to RGB (textures the colour ones lack).
MINI_VAL = ("sklearn:china.jpg", "sklearn:flower.jpg", "skimage:chelsea.png", "skimage:coffee.png")
MINI_TRAIN = (
    "skimage:astronaut.png",
    "skimage:hubble_deep_field.jpg",
    "skimage:ihc.png",
    "skimage:motorcycle_left.png",
    "skimage:retina.jpg",
    "skimage:rocket.jpg",
    "skimage:camera.png",
    "skimage:brick.png",
    "skimage:grass.png",
    "skimage:gravel.png",
)
# Validation images are centre-cropped so x2 inputs stay small enough for ESRT's quadratic attention.
MINI_VAL_CROP = 360


def read_rgb(path: str | Path) -> np.ndarray:
    """Any image file -> (H, W, 3) uint8 RGB."""
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def write_png(img: np.ndarray, path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(img).save(buffer, format="PNG")
    write_atomic(path, buffer.getvalue())


def modcrop(img: np.ndarray, multiple: int) -> np.ndarray:
    """Crop the bottom/right so height and width are multiples of ``multiple``."""
    h, w = img.shape[:2]
    return img[: h - h % multiple, : w - w % multiple]


def bicubic_downscale(img: np.ndarray, scale: int) -> np.ndarray:
    """MATLAB-compatible bicubic downscaling of a uint8 image whose sides divide by ``scale``."""
    from basicsr.utils.matlab_functions import imresize

    if img.shape[0] % scale or img.shape[1] % scale:
        raise ValueError(f"image of size {img.shape[1]}x{img.shape[0]} is not divisible by scale {scale}")
    lr = imresize(img.astype(np.float32) / 255.0, 1 / scale)
    return np.clip(np.round(lr * 255.0), 0, 255).astype(np.uint8)


def sub_images(img: np.ndarray, crop: int, step: int, thresh: int = 0) -> list[np.ndarray]:
    """Overlapping crop x crop tiles every ``step`` pixels, the last row/column flush with the border."""
    h, w = img.shape[:2]

    def starts(length: int) -> list[int]:
        if length < crop:
            return []
        positions = list(range(0, length - crop + 1, step))
        if length - (positions[-1] + crop) > thresh:
            positions.append(length - crop)
        return positions

    return [img[y : y + crop, x : x + crop] for y in starts(h) for x in starts(w)]


def list_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def readable_images(folder: Path) -> list[Path]:
    """:func:`list_images`, each checked to open (a symlink loop, a dangling link, no permission, a folder named
    like an image: :class:`~nala_gen.fileio.PathError`) before any output is written."""
    return [check_readable(p, folder=False) for p in list_images(check_readable(folder, folder=True))]


def write_train_split(
    named_images: Iterable[tuple[str, np.ndarray]],
    hr_dir: Path,
    lr_dirs: dict[int, Path],
    crop: int,
    step: int,
) -> int:
    """HR sub-images into ``hr_dir`` and their bicubic LR copies into ``lr_dirs[scale]``; returns the count."""
    count = 0
    for stem, img in named_images:
        for index, tile in enumerate(sub_images(img, crop, step), start=1):
            name = f"{stem}_s{index:03d}.png"
            write_png(tile, hr_dir / name)
            for scale, lr_dir in lr_dirs.items():
                write_png(bicubic_downscale(tile, scale), lr_dir / name)
            count += 1
    return count


def write_benchmark_split(named_images: Iterable[tuple[str, np.ndarray]], out_dir: Path, scales: Sequence[int]) -> int:
    """``GTmod12/<name>.png`` and ``LRbicx{s}/<name>.png`` (BasicSR's benchmark layout)."""
    count = 0
    for stem, img in named_images:
        gt = modcrop(img, 12)
        write_png(gt, out_dir / "GTmod12" / f"{stem}.png")
        for scale in scales:
            write_png(bicubic_downscale(gt, scale), out_dir / f"LRbicx{scale}" / f"{stem}.png")
        count += 1
    return count


def make_lmdb(folder: Path) -> Path:
    """Pack a folder of PNGs into ``<folder>.lmdb`` with BasicSR's ``meta_info.txt``."""
    from basicsr.utils.lmdb_util import make_lmdb_from_imgs

    lmdb_path = folder.with_suffix(".lmdb")
    if lmdb_path.exists():
        shutil.rmtree(lmdb_path)
    names = [p.name for p in list_images(folder)]
    make_lmdb_from_imgs(str(folder), str(lmdb_path), names, [Path(n).stem for n in names], n_thread=2)
    return lmdb_path


def prepare_div2k(
    root: Path,
    scales: Sequence[int] = SCALES,
    crop: int = 480,
    step: int = 240,
    lmdb: bool = False,
) -> dict[str, int]:
    """``root/DIV2K_train_HR`` -> ``DIV2K_train_HR_sub`` and ``DIV2K_train_LR_bicubic/X{s}_sub``."""
    hr_in = root / "DIV2K_train_HR"
    if not hr_in.is_dir():
        raise FileNotFoundError(f"{hr_in} not found (download DIV2K_train_HR and unpack it there)")
    hr_dir = root / "DIV2K_train_HR_sub"
    lr_dirs = {s: root / "DIV2K_train_LR_bicubic" / f"X{s}_sub" for s in scales}
    for s in scales:
        if crop % s:
            raise ValueError(f"crop size {crop} is not divisible by scale {s}")
    paths = readable_images(hr_in)
    check_writable(root, folder=True)
    images = ((p.stem, read_rgb(p)) for p in paths)
    count = write_train_split(images, hr_dir, lr_dirs, crop, step)
    if lmdb:
        for folder in (hr_dir, *lr_dirs.values()):
            make_lmdb(folder)
    return {"sub_images": count}


def packaged_image(spec: str) -> np.ndarray:
    """``skimage:NAME`` or ``sklearn:NAME`` -> RGB uint8, read from the installed package's data folder."""
    source, name = spec.split(":", 1)
    if source == "skimage":
        import skimage.data

        folder = Path(skimage.data.__file__).parent
    elif source == "sklearn":
        import sklearn.datasets

        folder = Path(sklearn.datasets.__file__).parent / "images"
    else:
        raise ValueError(f"unknown image source {source!r}")
    return read_rgb(folder / name)


def centre_crop(img: np.ndarray, size: int) -> np.ndarray:
    h, w = img.shape[:2]
    top, left = max((h - size) // 2, 0), max((w - size) // 2, 0)
    return img[top : top + size, left : left + size]


def prepare_mini(
    out_dir: Path,
    scales: Sequence[int] = SCALES,
    crop: int = 192,
    step: int = 96,
    limit: int | None = None,
) -> dict[str, int]:
    """The embedded set: ``train/HR_sub``, ``train/LR_bicubic/X{s}_sub``, ``val/GTmod12``, ``val/LRbicx{s}``.

    ``limit`` keeps only the first images of each split (tests use it to stay fast).
    """
    for s in scales:
        if crop % s:
            raise ValueError(f"crop size {crop} is not divisible by scale {s}")
    train_specs, val_specs = MINI_TRAIN[:limit], MINI_VAL[:limit]
    check_writable(out_dir, folder=True)

    def stem(spec: str) -> str:
        return Path(spec.split(":", 1)[1]).stem

    train = ((stem(s), packaged_image(s)) for s in train_specs)
    lr_dirs = {s: out_dir / "train" / "LR_bicubic" / f"X{s}_sub" for s in scales}
    n_train = write_train_split(train, out_dir / "train" / "HR_sub", lr_dirs, crop, step)
    val = ((stem(s), centre_crop(packaged_image(s), MINI_VAL_CROP)) for s in val_specs)
    n_val = write_benchmark_split(val, out_dir / "val", scales)
    return {"train_sub_images": n_train, "val_images": n_val}
