"""``nala-sr prepare photos``: a DIV2K-style training set from photographs that ship inside installed packages.

Sources: Debian's desktop wallpapers, ``plasma-workspace-wallpapers`` (``/usr/share/wallpapers/NAME/contents/
images/WxH.ext``: one picture in up to 13 resolutions) and ``mate-backgrounds`` (``/usr/share/backgrounds/mate/
nature/``), plus the scikit-image and scikit-learn photos of the embedded mini set; then, for training only,
``lomiri-wallpapers-16.04`` and ``lomiri-wallpapers-20.04`` (``/usr/share/backgrounds/NAME.jpg``, CC-BY-4.0,
CC-BY-SA-3.0/4.0 and CC0-1.0 photographs). What is kept:

* **photographs only**, by explicit lists (:data:`PLASMA_PHOTOS`, :data:`LOMIRI_PHOTOS`, decided by looking at
  each picture of the packages: plasma's other 19 wallpapers and lomiri's other 5 are renders or drawings); every
  picture of mate's ``nature/`` folder is a photograph;
* **one copy of each picture**: a plasma wallpaper's resolutions are one picture (the largest is used), and any
  two pictures whose 8x8 average hashes differ in at most :data:`DUPLICATE_BITS` bits are one (the first kept);
* **a held-out validation split by picture**: every picture lands wholly in train or in val (never sub-images of a
  training picture): 15 % of each of the first sources' packages (plasma, mate), chosen by a stable hash of their
  names; the mini set's photos keep their own split.
* **a fixed validation split**: the sources added later (:data:`TRAIN_ONLY_PACKAGES`, from lomiri on) go wholly to
  train, and are considered after every picture of the first sources, so they can neither move one of those to
  the other split nor displace one as its near-duplicate (a later picture that nearly matches an earlier one is the
  one dropped). The val split stays the 8 pictures every committed quality figure was measured on: comparability
  across training stages, bought with a val split smaller than 15 % of the enlarged set.

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
LOMIRI_ROOT = Path("/usr/share/backgrounds")
# The packages whose pictures are split 85/15 (the val split's sources), then those added for training only.
SPLIT_PACKAGES = ("plasma-workspace-wallpapers", "mate-backgrounds")
TRAIN_ONLY_PACKAGES = ("lomiri-wallpapers-16.04", "lomiri-wallpapers-20.04")
PACKAGES = (*SPLIT_PACKAGES, *TRAIN_ONLY_PACKAGES)
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
# The lomiri wallpapers that are photographs, per package (file stems under /usr/share/backgrounds; their copyright
# file names them 16.04/NAME.jpg and 20.04/NAME.jpg). The rest are renders: umang_by_Abhishek_Mudgal (16.04);
# Fossa_by_Jasper_Roks, Infinite-Sea_by_Aury88 (a star field over a rendered sea), Painting-Colors_by__herobrine7gamer
# (20.04); lomiri-wallpapers' own two are renders too.
LOMIRI_PHOTOS = {
    "lomiri-wallpapers-16.04": (
        "aitzgorri_by_Aitzol_Berasategi",
        "analogpattern_by_Peter_Nerlich",  # a colour-graded close-up of a textured surface
        "Bridge_by_Sander_Klootwijk",
        "Dragonfly_by_Bolly",
        "free_by_Peter_Nerlich",
        "friends_by_Aitzol_Berasategi",
        "greentock_by_Peter_Nerlich",
        "life_by_Aitzol_Berasategi",
        "picosdeeuropa_by_Aitzol_Berasategi",
        "Picture_0B_by_freespace",
        "Picture_1A_by_freespace",
        "seeding_by_Clements_Engelhardt",
        "sunset_by_Aitzol_Berasategi",
        "Wine_by_Jakkub_Mede",
    ),
    "lomiri-wallpapers-20.04": ("Kleiber_by_Lukas_Baubkus",),
}
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


def lomiri_pictures(
    root: Path = LOMIRI_ROOT, photos: dict[str, Sequence[str]] | None = None, copyright_dir: Path | None = None
):
    """The listed lomiri photographs (``root/NAME.jpg``), each with its package and that package's licence for it;
    for training only (``split="train"``)."""
    photos = LOMIRI_PHOTOS if photos is None else photos
    copyright_dir = copyright_dir or Path("/usr/share/doc")
    for package, names in photos.items():
        release = package.rsplit("-", 1)[1]
        for name in names:
            path = root / f"{name}.jpg"
            if not path.is_file():
                continue
            w, h = _size(path)
            licence = dep5_licence(copyright_dir / package / "copyright", f"{release}/{path.name}")
            yield Picture(f"lomiri_{name}", str(path), package, licence, w, h, split="train")


def missing_packages() -> list[str]:
    """The source packages of :data:`PACKAGES` that are not installed (by the folders they install)."""
    present = {
        PACKAGES[0]: PLASMA_ROOT.is_dir(),
        PACKAGES[1]: (MATE_ROOT / "nature").is_dir(),
        **{
            package: all((LOMIRI_ROOT / f"{name}.jpg").is_file() for name in names)
            for package, names in LOMIRI_PHOTOS.items()
        },
    }
    return [package for package in PACKAGES if not present[package]]


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
    train_only: Iterable[Picture] | None = None,
) -> dict[str, int]:
    """Write ``train/HR_sub``, ``train/LR_bicubic/X{s}_sub``, ``val/GTmod12``, ``val/LRbicx{s}`` and
    ``manifest.json``; ``pictures`` (split by package) defaults to the packaged wallpapers (:func:`plasma_pictures`,
    :func:`mate_pictures`) and ``train_only`` (every one to train, considered after ``pictures`` and the mini set)
    to :func:`lomiri_pictures` when ``pictures`` is not given, else to none."""
    for s in scales:
        if crop % s:
            raise ValueError(f"crop size {crop} is not divisible by scale {s}")
    check_writable(out_dir, folder=True)  # before the first picture is read
    if pictures is None:
        missing = missing_packages()
        if missing:
            raise ValueError(
                f"the photo packages {', '.join(missing)} are not installed: nala-sr prepare photos --install "
                f"(as root) or apt-get install {' '.join(missing)}"
            )
        pictures = [*plasma_pictures(), *mate_pictures()]
        if train_only is None:
            train_only = lomiri_pictures()
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
    # Last, so that they can neither move nor displace a picture of the split sources or the mini set.
    for picture in train_only or ():
        picture.split = "train"
        consider(picture, reduce(read_rgb(picture.path)))
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
    """``apt-get install`` the photo packages (:data:`PACKAGES`; root only; ValueError otherwise, with the command to
    run)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        raise ValueError(f"installing needs root: sudo apt-get install -y {' '.join(PACKAGES)}")
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *PACKAGES],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
