"""Data preparation in BasicSR's layouts, with no network access: :mod:`.prepare` (DIV2K sub-images, the embedded
mini set), :mod:`.standard` (the standard test sets and a training set of photographs, from a folder) and
:mod:`.photos` (the photo set from Debian's wallpaper packages).

:mod:`.prepare`'s names are re-exported here (``from nala_gen.sr.data import prepare_div2k``), as before the layout.
"""

from .prepare import (
    IMAGE_SUFFIXES,
    MINI_TRAIN,
    MINI_VAL,
    MINI_VAL_CROP,
    SCALES,
    bicubic_downscale,
    centre_crop,
    list_images,
    make_lmdb,
    modcrop,
    packaged_image,
    prepare_div2k,
    prepare_mini,
    read_rgb,
    sub_images,
    write_benchmark_split,
    write_png,
    write_train_split,
)
from .standard import prepare_benchmark, prepare_test_sets, prepare_train_set

__all__ = [
    "IMAGE_SUFFIXES",
    "MINI_TRAIN",
    "MINI_VAL",
    "MINI_VAL_CROP",
    "SCALES",
    "bicubic_downscale",
    "centre_crop",
    "list_images",
    "make_lmdb",
    "modcrop",
    "packaged_image",
    "prepare_benchmark",
    "prepare_div2k",
    "prepare_mini",
    "prepare_test_sets",
    "prepare_train_set",
    "read_rgb",
    "sub_images",
    "write_benchmark_split",
    "write_png",
    "write_train_split",
]
