"""``nala-sr prepare photos``: a DIV2K-style training set from photographs that ship inside installed packages.

Sources: Debian's desktop wallpapers, ``plasma-workspace-wallpapers`` (``/usr/share/wallpapers/NAME/contents/
images/WxH.ext``: one picture in up to 13 resolutions) and ``mate-backgrounds`` (``/usr/share/backgrounds/mate/
nature/``), plus the scikit-image and scikit-learn photos of the embedded mini set. What is kept:

* **photographs only**, by an explicit list (:data:`PLASMA_PHOTOS`, decided by looking at each of the 30 plasma
  wallpapers: the other 19 are renders or drawings); every picture of mate's ``nature/`` folder is a photograph;
* **one copy of each picture**: a plasma wallpaper's resolutions are one picture (the largest is used), and any
  two pictures whose 8x8 average hashes differ in at most :data:`DUPLICATE_BITS` bits are one (the first kept);
* **a held-out validation split by picture**: every picture lands wholly in train or in val (never sub-images of a
  training picture): 15 % of each package's pictures, chosen by a stable hash of their names; the mini set's
  photos keep their own split.

Large pictures are reduced (area) so that their longer side is at most :data:`MAX_SIDE` (DIV2K's ~2K), which
also averages away JPEG blocks; then train pictures are cut into ``crop`` sub-images every ``step`` pixels with
MATLAB-bicubic LR at each scale (the DIV2K recipe of :func:`~nala_gen.sr.data.prepare_div2k`), and val pictures
are written in BasicSR's benchmark layout (``GTmod12``, ``LRbicx{s}``). ``manifest.json`` lists each picture with
its source package, licence (from the package's Debian copyright file), original size and split.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from nala_gen.fileio import check_writable, write_atomic

from .prepare import MINI_TRAIN, MINI_VAL, SCALES, packaged_image, read_rgb, write_benchmark_split, write_train_split

PLASMA_ROOT = Path("/usr/share/wallpapers")
MATE_ROOT = Path("/usr/share/backgrounds/mate")
PACKAGES = ("plasma-workspace-wallpapers", "mate-backgrounds")
# The plasma wallpapers that are photographs (the rest: Altai, Autumn, Canopee, Cascade, Cluster, Elarun, Flow,
# FlyingKonqui, Honeywave, IceCold, Kay, Kokkini, MilkyWay, Opal, PastelHills, Patak, SafeLanding, Shell, Volna
# are renders or drawings).
PLASMA_PHOTOS = (
    "BytheWater",
    "ColdRipple",
    "ColorfulCups",
    "DarkestHour",
    "EveningGlow",
    "FallenLeaf",
    "Grey",
    "Kite",
    "OneStandsOut",
    "Path",
    "summer_1am",
)
MAX_SIDE = 2040
DUPLICATE_BITS = 4
VAL_FRACTION = 0.15


@dataclass
class Picture:
    """One photograph: where it comes from and what may be done with it."""

    name: str
    path: str
    package: str
    licence: str
    width: int
    height: int
    variants: int = 1
    split: str = ""


def dep5_licence(copyright_file: Path, relative: str) -> str:
    """The licence a Debian machine-readable copyright file gives ``relative`` (the last matching stanza wins)."""
    if not copyright_file.is_file():
        return "unknown (no copyright file)"
    licence, patterns = "unknown", []
    for stanza in copyright_file.read_text(errors="replace").split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if "Files" in fields and "License" in fields:
            patterns = fields["Files"].split()
            if any(fnmatch.fnmatch(relative, p) for p in patterns):
                licence = fields["License"].split()[0]
    return licence


def _size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as img:
        return img.size


def plasma_pictures(
    root: Path = PLASMA_ROOT, photos: Sequence[str] = PLASMA_PHOTOS, copyright_file: Path | None = None
):
    """The listed wallpapers, each as its largest resolution."""
    copyright_file = copyright_file or Path("/usr/share/doc/plasma-workspace-wallpapers/copyright")
    for name in photos:
        variants = sorted((root / name / "contents" / "images").glob("*"), key=lambda p: np.prod(_size(p)))
        if not variants:
            continue
        w, h = _size(variants[-1])
        licence = dep5_licence(copyright_file, f"{name}/contents/images/{variants[-1].name}")
        yield Picture(f"plasma_{name}", str(variants[-1]), PACKAGES[0], licence, w, h, len(variants))


def mate_pictures(root: Path = MATE_ROOT, copyright_file: Path | None = None):
    copyright_file = copyright_file or Path("/usr/share/doc/mate-backgrounds/copyright")
    for path in sorted((root / "nature").glob("*")):
        if path.suffix.lower() in (".jpg", ".jpeg", ".png"):
            w, h = _size(path)
            licence = dep5_licence(copyright_file, f"nature/{path.name}")
            yield Picture(f"mate_{path.stem}", str(path), PACKAGES[1], licence, w, h)


def average_hash(img: np.ndarray) -> int:
    """64-bit hash: an 8x8 grey thumbnail thresholded at its mean (equal for resized copies of one picture)."""
    grey = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY) if img.ndim == 3 else img
    small = cv2.resize(grey.astype(np.float32), (8, 8), interpolation=cv2.INTER_AREA)
    bits = (small > small.mean()).flatten()
    return int("".join("1" if b else "0" for b in bits), 2)


def reduce(img: np.ndarray, max_side: int = MAX_SIDE) -> np.ndarray:
    """Area-downscale so that the longer side is at most ``max_side`` (never enlarged)."""
    h, w = img.shape[:2]
    factor = max_side / max(h, w)
    if factor >= 1:
        return img
    return cv2.resize(img, (round(w * factor), round(h * factor)), interpolation=cv2.INTER_AREA)


def name_hash(name: str) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)


def assign_splits(pictures: list[Picture], fraction: float = VAL_FRACTION) -> None:
    """Hold out ``ceil(fraction * n)`` pictures of each package (those with the lowest name hashes: stable, and
    independent of the others), so every source is in the validation split; a preset split is kept."""
    by_package: dict[str, list[Picture]] = {}
    for picture in pictures:
        if not picture.split:
            by_package.setdefault(picture.package, []).append(picture)
    for group in by_package.values():
        held_out = {p.name for p in sorted(group, key=lambda p: name_hash(p.name))[: math.ceil(fraction * len(group))]}
        for picture in group:
            picture.split = "val" if picture.name in held_out else "train"


def prepare_photos(
    out_dir: Path,
    pictures: Iterable[Picture] | None = None,
    scales: Sequence[int] = SCALES,
    crop: int = 480,
    step: int = 240,
    include_mini: bool = True,
    lmdb: bool = False,
    val_fraction: float = VAL_FRACTION,
) -> dict[str, int]:
    """Write ``train/HR_sub``, ``train/LR_bicubic/X{s}_sub``, ``val/GTmod12``, ``val/LRbicx{s}`` and
    ``manifest.json``; ``pictures`` defaults to the packaged wallpapers (:func:`plasma_pictures`,
    :func:`mate_pictures`)."""
    for s in scales:
        if crop % s:
            raise ValueError(f"crop size {crop} is not divisible by scale {s}")
    check_writable(out_dir, folder=True)  # before the first picture is read
    if pictures is None:
        pictures = [*plasma_pictures(), *mate_pictures()]
    chosen: list[tuple[Picture, np.ndarray]] = []
    hashes: list[int] = []
    dropped: list[dict] = []

    def consider(picture: Picture, img: np.ndarray) -> None:
        h = average_hash(img)
        twin = next(
            (chosen[i][0].name for i, other in enumerate(hashes) if bin(h ^ other).count("1") <= DUPLICATE_BITS), None
        )
        if twin:
            dropped.append({"name": picture.name, "duplicate_of": twin})
            return
        hashes.append(h)
        chosen.append((picture, img))

    for picture in pictures:
        consider(picture, reduce(read_rgb(picture.path)))
    if include_mini:
        for spec in (*MINI_TRAIN, *MINI_VAL):
            source, file = spec.split(":", 1)
            img = packaged_image(spec)
            package = "scikit-image" if source == "skimage" else "scikit-learn"
            licence = (
                "BSD-3-Clause (scikit-image data)" if source == "skimage" else "see scikit-learn's images/README.txt"
            )
            name = f"{source}_{Path(file).stem}"
            consider(
                # The mini set's photos keep the mini set's own split.
                Picture(name, spec, package, licence, *img.shape[1::-1], split="val" if spec in MINI_VAL else "train"),
                img,
            )
    assign_splits([p for p, _ in chosen], val_fraction)
    train = [(p.name, img) for p, img in chosen if p.split == "train"]
    val = [(p.name, img) for p, img in chosen if p.split == "val"]
    if not train:
        raise ValueError(
            "no training pictures found (install the wallpaper packages: nala-sr prepare photos --install)"
        )
    lr_dirs = {s: out_dir / "train" / "LR_bicubic" / f"X{s}_sub" for s in scales}
    n_sub = write_train_split(train, out_dir / "train" / "HR_sub", lr_dirs, crop, step)
    n_val = write_benchmark_split(val, out_dir / "val", scales)
    if lmdb:
        from .prepare import make_lmdb

        for folder in (out_dir / "train" / "HR_sub", *lr_dirs.values()):
            make_lmdb(folder)
    manifest = {
        "pictures": [asdict(p) for p, _ in chosen],
        "duplicates_dropped": dropped,
        "max_side": MAX_SIDE,
        "crop": crop,
        "step": step,
        "scales": list(scales),
        "train_sub_images": n_sub,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "manifest.json", json.dumps(manifest, indent=1).encode())
    return {"train_pictures": len(train), "train_sub_images": n_sub, "val_images": n_val, "duplicates": len(dropped)}


def install_packages() -> None:
    """``apt-get install`` the wallpaper packages (root only; ValueError otherwise, with the command to run)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        raise ValueError(f"installing needs root: sudo apt-get install -y {' '.join(PACKAGES)}")
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *PACKAGES],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
