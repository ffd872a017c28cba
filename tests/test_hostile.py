"""The hostile-input corpus: each case a bad but plausible command, asserting its exit code, a one-line message
and which files exist afterwards. Inputs are made on the fly (tiny files)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def run(*args: str, cwd: Path, prefix: tuple = (), preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, sys.executable, "-m", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec_fn,
    )


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
    one_line_error(proc, "no images in", "empty")
    assert not (tmp_path / "out").exists()
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
        ("json_folder", "out.json: is a folder, not a file"),
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

    with pytest.raises(ImageError, match="loop.png: is a symlink loop"):
        read_image(tmp_path / "loop.png")


# ------------------------------------------------------------------------------------------------------ bad paths
# Every path problem, in every command that takes paths, ends in the one line the commands print for any other
# error, PROG: error: PATH: PROBLEM, naming the part of the path at fault, with exit 1 and nothing written,
# moved or lost. Before: a symlink loop given as input or output printed `RuntimeError: Symlink loop from ...`
# under a traceback; others printed an errno (`[Errno 13] Permission denied: 'out/.in_x4.png.k2x8.part'`, the
# temporary file's name), or were not caught at all (an output that is a symlink loop or a dangling link was
# replaced by the sample; a results file that is one was replaced after the whole evaluation).
SR, GEN = "nala_gen.sr.cli", "nala_gen.diffusion.cli"
PROG = {SR: "nala-sr", GEN: "nala-gen"}
LOOP = "is a symlink loop (it leads back to itself)"
NOT_A_FOLDER, NOT_A_FILE = "is a file, not a folder", "is a folder, not a file"
UNREADABLE, UNWRITABLE = "cannot be read (permission denied)", "folder is not writable (permission denied)"
READ_ONLY_FS = "is on a read-only file system"


def dangling(target: str) -> str:
    return f"is a dangling symlink (to {target}, which does not exist)"


def loop(path: Path) -> Path:
    path.symlink_to(path.name)
    return path


def dangling_link(path: Path) -> Path:
    path.symlink_to(f"missing{path.suffix}")
    return path


def instead(path: Path, make) -> Path:
    """``make(path)`` in place of the file at ``path``."""
    path.unlink()
    return make(path)


def folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def plain_file(path: Path) -> Path:
    path.write_text("a file, not a folder")
    return path


def upscale(src: Path, *extra: str) -> list[str]:
    return ["upscale", str(src), *extra, "-q"]


def evaluate(data: Path, *extra: str) -> list[str]:
    return ["evaluate", "--data", str(data), "--scale", "4", "--models", "bicubic", *extra]


def sample(*extra: str, model: str = "naladit-digits") -> list[str]:
    return ["sample", "-m", model, "--steps", "1", "--class", "0", "-q", *extra]


def benchmark(root: Path) -> Path:
    """A two-image benchmark-layout folder for ``evaluate``."""
    for name in ("a.png", "b.png"):
        image(root / "GTmod12" / name, size=(24, 24))
        image(root / "LRbicx4" / name, size=(6, 6))
    return root


def hr_folder(root: Path) -> Path:
    """HR images for ``prepare benchmark``: a good one first, so a late failure would leave its outputs."""
    image(root / "a.png", size=(24, 24))
    return root


def pipeline_copy(root: Path) -> Path:
    """The shipped digits pipeline as a folder of its own (the large parts linked, the small files copied)."""
    import shutil

    from nala_gen.weights import resolve

    shipped = resolve("naladit-digits").payload
    root.mkdir()
    for part in shipped.iterdir():
        if part.is_dir():
            (root / part.name).symlink_to(part)
        else:
            shutil.copy(part, root / part.name)
    return root


def tree(root: Path) -> dict:
    """Every path under ``root`` and what it is (a link's target; a file's or folder's type, size and mtime): equal
    before and after a command means it wrote, moved and removed nothing, temporary files included."""
    import os

    entries = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            entries[str(path.relative_to(root))] = (
                os.readlink(path) if path.is_symlink() else (st.st_mode, st.st_size, st.st_mtime_ns)
            )
    return entries


def path_error(proc: subprocess.CompletedProcess, expected: str) -> None:
    """Exit 1 and exactly ``expected`` on stderr: one line, no traceback, no exception class, no errno."""
    import re

    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [expected], proc.stderr[-2000:]
    assert not re.search(r"Traceback|[A-Z]\w*Error\b|\[Errno", proc.stderr)


# case id -> setup(d) -> (module, argv, the path at fault, its problem)
PATH_CASES = {
    # a symlink loop given as input or output
    "loop-upscale-input": lambda d: (SR, upscale(src := loop(d / "loop.png"), "-o", str(d / "out")), src, LOOP),
    "loop-upscale-input-folder": lambda d: (SR, upscale(src := loop(d / "photos")), src, LOOP),
    "loop-upscale-output-folder": lambda d: (SR, upscale(image(d / "in.png"), "-o", str(o := loop(d / "o"))), o, LOOP),
    "loop-upscale-output-file": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(o := loop(d / "o.png"))),
        o,
        LOOP,
    ),
    "loop-upscale-model": lambda d: (SR, upscale(image(d / "in.png"), "-m", str(m := loop(d / "m.json"))), m, LOOP),
    "loop-evaluate-data": lambda d: (SR, evaluate(data := loop(d / "val")), data, LOOP),
    "loop-evaluate-gt-image": lambda d: (
        SR,
        evaluate(benchmark(d / "val")),
        instead(d / "val" / "GTmod12" / "b.png", loop),
        LOOP,
    ),
    "loop-evaluate-json": lambda d: (
        SR,
        evaluate(benchmark(d / "val"), "--json", str(j := loop(d / "r.json"))),
        j,
        LOOP,
    ),
    "loop-prepare-hr": lambda d: (SR, ["prepare", "benchmark", str(hr := loop(d / "hr")), str(d / "out")], hr, LOOP),
    "loop-prepare-hr-image": lambda d: (
        SR,
        ["prepare", "benchmark", str(hr_folder(d / "hr")), str(d / "out")],
        loop(d / "hr" / "b.png"),
        LOOP,
    ),
    "loop-prepare-out": lambda d: (SR, ["prepare", "mini", str(o := loop(d / "mini")), "--limit", "1"], o, LOOP),
    "loop-sample-model": lambda d: (GEN, sample("-o", str(d / "s.png"), model=str(m := loop(d / "pipe"))), m, LOOP),
    "loop-sample-output": lambda d: (GEN, sample("-o", str(o := loop(d / "s.png"))), o, LOOP),
    "loop-sample-output-folder": lambda d: (GEN, sample("-o", str(loop(d / "f") / "s.png")), d / "f", LOOP),
    # a dangling symlink
    "dangling-upscale-input": lambda d: (
        SR,
        upscale(src := dangling_link(d / "in.png"), "-o", str(d / "out")),
        src,
        dangling("missing.png"),
    ),
    "dangling-upscale-output-file": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(o := dangling_link(d / "o.png"))),
        o,
        dangling("missing.png"),
    ),
    "dangling-upscale-output-folder": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(o := dangling_link(d / "out"))),
        o,
        dangling("missing"),
    ),
    "dangling-evaluate-lr-image": lambda d: (
        SR,
        evaluate(benchmark(d / "val")),
        instead(d / "val" / "LRbicx4" / "b.png", dangling_link),
        dangling("missing.png"),
    ),
    "dangling-prepare-hr": lambda d: (
        SR,
        ["prepare", "benchmark", str(hr := dangling_link(d / "hr")), str(d / "out")],
        hr,
        dangling("missing"),
    ),
    "dangling-prepare-out": lambda d: (
        SR,
        ["prepare", "benchmark", str(hr_folder(d / "hr")), str(o := dangling_link(d / "out"))],
        o,
        dangling("missing"),
    ),
    "dangling-sample-model": lambda d: (
        GEN,
        sample("-o", str(d / "s.png"), model=str(m := dangling_link(d / "pipe"))),
        m,
        dangling("missing"),
    ),
    "dangling-sample-output": lambda d: (
        GEN,
        sample("-o", str(o := dangling_link(d / "s.png"))),
        o,
        dangling("missing.png"),
    ),
    # a file where a folder is expected
    "file-upscale-output-folder": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(o := plain_file(d / "out"))),
        o,
        NOT_A_FOLDER,
    ),
    "file-upscale-output-parent": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(plain_file(d / "out") / "o.png")),
        d / "out",
        NOT_A_FOLDER,
    ),
    "file-evaluate-data": lambda d: (SR, evaluate(data := plain_file(d / "val")), data, NOT_A_FOLDER),
    "file-evaluate-json-parent": lambda d: (
        SR,
        evaluate(benchmark(d / "val"), "--json", str(plain_file(d / "f") / "r.json")),
        d / "f",
        NOT_A_FOLDER,
    ),
    "file-prepare-hr": lambda d: (
        SR,
        ["prepare", "benchmark", str(hr := plain_file(d / "hr")), str(d / "out")],
        hr,
        NOT_A_FOLDER,
    ),
    "file-prepare-out": lambda d: (
        SR,
        ["prepare", "mini", str(o := plain_file(d / "mini")), "--limit", "1"],
        o,
        NOT_A_FOLDER,
    ),
    "file-sample-output-parent": lambda d: (
        GEN,
        sample("-o", str(plain_file(d / "f") / "s.png")),
        d / "f",
        NOT_A_FOLDER,
    ),
    # a folder where a file is expected
    "folder-upscale-output-file": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(o := folder(d / "o.png"))),
        o,
        NOT_A_FILE,
    ),
    "folder-upscale-opt": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-m", str(plain_file(d / "g.pth")), "--opt", str(o := folder(d / "o.yml"))),
        o,
        NOT_A_FILE,
    ),
    "folder-evaluate-gt-image": lambda d: (
        SR,
        evaluate(benchmark(d / "val")),
        instead(d / "val" / "GTmod12" / "b.png", folder),
        NOT_A_FILE,
    ),
    "folder-prepare-hr-image": lambda d: (
        SR,
        ["prepare", "benchmark", str(hr_folder(d / "hr")), str(d / "out")],
        folder(d / "hr" / "b.png"),
        NOT_A_FILE,
    ),
    "folder-sample-output": lambda d: (GEN, sample("-o", str(o := folder(d / "s.png"))), o, NOT_A_FILE),
}


@pytest.mark.parametrize("case", list(PATH_CASES))
def test_a_bad_path_is_one_line_and_leaves_everything_as_it_was(tmp_path, case):
    module, argv, culprit, problem = PATH_CASES[case](tmp_path)
    before = tree(tmp_path)
    proc = run(module, *argv, cwd=tmp_path)
    path_error(proc, f"{PROG[module]} {argv[0]}: error: {culprit}: {problem}")
    assert tree(tmp_path) == before


def _drop_mode_override() -> None:
    """A ``preexec_fn``: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set, so the command root
    execs holds neither and obeys file modes as any user does (as root in a container without them)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0):  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.fixture(scope="module")
def obeying_modes(tmp_path_factory):
    """The ``preexec_fn`` under which a command is refused by chmod 000 / 555: None for a user; for root, who
    reads and writes through any mode, :func:`_drop_mode_override`. Skipped, saying why, where neither works."""
    probe = tmp_path_factory.mktemp("modes")
    (probe / "secret").write_text("x")
    (probe / "secret").chmod(0)
    (probe / "shut").mkdir(mode=0o555)
    check = "import sys\ntry:\n open(sys.argv[1])\nexcept PermissionError:\n sys.exit(0)\nsys.exit(1)"
    try:
        for attempt, preexec in enumerate((None, _drop_mode_override)):
            try:
                results = [
                    subprocess.run([sys.executable, "-c", check, str(probe / "secret")], preexec_fn=preexec),
                    subprocess.run(
                        [sys.executable, "-c", check.replace("open(sys.argv[1])", "open(sys.argv[1], 'w')"),
                         str(probe / "shut" / f"new{attempt}")],
                        preexec_fn=preexec,
                    ),
                ]  # fmt: skip
            except subprocess.SubprocessError:  # the capabilities cannot be dropped here
                continue
            if all(r.returncode == 0 for r in results):
                return preexec
    finally:
        (probe / "shut").chmod(0o755)
    pytest.skip("chmod does not deny reads or writes here (root) and root's capabilities cannot be dropped")


def unreadable(path: Path) -> Path:
    path.chmod(0)
    return path


def read_only(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    path.chmod(0o555)
    return path


# case id -> setup(d) -> (module, argv, the path at fault, its problem); run so that file modes are obeyed
PERMISSION_CASES = {
    "unreadable-upscale-input": lambda d: (
        SR,
        upscale(src := unreadable(image(d / "in.png")), "-o", str(d / "o")),
        src,
        f"file {UNREADABLE}",
    ),
    "unreadable-upscale-input-folder": lambda d: (
        SR,
        upscale((image(d / "photos" / "a.png"), unreadable(d / "photos"))[1], "-o", str(d / "o")),
        d / "photos",
        f"folder {UNREADABLE}",
    ),
    "unreadable-evaluate-gt-image": lambda d: (
        SR,
        evaluate(benchmark(d / "val")),
        unreadable(d / "val" / "GTmod12" / "b.png"),
        f"file {UNREADABLE}",
    ),
    "unreadable-evaluate-json": lambda d: (  # the results already there are read, then kept: refused before work
        SR,
        evaluate(benchmark(d / "val"), "--json", str(j := d / "r.json")),
        (j.write_text('{"x2": {}}'), unreadable(j))[1],
        f"file {UNREADABLE}",
    ),
    "unreadable-prepare-hr-image": lambda d: (
        SR,
        ["prepare", "benchmark", str(hr_folder(d / "hr")), str(d / "out")],
        unreadable(image(d / "hr" / "b.png")),
        f"file {UNREADABLE}",
    ),
    "unreadable-sample-model": lambda d: (
        GEN,
        sample("-o", str(d / "s.png"), model=str(pipeline_copy(d / "pipe"))),
        unreadable(d / "pipe" / "model_index.json"),
        f"file {UNREADABLE}",
    ),
    "unwritable-upscale-output-folder": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(read_only(d / "o"))),
        d / "o",
        UNWRITABLE,
    ),
    "unwritable-upscale-output-file": lambda d: (
        SR,
        upscale(image(d / "in.png"), "-o", str(read_only(d / "o") / "x.png")),
        d / "o",
        UNWRITABLE,
    ),
    "unwritable-upscale-beside-input": lambda d: (  # no -o: the output goes beside its input, reported per image
        SR,
        upscale((image(d / "in" / "a.png"), read_only(d / "in"))[0]),
        d / "in",
        UNWRITABLE,
    ),
    "unwritable-evaluate-json": lambda d: (
        SR,
        evaluate(benchmark(d / "val"), "--json", str(read_only(d / "o") / "r.json")),
        d / "o",
        UNWRITABLE,
    ),
    "unwritable-prepare-out": lambda d: (
        SR,
        ["prepare", "mini", str(read_only(d / "o") / "mini"), "--limit", "1"],
        d / "o",
        UNWRITABLE,
    ),
    "unwritable-sample-output": lambda d: (GEN, sample("-o", str(read_only(d / "o") / "s.png")), d / "o", UNWRITABLE),
}


@pytest.mark.parametrize("case", list(PERMISSION_CASES))
def test_no_permission_is_one_line_and_leaves_everything_as_it_was(tmp_path, case, obeying_modes):
    import os

    module, argv, culprit, problem = PERMISSION_CASES[case](tmp_path)
    before = tree(tmp_path)
    try:
        proc = run(module, *argv, cwd=tmp_path, preexec_fn=obeying_modes)
        after = tree(tmp_path)
    finally:
        for top, dirs, _ in os.walk(tmp_path):  # open again, so that pytest can remove the folder
            for name in dirs:
                Path(top, name).chmod(0o755)
    expected = f"{PROG[module]} {argv[0]}: error: {culprit}: {problem}"
    if case == "unwritable-upscale-beside-input":
        expected = f"nala-sr upscale: error: {argv[1]}: {culprit}: {problem}"
    path_error(proc, expected)
    assert after == before


@pytest.fixture(scope="module")
def read_only_mount(tmp_path_factory):
    """``prefix(folder)``: the command line that runs a command with an empty read-only file system mounted on
    ``folder``, in a mount namespace of its own (``unshare``; nothing is mounted for anyone else). Skipped, saying
    why, where no namespace can be made."""

    def prefix(folder: Path) -> tuple:
        return (
            "unshare",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            'mount -t tmpfs -o ro tmpfs "$0" && exec "$@"',
            folder,
        )

    probe = tmp_path_factory.mktemp("rofs")
    check = "import os, sys; sys.exit(0 if os.statvfs(sys.argv[1]).f_flag & os.ST_RDONLY else 1)"
    try:
        done = subprocess.run([*prefix(probe), sys.executable, "-c", check, probe], capture_output=True, text=True)
    except OSError as err:
        pytest.skip(f"no read-only mount here: {err}")
    if done.returncode != 0:
        pytest.skip(f"no read-only mount here: {done.stderr.strip() or 'unshare failed'}")
    return prefix


@pytest.mark.parametrize(
    "command",
    [
        lambda d, ro: (SR, upscale(image(d / "in.png"), "-o", str(ro / "out"))),
        lambda d, ro: (SR, upscale(image(d / "in.png"), "-o", str(ro / "out.png"))),
        lambda d, ro: (SR, evaluate(benchmark(d / "val"), "--json", str(ro / "r.json"))),
        lambda d, ro: (SR, ["prepare", "benchmark", str(hr_folder(d / "hr")), str(ro / "set")]),
        lambda d, ro: (GEN, sample("-o", str(ro / "s.png"))),
    ],
    ids=["upscale-folder", "upscale-file", "evaluate-json", "prepare-out", "sample-output"],
)
def test_a_read_only_file_system_is_one_line_and_nothing_is_written(tmp_path, command, read_only_mount):
    ro = folder(tmp_path / "ro")
    module, argv = command(tmp_path, ro)
    before = tree(tmp_path)
    proc = run(module, *argv, cwd=tmp_path, prefix=read_only_mount(ro))
    path_error(proc, f"{PROG[module]} {argv[0]}: error: {ro}: {READ_ONLY_FS}")
    assert tree(tmp_path) == before
