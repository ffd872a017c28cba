"""The standard test sets: ``nala-sr prepare benchmarks``, bad data refused whole, BasicSR's test and the benchmark
commands on them. A made folder always; the real Set5 from ``../shared/datasets`` when it is there."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from nala_gen.sr.cli import main as nala_sr

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "datasets"
needs_shared = pytest.mark.skipif(
    not (SHARED / "benchmark" / "Set5").is_dir(),
    reason=f"{SHARED} is not here (a user's fresh clone): the real test sets are read from there",
)


def picture(size: tuple[int, int], seed: int) -> np.ndarray:
    """A smooth (h, w, 3) picture, so that super-resolution has something to restore."""
    h, w = size
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    rng = np.random.default_rng(seed)
    channels = [np.sin(2 * np.pi * (rng.uniform(1, 4) * x + rng.uniform(1, 4) * y)) for _ in range(3)]
    return (127.5 + 120 * np.stack(channels, axis=-1)).astype(np.uint8)


def made_sets(root: Path, sums: bool = True) -> Path:
    """``root/bench/Set5`` (two pictures) and ``root/bench/bsds100/HR`` (one), with a SHA256SUMS in ``root``."""
    bench = root / "bench"
    files = {
        bench / "Set5" / "a.png": (60, 84),
        bench / "Set5" / "b.png": (50, 50),
        bench / "bsds100" / "HR" / "c.png": (48, 72),
    }
    for i, (path, size) in enumerate(files.items()):
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(picture(size, i)).save(path)
    if sums:
        lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root)}" for p in files]
        (root / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return bench


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_prepare_benchmarks_makes_every_set_in_basicsr_layout(tmp_path, capsys):
    bench = made_sets(tmp_path)
    out = tmp_path / "datasets"
    assert nala_sr(["prepare", "benchmarks", str(bench), str(out)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "Set5 (2), B100 (1)" in said[0] and "3 files checked against" in said[0], said
    assert sorted(p.name for p in out.iterdir()) == ["B100", "Set5"]  # bsds100 -> B100, nothing hidden left over
    for name, stems in {"Set5": ("a", "b"), "B100": ("c",)}.items():
        assert sorted(p.name for p in (out / name).iterdir()) == ["GTmod12", "LRbicx2", "LRbicx3", "LRbicx4"]
        for stem in stems:
            gt = Image.open(out / name / "GTmod12" / f"{stem}.png")
            assert gt.width % 12 == 0 and gt.height % 12 == 0
            for s in (2, 3, 4):
                assert Image.open(out / name / f"LRbicx{s}" / f"{stem}.png").size == (gt.width // s, gt.height // s)


def test_prepare_benchmarks_refuses_a_changed_file_and_keeps_the_earlier_sets(tmp_path, capsys):
    bench = made_sets(tmp_path)
    out = tmp_path / "datasets"
    assert nala_sr(["prepare", "benchmarks", str(bench), str(out)]) == 0
    before = tree(out)
    changed = bench / "bsds100" / "HR" / "c.png"
    Image.fromarray(picture((48, 72), 9)).save(changed)  # still an image, but not the listed one
    capsys.readouterr()
    assert nala_sr(["prepare", "benchmarks", str(bench), str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(changed) in err[0] and "SHA256" in err[0], err
    assert tree(out) == before  # not one file rewritten, none added
    assert nala_sr(["prepare", "benchmarks", str(bench), str(tmp_path / "new")]) == 1
    assert not (tmp_path / "new").exists()


def test_prepare_benchmarks_refuses_a_corrupt_file_and_a_missing_listed_one(tmp_path, capsys):
    bench = made_sets(tmp_path, sums=False)
    (bench / "Set5" / "b.png").write_bytes((bench / "Set5" / "b.png").read_bytes()[:200])  # truncated
    assert nala_sr(["prepare", "benchmarks", str(bench), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "b.png is not a readable image" in err[0], err
    assert not (tmp_path / "out").exists()

    bench = made_sets(tmp_path / "second")
    (bench / "Set5" / "a.png").unlink()
    assert nala_sr(["prepare", "benchmarks", str(bench), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a.png is listed in" in err[0] and "but missing" in err[0], err
    assert not (tmp_path / "out").exists()


def test_prepare_benchmark_checks_every_image_before_writing_any(tmp_path, capsys):
    """A corrupt second image used to leave the first image's GT and LR behind; a 5x5 one said 'cannot write empty
    image'."""
    hr = tmp_path / "hr"
    hr.mkdir()
    Image.fromarray(picture((48, 60), 0)).save(hr / "a.png")
    (hr / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n not a picture")
    assert nala_sr(["prepare", "benchmark", str(hr), str(tmp_path / "Set")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "b.png is not a readable image" in err[0], err
    assert not (tmp_path / "Set").exists()

    Image.fromarray(picture((5, 5), 1)).save(hr / "b.png")
    assert nala_sr(["prepare", "benchmark", str(hr), str(tmp_path / "Set")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "b.png is 5x5, smaller than the 12-pixel crop" in err[0], err
    assert not (tmp_path / "Set").exists()


def test_prepare_benchmark_never_replaces_a_folder_of_other_files(tmp_path, capsys):
    hr = tmp_path / "hr"
    hr.mkdir()
    Image.fromarray(picture((48, 60), 0)).save(hr / "a.png")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert nala_sr(["prepare", "benchmark", str(hr), str(mine)]) == 1
    assert "holds 'notes.txt'" in capsys.readouterr().err
    assert tree(mine) == {"notes.txt": b"keep me"}


def evaluate_cli(*args: str) -> list[str]:
    """``nala-sr evaluate ARGS`` in a fresh process: exit 1 and its stderr lines."""
    proc = subprocess.run([sys.executable, "-m", "nala_gen.sr.cli", "evaluate", *args], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    return proc.stderr.strip().splitlines()


def test_evaluate_names_only_super_resolution_weights_for_an_unknown_model(tmp_path):
    sets = made_benchmark(tmp_path)
    err = evaluate_cli("--data", str(sets / "Set5"), "--models", "nosuchmodel")
    assert len(err) == 1 and "unknown super-resolution weights 'nosuchmodel'" in err[0], err
    assert "nalasr-light-x4" in err[0] and "naladit" not in err[0] and "nalasit" not in err[0]


def test_evaluate_says_how_to_make_a_missing_set(tmp_path):
    err = evaluate_cli("--data", str(tmp_path / "Set5"), "--models", "bicubic")
    assert len(err) == 1 and f"{tmp_path / 'Set5' / 'GTmod12'} not found" in err[0], err
    assert "nala-sr prepare benchmarks SRC" in err[0]


def test_basicsr_test_says_which_set_is_missing_and_how_to_make_it(tmp_path):
    option = ROOT / "options" / "test" / "NaLaSR" / "test_NaLaSR_light_x4.yml"
    proc = subprocess.run(
        [sys.executable, "-m", "nala_gen.sr.test", "-opt", str(option)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "datasets/Set5/GTmod12 not found" in err[0], err
    assert "nala-sr prepare benchmarks" in err[0]
    assert not (tmp_path / "results").exists()


def test_the_test_options_list_the_four_standard_sets():
    for option in sorted((ROOT / "options" / "test").glob("*/test_*_x[234].yml")):
        opt = yaml.safe_load(option.read_text())
        scale = opt["scale"]
        sets = [(d["name"], d["dataroot_gt"], d["dataroot_lq"]) for d in opt["datasets"].values()]
        assert sets == [
            (name, f"datasets/{name}/GTmod12", f"datasets/{name}/LRbicx{scale}")
            for name in ("Set5", "Set14", "B100", "Urban100")
        ], option.name


def basicsr_test_on(sets: Path, names: list[str], tmp_path: Path) -> dict[str, float]:
    """BasicSR's own test of the shipped x4 NaLaSR (the shipped option file, on ``names`` under ``sets``) -> its
    logged PSNR per set."""
    opt = yaml.safe_load((ROOT / "options" / "test" / "NaLaSR" / "test_NaLaSR_light_x4.yml").read_text())
    opt["datasets"] = {
        f"test_{i}": {
            **d,
            "dataroot_gt": str(sets / d["name"] / "GTmod12"),
            "dataroot_lq": str(sets / d["name"] / "LRbicx4"),
        }
        for i, d in enumerate((d for d in opt["datasets"].values() if d["name"] in names), start=1)
    }
    opt["path"]["pretrain_network_g"] = str(ROOT / opt["path"]["pretrain_network_g"].split()[0])
    opt["val"]["save_img"] = False
    option = tmp_path / "test.yml"
    option.write_text(yaml.safe_dump(opt))
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "nala_gen.sr.test", "-opt", str(option)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = next((tmp_path / "results" / opt["name"]).glob("*.log")).read_text()
    psnr = {}
    for line in log.splitlines():
        if "Validation" in line:
            current = line.split("Validation")[1].split(",")[0].strip()
        if "# psnr:" in line:
            psnr[current] = float(line.split("# psnr:")[1].split()[0])
    return psnr


def test_basicsr_test_and_evaluate_agree_on_a_made_set(tmp_path):
    from nala_gen.sr.evaluate import evaluate

    made_sets(tmp_path)
    sets = tmp_path / "datasets"
    assert nala_sr(["prepare", "benchmarks", str(tmp_path / "bench"), str(sets)]) == 0
    ours = evaluate(sets / "Set5", 4, ["bicubic", "nalasr-light-x4"])
    logged = basicsr_test_on(sets, ["Set5", "B100"], tmp_path)
    assert set(logged) == {"Set5", "B100"}
    assert logged["Set5"] == pytest.approx(ours["nalasr-light-x4"]["psnr"], abs=0.01)
    assert ours["nalasr-light-x4"]["images"] == 2 and ours["nalasr-light-x4"]["tiled_images"] == 0


@needs_shared
def test_the_real_set5_prepared_and_evaluated(tmp_path, capsys):
    from nala_gen.sr.evaluate import evaluate

    sets = tmp_path / "datasets"
    assert nala_sr(["prepare", "benchmarks", str(SHARED / "benchmark"), str(sets), "--sets", "Set5"]) == 0
    assert "Set5 (5)" in capsys.readouterr().out and sorted(p.name for p in sets.iterdir()) == ["Set5"]
    scores = evaluate(sets / "Set5", 4, ["bicubic", "nalasr-light-x4"])
    # MATLAB-bicubic x4 on Set5, Y channel, crop 4: 28.42 dB in the field's tables (e.g. EDSR's, SwinIR's), so the
    # layout, the bicubic and the metric are the field's
    assert scores["bicubic"]["psnr"] == pytest.approx(28.42, abs=0.05)
    assert scores["nalasr-light-x4"]["psnr"] > scores["bicubic"]["psnr"] + 1.5
    assert basicsr_test_on(sets, ["Set5"], tmp_path)["Set5"] == pytest.approx(
        scores["nalasr-light-x4"]["psnr"], abs=0.01
    )


def made_benchmark(tmp_path: Path) -> Path:
    made_sets(tmp_path)
    sets = tmp_path / "datasets"
    assert nala_sr(["prepare", "benchmarks", str(tmp_path / "bench"), str(sets)]) == 0
    return sets


def test_sr_sets_writes_ours_and_the_published_rows(tmp_path):
    from nala_gen.bench.sr_sets import PUBLISHED, quality_main

    sets = made_benchmark(tmp_path)
    args = ["--data", str(sets), "--sets", "Set5", "B100", "--scales", "4", "--models", "bicubic", "nalasr-light-x4"]
    assert quality_main([*args, "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "sr_sets.json").read_text())
    assert result["machine"]["cpu"] and result["published"] == json.loads(json.dumps(PUBLISHED))
    for name in ("Set5", "B100"):
        row = result["scales"]["x4"][name]
        assert set(row) == {"bicubic", "nalasr-light-x4"}
        assert 10 < row["bicubic"]["psnr"] < 60 and 0 < row["bicubic"]["ssim"] <= 1
    assert result["scales"]["x4"]["Set5"]["bicubic"]["images"] == 2


def test_sr_sets_update_scores_only_the_named_weights_and_keeps_the_rest(tmp_path):
    from nala_gen.bench.sr_sets import quality_caption, quality_main

    sets = made_benchmark(tmp_path)
    common = ["--data", str(sets), "--sets", "Set5", "B100", "--scales", "4", "--out", str(tmp_path / "out")]
    assert quality_main([*common, "--models", "bicubic", "nalasr-light-x4"]) == 0
    path = tmp_path / "out" / "sr_sets.json"
    first = json.loads(path.read_text())
    before = first["scales"]["x4"]["Set5"]["bicubic"]
    # a stand-in for "the bicubic row was scored long ago": --update must keep it as it is
    first["scales"]["x4"]["Set5"]["bicubic"] = {**before, "psnr": 1.0}
    first["run"] = "2026-01-01 00:00 UTC"
    del first["scored"]  # as a file written before --update: each row then counts as scored in the file's run
    path.write_text(json.dumps(first))
    assert quality_main([*common, "--models", "nalasr-light-x4", "--update"]) == 0
    updated = json.loads(path.read_text())
    assert updated["scales"]["x4"]["Set5"]["bicubic"]["psnr"] == 1.0  # kept, not rescored
    assert updated["scales"]["x4"]["Set5"]["nalasr-light-x4"] == first["scales"]["x4"]["Set5"]["nalasr-light-x4"]
    assert (
        updated["scored"]["bicubic"] == "2026-01-01 00:00 UTC"
        and updated["scored"]["nalasr-light-x4"] == updated["run"]
    )
    assert "`bicubic` 2026-01-01 00:00 UTC" in quality_caption(updated, "x4")
    with pytest.raises(SystemExit):  # --update without --models: nothing to score, refused
        quality_main([*common, "--update"])


def test_sr_sets_says_which_set_is_missing(tmp_path):
    from nala_gen.bench.sr_sets import quality_main

    with pytest.raises(FileNotFoundError, match=r"Urban100/GTmod12 not found: make it with nala-sr prepare benchmarks"):
        quality_main(["--data", str(tmp_path), "--sets", "Urban100", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_sr_sets_cost_times_each_image_whole_in_fresh_processes(tmp_path):
    from nala_gen.bench.sr_sets import PAPER_TABLE20, cost_main

    sets = made_benchmark(tmp_path)
    args = ["--data", str(sets), "--sets", "Set5", "B100", "--subset", "Set5:1", "--out", str(tmp_path / "out")]
    assert cost_main(args) == 0
    result = json.loads((tmp_path / "out" / "sr_sets_cost.json").read_text())
    assert result["paper"] == json.loads(json.dumps(PAPER_TABLE20)) and result["machine"]["cpu"]
    for name, count in (("Set5", 1), ("B100", 1)):
        for model in ("esrt", "nalasr"):
            row = result["sets"][name][model]
            assert row["images"] == row["ran"] == count == len(row["per_image"])
            assert row["mean_latency_s"] > 0 and row["peak_bytes"] >= 0
            assert row["largest_ran"]["image"] in {r["image"] for r in row["per_image"]}
    # the subset is spread over the set and the same for both networks
    assert result["sets"]["Set5"]["esrt"]["per_image"][0]["image"] == "a"
    assert [r["lr"] for r in result["sets"]["B100"]["nalasr"]["per_image"]] == [[18, 12]]


def test_subset_spreads_evenly():
    from nala_gen.bench.sr_sets import _subset

    paths = [Path(f"{i:03d}") for i in range(100)]
    assert _subset(paths, None) == paths and _subset(paths, 200) == paths
    assert [p.name for p in _subset(paths, 3)] == ["000", "050", "099"] and _subset(paths, 1) == paths[:1]


def test_learning_curve_reads_validations_across_resumed_logs(tmp_path):
    """scripts/learning_curve.py: each set's PSNR at the iteration logged before its validation, later logs winning
    for a repeated iteration (a resume), samples = iterations x batch, the starting weights at zero samples, and a
    projection only for a rising curve."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("learning_curve", ROOT / "scripts" / "learning_curve.py")
    curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curve)
    run = tmp_path / "experiments" / "NaLaSR_x4"
    run.mkdir(parents=True)
    opt = {"scale": 4, "datasets": {"train": {"batch_size_per_gpu": 4, "gt_size": 192}}}
    (run / "train_NaLaSR_x4.yml").write_text(yaml.safe_dump(opt))

    def log(name: str, entries: list[tuple[int, float, float]]) -> None:
        lines = []
        for iteration, set5, urban in entries:
            lines.append(f"2026-12-07 17:11:22,346 INFO: [NaLaS..][epoch:  0, iter:{iteration:8,d}, lr:(2.000e-04,)] ")
            for name_, psnr in (("Set5", set5), ("Urban100", urban)):
                lines += [
                    f"2026-12-07 17:11:30,000 INFO: Validation {name_}",
                    f"\t # psnr: {psnr:.4f}\tBest: 1 @ 2 iter",
                ]
        (run / name).write_text("\n".join(lines) + "\n")

    log("train_NaLaSR_x4_20261207_170000.log", [(2500, 30.9, 24.6), (5000, 31.0, 24.7)])
    log("train_NaLaSR_x4_20261207_190000.log", [(5000, 31.05, 24.72), (7500, 31.1, 24.75)])  # resumed at 4,500
    assert curve.read_curve(run) == {
        "Set5": {2500: 30.9, 5000: 31.05, 7500: 31.1},
        "Urban100": {2500: 24.6, 5000: 24.72, 7500: 24.75},
    }
    out = tmp_path / "curve"
    args = [str(run), "--target", "Set5=31.8", "--target", "Urban100=20", "--out", str(out)]
    assert curve.main([*args, "--start", "nalasr-light-x4"]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    set5 = result["series"]["Set5"]
    assert [p["samples"] for p in set5] == [0, 10_000, 20_000, 30_000] and set5[-1]["psnr"] == 31.1
    shipped = json.loads((ROOT / "benchmarks" / "results" / "sr_sets.json").read_text())["scales"]["x4"]
    assert set5[0]["psnr"] == shipped["Set5"]["nalasr-light-x4"]["psnr"]
    assert result["projected_samples"]["Set5"] > 30_000  # rising, target above: beyond what was seen
    assert out.with_suffix(".png").is_file()
    assert curve.projection([(1, 2.0), (2, 1.0)], 3.0) is None and curve.projection([(5, 1.0)], 2.0) is None
