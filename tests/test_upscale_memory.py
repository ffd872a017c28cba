"""The upscale job within its memory budget: banded output, the streamed PNG, the row resize and the refusal."""

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from nala_gen.bench.upscale_memory import stand_in_network
from nala_gen.sr.upscale.engine import MemoryBudgetError, Upscaler
from nala_gen.sr.upscale.imageio import read_image
from nala_gen.sr.upscale.resample import INTERPOLATIONS, RowResizer, resize_rows

MIB = 2**20
LocalSR = stand_in_network  # the memory of the job, not of the network, is under test here


def smooth(shape, dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    small = rng.random((max(shape[0] // 8, 2), max(shape[1] // 8, 2), *shape[2:])).astype(np.float32)
    big = cv2.resize(small, shape[1::-1], interpolation=cv2.INTER_LINEAR).reshape(shape)
    return np.round(big * np.iinfo(dtype).max).astype(dtype)


@pytest.mark.parametrize(
    ("src", "dst", "interpolation", "channels"),
    [
        ((37, 29), (148, 116), "cubic", 3),
        ((37, 29), (111, 87), "lanczos4", 3),
        ((40, 50), (333, 400), "lanczos4", 4),
        ((10, 7), (480, 336), "lanczos4", 0),
        ((120, 90), (35, 26), "area", 3),
        ((120, 90), (30, 23), "area", 2),
        ((64, 64), (16, 16), "area", 0),
    ],
)
def test_row_resize_equals_whole_image_resize(src, dst, interpolation, channels):
    rng = np.random.default_rng(1)
    img = rng.random((*src, channels) if channels else src).astype(np.float32)
    whole = cv2.resize(img, dst[::-1], interpolation=INTERPOLATIONS[interpolation])
    resizer = RowResizer(src, dst, interpolation, max_rows=7)
    parts, row = [], 0
    while row < src[0]:  # bands of uneven height, as the upscaler hands them on
        n = int(rng.integers(1, 9))
        parts.append(resizer.push(img[row : row + n]))
        row += n
    banded = np.concatenate(parts)
    assert banded.shape == whole.shape
    np.testing.assert_allclose(banded, whole, atol=1e-5, rtol=0)
    stop = min(20, dst[0])
    np.testing.assert_allclose(resize_rows(img, dst, interpolation, 3, stop), whole[3:stop], atol=1e-5, rtol=0)


def whole_image_reference(engine, img, outscale=None):
    """What the engine must give: one pass over the whole image, then a whole-image resize (the old engine)."""
    max_value = float(np.iinfo(img.dtype).max)
    pixels = img.astype(np.float32) / max_value
    out = engine._pass(pixels[..., :3]).clip(0, 1)
    if outscale:
        h, w = img.shape[:2]
        flag = cv2.INTER_AREA if outscale < engine.scale else cv2.INTER_LANCZOS4  # as the engine: area to shrink
        out = np.clip(cv2.resize(out, (round(w * outscale), round(h * outscale)), interpolation=flag), 0, 1)
    return np.round(out * max_value).astype(img.dtype)


@pytest.mark.parametrize("outscale", [None, 2.6, 7.0])
def test_banded_job_equals_the_whole_image_job(outscale):
    img = smooth((90, 70, 3))
    reference = whole_image_reference(Upscaler(LocalSR(), 4, tile=0), img, outscale)
    banded, readout = Upscaler(LocalSR(), 4, tile=32, tile_pad=4).upscale(img, outscale)
    assert readout.tiles == 12 and banded.shape == reference.shape
    # A 3x3 model with 8 px of overlap: tiles see their full context; only float rounding may differ.
    assert np.abs(banded.astype(int) - reference.astype(int)).max() <= 1


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((60, 50, 3), np.uint8), ((60, 50, 4), np.uint8), ((60, 50, 2), np.uint16), ((60, 50), np.uint16)],
    ids=["rgb", "rgba", "gray-alpha-16", "gray16"],
)
def test_streamed_png_equals_the_in_memory_result(tmp_path, shape, dtype):
    img = smooth(shape, dtype)
    if img.ndim == 3 and img.shape[2] in (2, 4):
        img[:, :25, -1] = 0  # a real alpha: the model upscales it too
    engine = Upscaler(LocalSR(), 4, tile=32, tile_pad=4)
    expected, _ = engine.upscale(img)
    readout = engine.upscale_to_file(img, tmp_path / "out.png")
    assert not readout.streamed
    engine.memory_budget = readout.estimate_bytes - 1  # the in-memory encode no longer fits: rows are written as made
    readout = engine.upscale_to_file(img, tmp_path / "streamed.png")
    assert readout.streamed
    for name in ("out.png", "streamed.png"):
        np.testing.assert_array_equal(read_image(tmp_path / name), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png", "streamed.png"]  # no temporaries left


JOB = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_upscale_memory import smooth
from nala_gen.bench.upscale_memory import stand_in_network as LocalSR
from nala_gen.sr.upscale.engine import Upscaler
engine = Upscaler(LocalSR(), 4, memory_budget=64 * 2**20)
print(json.dumps(engine.upscale_to_file(smooth((1000, 1000, 3)), sys.argv[2]).as_dict()))
"""


def test_the_job_stays_within_its_budget(tmp_path):
    # 1000^2 x4: the old engine held a 4000^2 float canvas, its weights and a copy (about 440 MiB) plus the
    # encoder's; within 64 MiB the job must tile, band and stream the PNG. A fresh process, as nala-sr runs it
    # (a long test session's allocator holds more than the job does).
    out = tmp_path / "big.png"
    proc = subprocess.run(
        [sys.executable, "-c", JOB, str(Path(__file__).parent), str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    readout = json.loads(proc.stdout.strip().splitlines()[-1])
    assert readout["streamed"] and readout["tiles"] > 1
    assert readout["estimate_mib"] <= 64 and readout["peak_mem_mib"] <= 64, readout
    assert read_image(out).shape == (4000, 4000, 3)


def test_a_job_that_cannot_fit_is_refused_before_any_work():
    img = smooth((300, 300, 3))
    engine = Upscaler(LocalSR(), 4, memory_budget=4 * MIB)
    with pytest.raises(MemoryBudgetError, match=r"needs about [\d,]+ MiB .* over the memory budget of 4 MiB"):
        engine.upscale(img)  # the array alone is 1,200 x 1,200 x 3 bytes (the CLI's case: tests/test_hostile.py)
