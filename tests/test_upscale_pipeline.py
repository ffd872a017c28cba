"""Keeping the cores busy: decode ahead / encode behind (--io-threads) and batched passes (--batch)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from nala_gen.sr.loading import build_arch
from nala_gen.sr.upscale.engine import Upscaler
from nala_gen.sr.upscale.imageio import read_image, write_image_atomic
from nala_gen.weights import write_weights

TINY = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}


def tiny_net():
    torch.manual_seed(0)
    return build_arch("NaLaSR", TINY).eval()


@pytest.fixture()
def folder(tmp_path):
    """A folder that mixes what a job meets: runs of one size (batchable), other sizes, gray, alpha, 16-bit,
    a JPEG, and a broken file in the middle."""
    write_weights(tiny_net().state_dict(), tmp_path / "w", "tiny-x4", "sr", "NaLaSR", TINY, {})
    rng = np.random.default_rng(0)
    src = tmp_path / "in"
    for i in range(5):
        write_image_atomic(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8), src / f"a{i}.png")
    write_image_atomic(rng.integers(0, 256, (33, 27), dtype=np.uint8), src / "b_gray.png")
    write_image_atomic(rng.integers(0, 256, (40, 48, 4), dtype=np.uint8), src / "c_alpha.png")
    write_image_atomic(rng.integers(0, 65536, (40, 48, 3), dtype=np.uint16), src / "d_deep.png")
    (src / "e_broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    write_image_atomic(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8), src / "f0.jpg")
    for i in range(3):
        write_image_atomic(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8), src / f"g{i}.png")
    return tmp_path, src


def run(tmp_path, src, out, *options):
    cmd = [sys.executable, "-m", "nala_gen.sr.cli", "upscale", str(src), "-o", str(out), "--json", "-q"]
    cmd += ["-m", str(tmp_path / "w" / "tiny-x4.json"), "--tile", "0", *options]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc, lines


def test_decode_ahead_and_encode_behind_write_the_sequential_files_byte_for_byte(folder):
    tmp_path, src = folder
    seq, seq_lines = run(tmp_path, src, tmp_path / "seq", "--io-threads", "0")
    pipe, pipe_lines = run(tmp_path, src, tmp_path / "pipe", "--io-threads", "1")
    assert seq.returncode == pipe.returncode == 1  # the broken file fails; every other image is done
    assert "e_broken.png" in pipe.stderr and pipe.stderr.count("error:") == 1
    # The same reports in the same (input) order.
    assert [(r["input"], r["status"]) for r in seq_lines] == [(r["input"], r["status"]) for r in pipe_lines]
    names = sorted(p.name for p in (tmp_path / "seq").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "pipe").iterdir()) and len(names) == 12
    for name in names:
        assert (tmp_path / "seq" / name).read_bytes() == (tmp_path / "pipe" / name).read_bytes(), name


def test_batched_images_match_one_at_a_time_within_one_step(folder):
    tmp_path, src = folder
    one, _ = run(tmp_path, src, tmp_path / "one", "--io-threads", "1")
    batched, lines = run(tmp_path, src, tmp_path / "batched", "--batch", "auto", "--io-threads", "1")
    assert one.returncode == batched.returncode == 1
    by_input = {r["input"].rsplit("/", 1)[-1]: r for r in lines if r["status"] == "ok"}
    assert by_input["a0.png"]["batch"] == 5  # the run of five same-size RGB images went through as one batch
    assert by_input["g0.png"]["batch"] >= 3  # f0.jpg (same size, no alpha) joins g0..g2
    assert by_input["c_alpha.png"]["batch"] == 1  # alpha runs alone
    assert by_input["b_gray.png"]["batch"] == 1  # a size of its own
    for name in sorted(p.name for p in (tmp_path / "one").iterdir()):
        a = read_image(tmp_path / "one" / name).astype(np.int64)
        b = read_image(tmp_path / "batched" / name).astype(np.int64)
        if name.endswith(".jpg"):
            continue  # a one-step change before JPEG's lossy encode can move its decoded pixels further
        assert a.shape == b.shape and np.abs(a - b).max() <= 1, name
        assert (a != b).mean() < 1e-3, name


def test_group_and_tile_batches_equal_single_passes_to_1e5_before_rounding():
    net = tiny_net()
    rng = np.random.default_rng(1)
    # 16-bit images: one step is 1.5e-5, so outputs within one step are within 1e-5 before rounding (+ half a step)
    imgs = [rng.integers(0, 65536, (24, 28, 3), dtype=np.uint16) for _ in range(3)]
    single = Upscaler(net, 4, tile=0)
    batched = Upscaler(net, 4, tile=0, batch=3)
    plan = batched.plan_group(24, 28, 3, 2, None, 3)
    assert plan is not None and plan.batch == 3 and plan.total_bytes > single.plan(24, 28, 3, 2).total_bytes
    for img, (out, readout) in zip(imgs, batched.upscale_group(imgs)):
        assert readout.batch == 3
        assert np.abs(single.upscale(img)[0].astype(np.int64) - out).max() <= 1
    big = rng.integers(0, 65536, (70, 100, 3), dtype=np.uint16)
    reference, r1 = Upscaler(net, 4, tile=32, tile_pad=4).upscale(big)
    tiled, r2 = Upscaler(net, 4, tile=32, tile_pad=4, batch="auto").upscale(big)
    assert r1.batch == 1 and r2.batch > 1 and r1.tiles == r2.tiles
    assert np.abs(reference.astype(np.int64) - tiled).max() <= 1


def test_a_batch_never_leaves_the_budget_nor_changes_the_tile():
    net = tiny_net()
    roomy = Upscaler(net, 4, batch="auto", memory_budget=2**30)
    tight = Upscaler(net, 4, batch="auto", memory_budget=roomy.plan(40, 48, 3, 1).total_bytes * 3 // 2)
    assert roomy.plan_group(40, 48, 3, 1, None, 8).batch == 8
    assert tight.plan_group(40, 48, 3, 1, None, 8) is None  # two would not fit: none is grouped
    # Tiles: the batch is what the budget keeps; the tile is the one an unbatched job gets.
    for budget in (48 * 2**20, 96 * 2**20):
        alone = Upscaler(net, 4, memory_budget=budget).plan(300, 300)
        batched = Upscaler(net, 4, batch="auto", memory_budget=budget).plan(300, 300)
        assert batched.tile == alone.tile and batched.total_bytes <= budget
    with pytest.raises(ValueError, match="batch"):
        Upscaler(net, 4, batch=0)


def test_bad_batch_and_io_threads_values_are_one_line_errors(folder):
    tmp_path, src = folder
    for option in (["--batch", "0"], ["--batch", "many"], ["--io-threads", "3"]):
        proc, _ = run(tmp_path, src, tmp_path / "x", *option)
        assert proc.returncode == 2 and "error: argument" in proc.stderr.strip().splitlines()[-1]
        assert not (tmp_path / "x").exists()
