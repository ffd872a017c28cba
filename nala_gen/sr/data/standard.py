"""The field's own data from a folder: the standard test sets (Set5, Set14, B100, Urban100, ...) and a training set
of photographs, made into BasicSR's layouts.

* :func:`prepare_test_sets`: every test set found under a source folder (one sub-folder of HR images per set, or
  ``<set>/HR``) -> ``OUT/<Set>/GTmod12`` and ``OUT/<Set>/LRbicx{2,3,4}``, the layout of BasicSR's benchmark
  folders and of the test option files (``options/test/*``);
* :func:`prepare_train_set`: every picture under a source folder -> DIV2K-style HR sub-images and their MATLAB-bicubic
  LR copies (``OUT/HR_sub``, ``OUT/LR_bicubic/X{s}_sub``), after checking by content that none of them is a test
  picture (:func:`test_set_overlap`).

Both check every input before the first byte is written: a ``SHA256SUMS`` file in the source folder or one of its
two parents (``sha256sum``'s format, paths relative to its folder) is verified for every listed file, each image is
decoded whole and must hold the 12-pixel crop every scale needs. Each output set is written into a hidden sibling
folder and moved into place when complete, so a failure or an interruption leaves the earlier state, never half a
set. The images stay where they are: nothing is copied into the project.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

from nala_gen.fileio import check_readable, check_writable, file_sha256

from .prepare import (
    SCALES,
    bicubic_downscale,
    list_images,
    modcrop,
    read_rgb,
    write_benchmark_split,
    write_png,
    write_train_split,
)

# Folder names as downloads spell them -> the name the option files use.
STANDARD_NAMES = {
    "set5": "Set5",
    "set14": "Set14",
    "b100": "B100",
    "bsd100": "B100",
    "bsds100": "B100",
    "urban100": "Urban100",
    "manga109": "Manga109",
}
CHECKSUMS = "SHA256SUMS"
MODCROP = 12  # GTmod12: divisible by 2, 3 and 4


def canonical_name(folder: str) -> str:
    """``bsds100`` -> ``B100``, ``set5`` -> ``Set5``; other names as they are."""
    return STANDARD_NAMES.get(folder.lower(), folder)


def find_checksums(src: Path) -> Path | None:
    """The ``SHA256SUMS`` of ``src``, its parent or its grandparent (the nearest), or None."""
    for folder in (src, *list(src.resolve().parents)[:2]):
        if (folder / CHECKSUMS).is_file():
            return folder / CHECKSUMS
    return None


def read_checksums(path: Path) -> dict[Path, str]:
    """``sha256sum`` output -> {absolute path: hex digest}; a malformed line is a one-line error."""
    sums = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        digest, _, name = line.partition(" ")
        name = name.lstrip(" *")  # "  name" (text mode) or " *name" (binary mode)
        if len(digest) != 64 or not name or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise ValueError(f"{path}:{number} is not a sha256sum line ('<64 hex digits>  <path>')")
        sums[(path.parent / name).resolve()] = digest.lower()
    return sums


def verify_checksums(src: Path, paths: Sequence[Path]) -> tuple[Path | None, int]:
    """Check ``paths`` against the ``SHA256SUMS`` found for ``src`` (:func:`find_checksums`): a file whose digest
    differs, or a listed file under ``src`` that is gone, is a one-line error. Returns (the file, how many of
    ``paths`` it listed)."""
    checksums = find_checksums(src)
    if checksums is None:
        return None, 0
    sums = read_checksums(checksums)
    root = src.resolve()
    for listed in sums:
        if listed.is_relative_to(root) and not os.path.lexists(listed):
            raise FileNotFoundError(f"{listed} is listed in {checksums} but missing")
    checked = 0
    for path in paths:
        expected = sums.get(path.resolve())
        if expected is None:
            continue
        if file_sha256(path) != expected:
            raise ValueError(f"{path}: its SHA256 differs from {checksums} (a corrupted or changed file)")
        checked += 1
    return checksums, checked


def decode_checked(path: Path, crop: int = MODCROP) -> tuple[int, int]:
    """Decode ``path`` whole (a truncated or corrupt file fails here, not half-way through writing) and check that
    it holds a ``crop`` x ``crop`` crop; its (width, height)."""
    try:
        with Image.open(path) as img:
            img.load()
            width, height = img.size
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{path} is not a readable image ({type(err).__name__}: {err})") from None
    if width < crop or height < crop:
        raise ValueError(
            f"{path} is {width}x{height}, smaller than the {crop}-pixel crop that makes x2, x3 and x4 divide it"
        )
    return width, height


def set_images(folder: Path) -> list[Path]:
    """The HR images of one test set: the folder's own images, or those of its ``HR`` sub-folder."""
    hr = folder / "HR"
    images = list_images(folder)
    if not images and hr.is_dir():
        images = list_images(hr)
    return [check_readable(p, folder=False) for p in images]


def find_test_sets(src: Path) -> dict[str, list[Path]]:
    """{name: HR images} for every sub-folder of ``src`` that holds images (itself or in ``HR/``), or ``src`` itself
    when it holds images and no sub-folder does; the standard sets first in the field's order, the others by name.
    Two folders of one name (``B100`` and ``BSDS100``) are an error."""
    check_readable(src, folder=True)
    sets: dict[str, list[Path]] = {}
    folders: dict[str, Path] = {}
    for folder in sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")):
        images = set_images(folder)
        if not images:
            continue
        name = canonical_name(folder.name)
        if name in sets:
            raise ValueError(f"{folders[name]} and {folder} are both {name}: keep one")
        sets[name], folders[name] = images, folder
    if not sets and list_images(src):
        sets[canonical_name(src.name)] = set_images(src)
    order = list(dict.fromkeys(STANDARD_NAMES.values()))  # the field's order first (Set5, Set14, B100, ...)
    return dict(
        sorted(sets.items(), key=lambda item: (order.index(item[0]) if item[0] in order else len(order), item[0]))
    )


@contextmanager
def staged_folder(final: Path, layout: Callable[[str], bool]) -> Iterator[Path]:
    """A hidden sibling of ``final`` to write into; on success it replaces ``final`` (whose old copy is removed
    last), on any error or interruption it is removed and ``final`` is as it was. ``final`` may hold only entries
    whose names ``layout`` accepts (an earlier run's output): anything else is a one-line error, never deleted."""
    if final.is_dir():
        other = sorted(p.name for p in final.iterdir() if not layout(p.name))
        if other:
            raise ValueError(
                f"{final} holds {other[0]!r}, which this command does not make: give a new or empty folder"
            )
    elif os.path.lexists(final):
        raise NotADirectoryError(f"{final} is not a folder")
    final.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    stage = final.parent / f".{final.name}.partial-{token}"
    old = final.parent / f".{final.name}.old-{token}"
    try:
        yield stage
        if final.exists():
            final.rename(old)
        stage.rename(final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def benchmark_layout(name: str) -> bool:
    """The entries of a benchmark-layout folder (``GTmod12``, ``LRbicx2`` ...)."""
    return name == "GTmod12" or (name.startswith("LRbicx") and name[6:].isdigit())


def train_layout(name: str) -> bool:
    """The entries of a training folder :func:`prepare_train_set` makes."""
    return name in ("HR_sub", "LR_bicubic")


def prepare_benchmark(hr_dir: Path, out_dir: Path, scales: Sequence[int] = SCALES) -> dict[str, int]:
    """One folder of HR images -> ``out_dir/GTmod12`` and ``out_dir/LRbicx{s}``, every image checked first and
    the folder replaced whole (see the module docstring)."""
    paths = set_images(check_readable(hr_dir, folder=True))
    if not paths:
        raise FileNotFoundError(f"no images in {hr_dir}")
    verify_checksums(hr_dir, paths)
    for path in paths:
        decode_checked(path)
    check_writable(out_dir, folder=True)
    with staged_folder(out_dir, benchmark_layout) as stage:
        return {"images": write_benchmark_split(((p.stem, read_rgb(p)) for p in paths), stage, scales)}


def prepare_test_sets(
    src: Path,
    out: Path = Path("datasets"),
    scales: Sequence[int] = SCALES,
    only: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every test set under ``src`` (:func:`find_test_sets`; ``only``: those of these names) -> ``out/<name>/GTmod12``
    and ``LRbicx{s}``.

    Returns ``{"sets": {name: images}, "checksums": path or None, "checked": files verified}``. Raises a
    ``ValueError`` / ``OSError`` with one line (nothing written) for: no test set, a checksum mismatch, an
    unreadable or too small image, an unwritable ``out``.
    """
    sets = find_test_sets(src)
    if not sets:
        raise FileNotFoundError(f"no test set under {src} (expected sub-folders of HR images, e.g. Set5/, Urban100/)")
    if only:
        wanted = [canonical_name(name) for name in only]
        absent = [name for name in wanted if name not in sets]
        if absent:
            raise FileNotFoundError(f"no test set {absent[0]} under {src} (found: {', '.join(sets)})")
        sets = {name: sets[name] for name in wanted}
    every = [p for paths in sets.values() for p in paths]
    checksums, checked = verify_checksums(src, every)  # checksums first: the cheaper line to read
    for path in every:
        decode_checked(path)
    check_writable(out, folder=True)
    for name, paths in sets.items():
        if progress:
            progress(f"{name}: {len(paths)} images")
        with staged_folder(out / name, benchmark_layout) as stage:
            write_benchmark_split(((p.stem, read_rgb(p)) for p in paths), stage, scales)
    return {"sets": {name: len(paths) for name, paths in sets.items()}, "checksums": checksums, "checked": checked}


REDUCE = 4  # pictures are compared at a quarter of their size: enough to tell pictures apart, and fast


def _reduced_grey(img: np.ndarray) -> np.ndarray:
    """Grey, box-averaged over ``REDUCE`` x ``REDUCE`` pixels: (H // REDUCE, W // REDUCE) float64."""
    grey = np.asarray(Image.fromarray(img).convert("L"), dtype=np.float64)
    h, w = grey.shape[0] // REDUCE * REDUCE, grey.shape[1] // REDUCE * REDUCE
    return grey[:h, :w].reshape(h // REDUCE, REDUCE, w // REDUCE, REDUCE).mean(axis=(1, 3))


def _window_thumbnails(grey: np.ndarray, size: tuple[int, int], stride: int, side: int) -> np.ndarray:
    """(windows, side * side): the ``side`` x ``side`` block means of every ``size`` (h, w) window of ``grey`` at
    ``stride``, each row with zero mean and unit norm (from one integral image: no resize per window)."""
    h, w = size
    integral = np.zeros((grey.shape[0] + 1, grey.shape[1] + 1))
    integral[1:, 1:] = grey.cumsum(0).cumsum(1)
    tops = np.arange(0, grey.shape[0] - h + 1, stride)
    lefts = np.arange(0, grey.shape[1] - w + 1, stride)
    rows = tops[:, None] + np.round(np.linspace(0, h, side + 1)).astype(int)[None, :]  # (ny, side + 1)
    cols = lefts[:, None] + np.round(np.linspace(0, w, side + 1)).astype(int)[None, :]  # (nx, side + 1)
    corners = integral[rows[:, :, None, None], cols[None, None, :, :]]  # (ny, side + 1, nx, side + 1)
    sums = corners[:, 1:, :, 1:] - corners[:, :-1, :, 1:] - corners[:, 1:, :, :-1] + corners[:, :-1, :, :-1]
    blocks = sums.transpose(0, 2, 1, 3).reshape(len(tops) * len(lefts), side * side)
    blocks = blocks - blocks.mean(axis=1, keepdims=True)
    return blocks / (np.linalg.norm(blocks, axis=1, keepdims=True) + 1e-9)


def picture_match(big: np.ndarray, small: np.ndarray, side: int = 16) -> float:
    """How well the picture ``small`` (reduced grey, :func:`_reduced_grey`) matches ``big`` or a window of it of its
    size: the best correlation (-1 to 1) of their ``side`` x ``side`` block thumbnails, windows every pixel of the
    reduced pictures (``REDUCE`` pixels of the originals). -1 where ``small`` does not fit in ``big``."""
    h, w = small.shape
    if h > big.shape[0] or w > big.shape[1] or min(h, w) < side:
        return -1.0
    target = _window_thumbnails(small, (h, w), 1, side)[0]
    return float((_window_thumbnails(big, (h, w), 1, side) @ target).max())


def test_set_overlap(
    train: Sequence[Path], tests: Sequence[Path], threshold: float = 0.95
) -> list[tuple[Path, Path, float]]:
    """Training pictures that show a test picture, by content: (train, test, correlation) for each pair where the
    test picture matches the training picture or a crop of it (:func:`picture_match`, the training picture in
    either orientation) above ``threshold``, confirmed on finer thumbnails. Names are not compared: copies of
    these sets name their files differently. A training picture that is a crop of a larger test picture is not
    looked for (none of the usual training sets is cut from a test picture)."""
    test_greys = [(p, _reduced_grey(read_rgb(p))) for p in tests]
    found = []
    for path in train:
        grey = _reduced_grey(read_rgb(path))
        for turned in (grey, np.ascontiguousarray(grey.T)):
            for test_path, test_grey in test_greys:
                coarse = picture_match(turned, test_grey, side=8)
                if coarse > threshold:
                    fine = picture_match(turned, test_grey, side=16)
                    if fine > threshold:
                        found.append((path, test_path, fine))
    return found


def prepare_train_set(
    src: Path,
    out: Path,
    tests: Path | None = None,
    scales: Sequence[int] = SCALES,
    crop: int = 240,
    step: int = 120,
    min_side: int = 192,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every picture under ``src`` (its sub-folders too) -> ``out/HR_sub`` and ``out/LR_bicubic/X{s}_sub``.

    A picture of at least ``crop`` pixels each way gives HR sub-images of ``crop`` every ``step`` pixels, the last
    flush with the border (BasicSR's DIV2K recipe, ``extract_subimages.py``, at a size for pictures of about
    480x320); a smaller one of at least ``min_side`` each way (x4's 48-pixel LR patch) is kept whole, cropped to a
    multiple of 12; a smaller one still is left out and counted. Each HR image has its MATLAB-bicubic LR copies.
    Flips and rotations are the training's (``use_hflip``, ``use_rot``), not stored. ``tests``: a folder of test
    sets (:func:`find_test_sets`) none of whose pictures may be in the training set (:func:`test_set_overlap`; a
    hit is a one-line error, nothing written).

    Returns ``{"pictures", "sub_images", "whole", "too_small", "checked"}`` (counts; ``checked``: files whose
    SHA256 was verified).
    """
    for s in scales:
        if crop % s:
            raise ValueError(f"crop size {crop} is not divisible by scale {s}")
    check_readable(src, folder=True)
    paths = sorted(p for folder in [src, *sorted(q for q in src.rglob("*") if q.is_dir())] for p in list_images(folder))
    if not paths:
        raise FileNotFoundError(f"no images under {src}")
    paths = [check_readable(p, folder=False) for p in paths]
    _, checked = verify_checksums(src, paths)
    sizes = {p: decode_checked(p) for p in paths}
    if tests is not None:
        test_paths = [p for group in find_test_sets(tests).values() for p in group]
        if progress:
            progress(f"checking {len(paths)} training pictures against {len(test_paths)} test pictures by content")
        hits = test_set_overlap(paths, test_paths)
        if hits:
            train_path, test_path, r = hits[0]
            raise ValueError(
                f"{train_path} shows the test picture {test_path} (correlation {r:.3f}; {len(hits)} such pair(s)): "
                "take it out of the training set"
            )
    check_writable(out, folder=True)
    # names stay unique across sub-folders (T91/t1 and another set's t1)
    stems = {p: "_".join(p.relative_to(src).with_suffix("").parts) for p in paths}
    large = [p for p in paths if min(sizes[p]) >= crop]
    whole = [p for p in paths if min_side <= min(sizes[p]) < crop]
    with staged_folder(out, train_layout) as stage:
        if progress:
            progress(f"{len(large)} pictures -> {crop}px sub-images every {step}px, {len(whole)} kept whole")
        lr_dirs = {s: stage / "LR_bicubic" / f"X{s}_sub" for s in scales}
        count = write_train_split(((stems[p], read_rgb(p)) for p in large), stage / "HR_sub", lr_dirs, crop, step)
        for path in whole:
            img = modcrop(read_rgb(path), MODCROP)
            write_png(img, stage / "HR_sub" / f"{stems[path]}.png")
            for scale, lr_dir in lr_dirs.items():
                write_png(bicubic_downscale(img, scale), lr_dir / f"{stems[path]}.png")
            count += 1
    return {
        "pictures": len(large) + len(whole),
        "sub_images": count,
        "whole": len(whole),
        "too_small": len(paths) - len(large) - len(whole),
        "checked": checked,
    }
