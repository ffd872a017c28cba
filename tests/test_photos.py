"""``nala-sr prepare photos`` on made folders laid out as the wallpaper packages are."""

import json

import cv2
import numpy as np

from nala_gen.sr.data.photos import (
    Picture,
    assign_splits,
    dep5_licence,
    lomiri_pictures,
    mate_pictures,
    plasma_pictures,
    prepare_photos,
)
from nala_gen.sr.upscale.imageio import write_image_atomic


def photo(seed, h=300, w=400):
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (h // 25, w // 25, 3)).astype(np.float32)
    return np.clip(cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC), 0, 255).astype(np.uint8)


def test_photos_keeps_listed_photographs_once_splits_by_picture_and_writes_the_manifest(tmp_path):
    plasma, mate = tmp_path / "wallpapers", tmp_path / "mate"
    big = photo(1, 600, 800)
    for size in ((400, 300), (800, 600)):  # one wallpaper in two resolutions
        write_image_atomic(
            cv2.resize(big, size, interpolation=cv2.INTER_AREA),
            plasma / "Lake" / "contents" / "images" / f"{size[0]}x{size[1]}.png",
        )
    write_image_atomic(photo(2), plasma / "Render" / "contents" / "images" / "400x300.png")  # not on the list
    write_image_atomic(photo(3), mate / "nature" / "Meadow.png")
    write_image_atomic(photo(4), mate / "nature" / "Forest.png")
    write_image_atomic(cv2.resize(big, (500, 375), interpolation=cv2.INTER_AREA), mate / "nature" / "LakeAgain.png")
    (tmp_path / "plasma.copyright").write_text("Format: x\n\nFiles: *\nCopyright: KDE\nLicense: GPL-2+\n")
    (tmp_path / "mate.copyright").write_text(
        "Format: x\n\nFiles: nature/Meadow.png\n nature/LakeAgain.png\nLicense: GPL-2+\n\n"
        "Files: nature/Forest.png\nLicense: CC-BY-SA-4.0\n"
    )
    assert dep5_licence(tmp_path / "mate.copyright", "nature/LakeAgain.png") == "GPL-2+"  # a continued Files: line
    pictures = [
        *plasma_pictures(plasma, photos=("Lake", "Missing"), copyright_file=tmp_path / "plasma.copyright"),
        *mate_pictures(mate, copyright_file=tmp_path / "mate.copyright"),
    ]
    out = tmp_path / "set"
    counts = prepare_photos(out, pictures, scales=[2, 4], crop=96, step=96, include_mini=False, val_fraction=0.5)
    manifest = json.loads((out / "manifest.json").read_text())
    kept = {p["name"]: p for p in manifest["pictures"]}
    assert set(kept) == {"plasma_Lake", "mate_Forest", "mate_Meadow"}  # the render is not listed; the copy is dropped
    assert manifest["duplicates_dropped"] == [{"name": "mate_LakeAgain", "duplicate_of": "plasma_Lake"}]
    lake = kept["plasma_Lake"]
    assert (lake["width"], lake["height"], lake["variants"], lake["licence"]) == (800, 600, 2, "GPL-2+")
    assert kept["mate_Forest"]["licence"] == "CC-BY-SA-4.0" and kept["mate_Meadow"]["package"] == "mate-backgrounds"
    # Split by picture: a val picture has no sub-image in train, a train picture no val image.
    val = {p["name"] for p in manifest["pictures"] if p["split"] == "val"}
    # Half of each package's pictures, rounded up: the one plasma picture and one of mate's two.
    assert "plasma_Lake" in val and len(val & {"mate_Forest", "mate_Meadow"}) == 1
    train_stems = {f.name.rsplit("_s", 1)[0] for f in (out / "train" / "HR_sub").iterdir()}
    assert train_stems == set(kept) - val and not train_stems & val
    assert {f.stem for f in (out / "val" / "GTmod12").iterdir()} == val
    assert counts["train_sub_images"] == len(list((out / "train" / "LR_bicubic" / "X4_sub").iterdir())) > 0


def test_splits_hold_out_a_share_of_each_package_and_keep_preset_ones():
    pictures = [Picture(f"a{i}", "", "pkg-a", "", 1, 1) for i in range(10)]
    pictures += [Picture(f"b{i}", "", "pkg-b", "", 1, 1) for i in range(3)]
    pictures += [Picture("mini_train", "", "pkg-b", "", 1, 1, split="train")]
    assign_splits(pictures, 0.15)
    val = [p.name for p in pictures if p.split == "val"]
    assert sum(n.startswith("a") for n in val) == 2 and sum(n.startswith("b") for n in val) == 1  # ceil(15 %)
    assert pictures[-1].split == "train"
    again = [
        Picture(p.name, "", p.package, "", 1, 1, split="train" if p.name == "mini_train" else "") for p in pictures
    ]
    assign_splits(again, 0.15)
    assert [p.split for p in again] == [p.split for p in pictures]  # stable


def _splits(out):
    manifest = json.loads((out / "manifest.json").read_text())
    return {p["name"]: p["split"] for p in manifest["pictures"]}, manifest["duplicates_dropped"]


def test_sources_added_for_training_leave_every_earlier_picture_in_its_split(tmp_path):
    """The val split is the one every committed figure was measured on: adding sources must not change it."""
    folder = tmp_path / "pictures"
    images = {f"p{i}": photo(10 + i) for i in range(7)}
    for name, img in images.items():
        write_image_atomic(img, folder / f"{name}.png")

    def first():  # two packages split 85/15, as plasma and mate
        return [
            Picture(name, str(folder / f"{name}.png"), "pkg-a" if i < 4 else "pkg-b", "GPL-2+", 400, 300)
            for i, name in enumerate(images)
        ]

    before = tmp_path / "before"
    prepare_photos(before, first(), scales=[4], crop=96, step=96, include_mini=False, val_fraction=0.3)
    old, _ = _splits(before)
    assert {"train", "val"} == set(old.values())
    val_name = next(n for n, split in old.items() if split == "val")
    train_name = next(n for n, split in old.items() if split == "train")
    # New sources: new pictures, one of them in an existing package's name (a split source's hash would put its
    # share in val), and copies of a val and a train picture listed as new: the copies are what is dropped.
    write_image_atomic(photo(40), folder / "n0.png")
    write_image_atomic(photo(41), folder / "n1.png")
    added = [
        Picture("n0", str(folder / "n0.png"), "pkg-new", "CC0-1.0", 400, 300),
        Picture("n1", str(folder / "n1.png"), "pkg-a", "CC0-1.0", 400, 300),
        Picture("copy_of_val", str(folder / f"{val_name}.png"), "pkg-new", "CC0-1.0", 400, 300),
        Picture("copy_of_train", str(folder / f"{train_name}.png"), "pkg-new", "CC0-1.0", 400, 300),
    ]
    after = tmp_path / "after"
    prepare_photos(after, first(), scales=[4], crop=96, step=96, include_mini=False, val_fraction=0.3, train_only=added)
    new, dropped = _splits(after)
    assert {n: new[n] for n in old} == old
    assert new["n0"] == new["n1"] == "train"
    assert {d["name"]: d["duplicate_of"] for d in dropped} == {"copy_of_val": val_name, "copy_of_train": train_name}
    assert {f.stem for f in (after / "val" / "GTmod12").iterdir()} == {
        f.stem for f in (before / "val" / "GTmod12").iterdir()
    }


def test_lomiri_lists_photographs_with_each_package_licence(tmp_path):
    root, docs = tmp_path / "backgrounds", tmp_path / "doc"
    write_image_atomic(photo(5), root / "Bridge.jpg")
    write_image_atomic(photo(6), root / "Bird.jpg")
    write_image_atomic(photo(7), root / "Render.jpg")  # not listed
    dep5 = (
        "Format: x\n\nFiles: 16.04/Bridge.jpg\nLicense: CC-BY-SA-4.0\n\n"
        "Files: 20.04/Bird.jpg\nLicense: CC-BY-SA-3.0\n\nFiles: 16.04/Render.jpg\nLicense: CC0-1.0\n"
    )
    for package in ("lomiri-wallpapers-16.04", "lomiri-wallpapers-20.04"):
        (docs / package).mkdir(parents=True)
        (docs / package / "copyright").write_text(dep5)
    photos = {"lomiri-wallpapers-16.04": ("Bridge", "Missing"), "lomiri-wallpapers-20.04": ("Bird",)}
    got = list(lomiri_pictures(root, photos, docs))
    assert [(p.name, p.package, p.licence, p.split) for p in got] == [
        ("lomiri_Bridge", "lomiri-wallpapers-16.04", "CC-BY-SA-4.0", "train"),
        ("lomiri_Bird", "lomiri-wallpapers-20.04", "CC-BY-SA-3.0", "train"),
    ]
