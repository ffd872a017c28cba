"""Resumable batch upscaling: --skip-existing and the JSON-lines manifest, across a SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from nala_gen.sr.jobs import MANIFEST_NAME, JobManifest
from nala_gen.sr.loading import build_arch
from nala_gen.sr.upscale.imageio import read_image, write_image_atomic
from nala_gen.weights import write_weights

TINY = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}


@pytest.fixture()
def job(tmp_path):
    torch.manual_seed(0)
    write_weights(build_arch("NaLaSR", TINY).state_dict(), tmp_path / "w", "tiny-x4", "sr", "NaLaSR", TINY, {})
    rng = np.random.default_rng(0)
    src = tmp_path / "in"
    for i in range(8):
        write_image_atomic(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8), src / f"img{i}.png")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "nala_gen.sr.cli", "upscale", str(src), "-o", str(out), "--tile", "0"]
    cmd += ["-m", str(tmp_path / "w" / "tiny-x4.json"), "--skip-existing", "--json", "-q"]
    return {"cmd": cmd, "src": src, "out": out}


def records(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("io_threads", ["0", "1"])  # one step after another; decode ahead and encode behind
def test_a_killed_job_finishes_on_the_same_command_redoing_only_what_was_in_flight(job, io_threads):
    job["cmd"] += ["--io-threads", io_threads]
    proc = subprocess.Popen(job["cmd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = job["out"] / MANIFEST_NAME
    deadline = time.time() + 120
    while time.time() < deadline and (not manifest.is_file() or len(manifest.read_text().splitlines()) < 3):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = set(JobManifest(manifest).records)
    assert 3 <= len(finished) < 8, "the job was not stopped part-way"
    rerun = subprocess.run(job["cmd"], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    by_status = {}
    for r in records(rerun.stdout):
        by_status.setdefault(r["status"], set()).add(r["output"])
    assert by_status["skipped"] >= finished  # nothing recorded as done is done again
    assert len(by_status.get("ok", ())) <= 8 - len(finished)  # only what was left, the one in flight included
    outputs = sorted(p.name for p in job["out"].iterdir())
    assert outputs == sorted([MANIFEST_NAME, *(f"img{i}_x4.png" for i in range(8))])  # no partial or temp files
    for i in range(8):
        assert read_image(job["out"] / f"img{i}_x4.png").shape == (160, 192, 3)


def test_a_changed_option_or_input_is_redone_and_said(job):
    first = subprocess.run(job["cmd"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and {r["status"] for r in records(first.stdout)} == {"ok"}
    same = subprocess.run(job["cmd"], capture_output=True, text=True, timeout=300)
    assert {r["status"] for r in records(same.stdout)} == {"skipped"}
    write_image_atomic(np.zeros((40, 48, 3), np.uint8), job["src"] / "img3.png")  # new bytes for one input
    changed = subprocess.run([*job["cmd"], "--tile-pad", "8"], capture_output=True, text=True, timeout=300)
    assert {r["status"] for r in records(changed.stdout)} == {"ok"}  # every image: the settings changed
    assert "redoing" in changed.stderr and "settings changed (tile_pad)" in changed.stderr
    again = subprocess.run(job["cmd"], capture_output=True, text=True, timeout=300)  # back to the first settings
    assert {r["status"] for r in records(again.stdout)} == {"ok"}
    write_image_atomic(np.full((40, 48, 3), 9, np.uint8), job["src"] / "img3.png")
    one = subprocess.run(job["cmd"], capture_output=True, text=True, timeout=300)
    done = [r["output"] for r in records(one.stdout) if r["status"] == "ok"]
    assert done == [str(job["out"] / "img3_x4.png")] and "the input changed" in one.stderr


@pytest.mark.slow
def test_two_torchrun_processes_split_the_job_and_match_one_process_byte_for_byte(job, tmp_path):
    single = subprocess.run(job["cmd"], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    out2 = tmp_path / "out2"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *job["cmd"][1:]]
    cmd[cmd.index(str(job["out"]))] = str(out2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    double = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert double.returncode == 0, double.stderr[-2000:]
    assert double.stderr.count("8 of 8 images upscaled by 2 processes") == 1  # one rank prints the summary
    written = [r["output"] for r in records(double.stdout) if r["status"] == "ok"]
    assert len(written) == len(set(written)) == 8  # each output by exactly one rank
    for i in range(8):
        name = f"img{i}_x4.png"
        assert (out2 / name).read_bytes() == (job["out"] / name).read_bytes()


def test_slurm_ranks_split_the_job_without_a_rendezvous(job, tmp_path):
    single = subprocess.run(job["cmd"], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    out2 = tmp_path / "out_slurm"
    cmd = list(job["cmd"])
    cmd[cmd.index(str(job["out"]))] = str(out2)
    procs = []
    for rank in (0, 1):  # as `srun -n 2` starts them: SLURM_PROCID / SLURM_NTASKS, no MASTER_ADDR
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
        env.update(SLURM_PROCID=str(rank), SLURM_NTASKS="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    written = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        mine = [r["output"] for r in records(stdout) if r["status"] == "ok"]
        assert len(mine) == 4  # every second input
        written += mine
    assert len(set(written)) == 8
    for i in range(8):
        name = f"img{i}_x4.png"
        assert (out2 / name).read_bytes() == (job["out"] / name).read_bytes()
