"""The hostile-input corpus: each case a bad but plausible command, asserting its exit code, a one-line message
and which files exist afterwards. Inputs are made on the fly (tiny files)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert lines and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # argparse prints its usage first; the error itself is one line.
    assert all(needle in lines[-1] for needle in needles), lines[-1]


def image(path: Path, size=(12, 10)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--tile-pad", "-5"], "--tile-pad"),
        (["--outscale", "inf"], "--outscale"),
        (["--outscale", "nan"], "--outscale"),
        (["--outscale", "0"], "--outscale"),
        (["--memory-budget-mb", "nan"], "--memory-budget-mb"),
        (["--memory-budget-mb", "-1"], "--memory-budget-mb"),
        (["--max-pixels", "0"], "--max-pixels"),
        (["--tile", "-3"], "tile"),
        (["--tile", "big"], "tile"),
    ],
)
def test_upscale_numbers_are_checked_before_any_work(tmp_path, option, message):
    src = image(tmp_path / "in.png")
    proc = run("nala_gen.sr.cli", "upscale", str(src), "-o", str(tmp_path / "out"), *option, cwd=tmp_path)
    one_line_error(proc, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.png"]  # nothing written


def test_a_job_over_its_memory_budget_is_refused_up_front_with_its_estimate(tmp_path):
    # Before: --memory-budget-mb bounded only the network pass (a 1500^2 job peaked at 2,220 MiB under 512 MiB).
    src = image(tmp_path / "in.jpg", size=(300, 300))
    proc = run(
        "nala_gen.sr.cli", "upscale", str(src), "-o", str(tmp_path / "out.jpg"), "--memory-budget-mb", "3", cwd=tmp_path
    )
    one_line_error(
        proc, "needs about", "MiB", "over the memory budget of 3 MiB", ".png output is written as it is made"
    )
    assert proc.returncode == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["in.jpg"]


def test_upscale_refuses_outputs_that_would_collide(tmp_path):
    a, b = image(tmp_path / "A" / "full.jpg"), image(tmp_path / "B" / "full.jpg")
    proc = run("nala_gen.sr.cli", "upscale", str(a), str(b), "-o", str(tmp_path / "out"), cwd=tmp_path)
    one_line_error(proc, "would both write", "full_x4")
    assert not (tmp_path / "out").exists()


def test_upscale_one_output_file_for_many_inputs_is_refused(tmp_path):
    a, b = image(tmp_path / "a.png"), image(tmp_path / "b.png")
    proc = run("nala_gen.sr.cli", "upscale", str(a), str(b), "-o", str(tmp_path / "x.png"), cwd=tmp_path)
    one_line_error(proc, "names one file", "give a folder")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--cfg", "nan"], "--cfg"),
        (["--cfg", "-3"], "--cfg"),
        (["--steps", "0"], "--steps"),
        (["--grid", "100000"], "--grid"),
        (["--zoom", "100000"], "--zoom"),
    ],
)
def test_sample_numbers_are_checked_before_any_work(tmp_path, option, message):
    proc = run(
        "nala_gen.diffusion.cli", "sample", "-m", "naladit-digits", "-o", str(tmp_path / "s.png"), *option, cwd=tmp_path
    )
    one_line_error(proc, message)
    assert list(tmp_path.iterdir()) == []


def test_a_pipeline_with_nan_weights_is_refused(tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from nala_gen.weights import resolve

    folder = tmp_path / "nan-pipeline"
    shutil.copytree(resolve("naladit-digits").payload, folder)
    payload = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(payload)
    state["proj_out.weight"] = torch.full_like(state["proj_out.weight"], float("nan"))
    save_file(state, payload)
    proc = run("nala_gen.diffusion.cli", "sample", "-m", str(folder), "-o", str(tmp_path / "s.png"), cwd=tmp_path)
    one_line_error(proc, "non-finite", "proj_out.weight")
    assert not (tmp_path / "s.png").exists()


def test_sr_weights_with_nan_are_refused(tmp_path):

    from nala_gen.sr.loading import build_arch
    from nala_gen.weights import write_weights

    config = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    state = build_arch("NaLaSR", config).state_dict()
    state["head.weight"][0, 0, 0, 0] = float("inf")
    write_weights(state, tmp_path, "bad", "sr", "NaLaSR", config, {})
    src = image(tmp_path / "in.png")
    proc = run("nala_gen.sr.cli", "upscale", str(src), "-m", str(tmp_path / "bad.json"), cwd=tmp_path)
    one_line_error(proc, "non-finite", "head.weight")
    assert not (tmp_path / "in_x4.png").exists()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_gray_alpha_stays_gray(tmp_path, dtype):
    from nala_gen.sr.loading import build_arch
    from nala_gen.sr.upscale.engine import Upscaler
    from nala_gen.sr.upscale.imageio import read_image, write_image_atomic

    rng = np.random.default_rng(1)
    top = np.iinfo(dtype).max
    la = np.stack((rng.integers(0, top, (14, 18)), np.full((14, 18), top // 2)), -1).astype(dtype)
    if dtype == np.uint8:
        Image.fromarray(la, mode="LA").save(tmp_path / "la.png")
        img = read_image(tmp_path / "la.png")
        assert img.shape == (14, 18, 2)
    else:
        img = la
    config = {"upscale": 2, "num_block": 1, "num_feat": 16, "num_heads": 4}
    out, _ = Upscaler(build_arch("NaLaSR", config).eval(), 2, tile=0).upscale(img)
    assert out.shape == (28, 36, 2) and out.dtype == dtype
    written = read_image(write_image_atomic(out, tmp_path / "out.png"))
    np.testing.assert_array_equal(written, out)  # a gray+alpha PNG (8 or 16 bits): still gray + alpha


@pytest.mark.parametrize(("signum", "code", "word"), [(15, 143, "terminated"), (2, 130, "interrupted")])
def test_a_signal_mid_batch_ends_in_one_line_and_leaves_no_temporary_file(tmp_path, signum, code, word):
    import signal
    import time

    from nala_gen.sr.loading import build_arch
    from nala_gen.weights import write_weights

    config = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    write_weights(build_arch("NaLaSR", config).state_dict(), tmp_path, "tiny", "sr", "NaLaSR", config, {})
    for i in range(40):
        image(tmp_path / "in" / f"{i:02d}.png", size=(96, 96))
    cmd = [sys.executable, "-m", "nala_gen.sr.cli", "upscale", str(tmp_path / "in"), "-o", str(tmp_path / "out")]
    proc = subprocess.Popen(
        [*cmd, "-m", str(tmp_path / "tiny.json"), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background jobs start with SIGINT ignored, and Python keeps that: give the child Ctrl-C back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline().startswith("{")  # the first image is done: the batch is running
    time.sleep(0.05)
    proc.send_signal(signal.Signals(signum))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert word in lines[-1] and "Traceback" not in err
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out and len(out) < 40 and all(name.endswith("_x4.png") for name in out)  # no .part left behind


@pytest.mark.parametrize("device", ["tpu", "cuda:7x"])
def test_unknown_devices_are_one_line_errors(tmp_path, device):
    src = image(tmp_path / "in.png")
    sr = run("nala_gen.sr.cli", "upscale", str(src), "--device", device, cwd=tmp_path)
    one_line_error(sr, "unknown device")
    gen = run("nala_gen.diffusion.cli", "sample", "-m", "naladit-digits", "--device", device, cwd=tmp_path)
    one_line_error(gen, "unknown device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.png"]


def test_an_unwritable_output_is_reported_per_image_and_the_batch_goes_on(tmp_path):
    from nala_gen.sr.loading import build_arch
    from nala_gen.weights import write_weights

    config = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    write_weights(build_arch("NaLaSR", config).state_dict(), tmp_path, "tiny", "sr", "NaLaSR", config, {})
    a, b = image(tmp_path / "in" / "a.png"), image(tmp_path / "in" / "b.png")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a_x4.png").mkdir()  # a folder where a's output would go: the write fails (also as root)
    proc = run(
        "nala_gen.sr.cli",
        "upscale",
        str(a),
        str(b),
        "-o",
        str(tmp_path / "out"),
        "-m",
        str(tmp_path / "tiny.json"),
        "-q",
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "a.png" in proc.stderr and (tmp_path / "out" / "b_x4.png").is_file()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a_x4.png", "b_x4.png"]


def test_a_broken_card_is_reported_not_skipped_silently(tmp_path):
    import os

    (tmp_path / "half.json").write_text('{"name": "half", "task": "sr"')  # truncated
    (tmp_path / "nofields.json").write_text('{"name": "x"}')
    env = {**os.environ, "NALA_GEN_WEIGHTS": str(tmp_path)}
    for module in ("nala_gen.sr.cli", "nala_gen.diffusion.cli"):
        proc = subprocess.run([sys.executable, "-m", module, "models"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0
        assert "half.json: unreadable" in proc.stderr and "nofields.json: no 'task' field" in proc.stderr


def test_prepare_refuses_empty_results_and_negative_limits(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run("nala_gen.sr.cli", "prepare", "benchmark", str(tmp_path / "empty"), str(tmp_path / "out"), cwd=tmp_path)
    one_line_error(proc, "no images were written")
    proc = run("nala_gen.sr.cli", "prepare", "mini", str(tmp_path / "mini"), "--limit", "-9", cwd=tmp_path)
    one_line_error(proc, "--limit")
    assert not (tmp_path / "mini").exists()


def test_the_apps_upscale_tab_defaults_to_nalasr():
    pytest.importorskip("gradio")
    from nala_gen.app.ui import _preferred_model, _scale_choices

    choices = [("esrt-x4 · x4", "esrt-x4"), ("nalasr-light-x4 · x4", "nalasr-light-x4")]
    assert _preferred_model(choices, 4) == "nalasr-light-x4"  # ESRT is minutes slower at large inputs
    assert _preferred_model(choices[:1], 4) == "esrt-x4"  # the default is not installed: the first one
    assert _scale_choices([("a", 3, "a")]) == ["2", "3", "4"]  # strings, as the API schema lists them


def _benchmark_folder(root: Path, gt_size=(24, 24), lr_size=(6, 6)) -> Path:
    image(root / "GTmod12" / "a.png", size=gt_size)
    image(root / "LRbicx4" / "a.png", size=lr_size)
    return root


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("text", "not a readable image"),
        ("size", "GT is 24x24 but its LR x4 is 28x28"),
        ("missing_lr", "is missing"),
        ("json_folder", "Is a directory"),
        ("bad_tile", "tile must be 'auto', 0 (whole image) or a size in pixels"),
    ],
)
def test_evaluate_bad_folders_are_one_line_errors(tmp_path, damage, message):
    data = _benchmark_folder(tmp_path / "val", lr_size=(7, 7) if damage == "size" else (6, 6))
    extra = []
    if damage == "text":
        (data / "GTmod12" / "b.png").write_text("not an image")
        (data / "LRbicx4" / "b.png").write_text("not an image")
    if damage == "missing_lr":
        (data / "LRbicx4" / "a.png").unlink()
    if damage == "json_folder":
        (tmp_path / "out.json").mkdir()
        extra = ["--json", str(tmp_path / "out.json")]
    if damage == "bad_tile":
        extra = ["--tile", "half"]
    proc = run(
        "nala_gen.sr.cli", "evaluate", "--data", str(data), "--scale", "4", "--models", "bicubic", *extra, cwd=tmp_path
    )
    one_line_error(proc, message)


def test_basicsr_checkpoints_are_written_atomically(tmp_path):
    import pickle

    import torch

    from nala_gen.sr.train import _AtomicSaveTorch

    shim = _AtomicSaveTorch("torch")
    target = tmp_path / "net_g_5.pth"
    shim.save({"w": torch.ones(2)}, target)
    assert torch.load(target, weights_only=True)["w"].sum() == 2
    with pytest.raises((pickle.PicklingError, AttributeError)):  # a failing write (a local lambda cannot be pickled)
        shim.save({"f": lambda: 0}, tmp_path / "net_g_6.pth")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net_g_5.pth"]
    assert shim.nn is torch.nn  # everything else is torch itself


def test_a_garbage_checkpoint_and_a_symlink_loop_are_one_line_errors(tmp_path):
    (tmp_path / "g.pth").write_bytes(bytes(range(256)) * 4)
    option = Path(__file__).resolve().parents[1] / "options/train/NaLaSR/train_NaLaSR_light_x4_mini.yml"
    src = image(tmp_path / "in.png")
    proc = run(
        "nala_gen.sr.cli", "upscale", str(src), "-m", str(tmp_path / "g.pth"), "--opt", str(option), cwd=tmp_path
    )
    one_line_error(proc, "not a readable PyTorch checkpoint")
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    from nala_gen.sr.upscale.imageio import ImageError, read_image

    with pytest.raises(ImageError, match="cannot read"):
        read_image(tmp_path / "loop.png")
