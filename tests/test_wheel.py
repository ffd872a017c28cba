"""The built wheel works on its own: installed outside the checkout, run from an empty directory.

The wheel is built from this checkout and installed into a throwaway venv whose only link to the main venv is a
``.pth`` line naming its site-packages (the dependencies; the main venv's editable hook is not run that way), so
``nala_gen`` can only come from the wheel. The four commands of a new user then run from a temporary folder with
an empty home (no user weights) and no ``$NALA_GEN_WEIGHTS``.
"""

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

from nala_gen.sr.upscale.imageio import read_image, write_image_atomic

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", dist, REPO], check=True)
    (wheel,) = dist.glob("nala_gen-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = Path(
        subprocess.check_output(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (site / "main_venv_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([*pip, "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index", wheel], check=True)
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("NALA_GEN_WEIGHTS", "PYTHONPATH", "XDG_DATA_HOME")}
    env.update(HOME=str(root / "home"), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", HF_HUB_OFFLINE="1")
    return {"wheel": wheel, "bin": venv / "bin", "work": work, "env": env, "site": site}


def run(env, *cmd, timeout=300):
    return subprocess.run(cmd, cwd=env["work"], env=env["env"], capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_the_weights_and_no_top_level_apps(wheel_env):
    names = zipfile.ZipFile(wheel_env["wheel"]).namelist()
    name, version = wheel_env["wheel"].name.split("-")[:2]
    assert {n.split("/")[0] for n in names} == {"nala_gen", f"{name}-{version}.dist-info"}
    for shipped in (
        "weights/nalasr-light-x4.safetensors",
        "weights/naladit-digits/model_index.json",
        "assets/chelsea_lr_x4.png",
    ):
        assert f"nala_gen/resources/{shipped}" in names
    proc = run(wheel_env, wheel_env["bin"] / "python", "-c", "import nala_gen; print(nala_gen.__file__)")
    assert Path(proc.stdout.strip()).is_relative_to(wheel_env["site"]), proc.stdout + proc.stderr


def test_the_wheel_carries_the_cpu_ops_and_they_load(wheel_env):
    names = zipfile.ZipFile(wheel_env["wheel"]).namelist()
    for op in ("nala_gen/ops/_nala_fused", "nala_gen/ops/_winograd"):
        assert any(n.startswith(op) and n.endswith(".so") for n in names), names
    code = (
        "from nala_gen.ops import nala_fused, winograd; "
        "print(nala_fused._op.__file__, winograd._op.__file__, nala_fused.instruction_set())"
    )
    proc = run(wheel_env, wheel_env["bin"] / "python", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert all(Path(path).is_relative_to(wheel_env["site"]) for path in proc.stdout.split()[:2]), proc.stdout


def test_upscale_and_models_from_the_wheel(wheel_env):
    rng = np.random.default_rng(0)
    write_image_atomic(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8), wheel_env["work"] / "x.png")
    proc = run(wheel_env, "nala-sr", "models")
    assert proc.returncode == 0 and "nalasr-light-x4" in proc.stdout, proc.stderr
    proc = run(wheel_env, "nala-sr", "upscale", "x.png", "--scale", "4", "-q")
    assert proc.returncode == 0, proc.stderr
    assert read_image(wheel_env["work"] / "x_x4.png").shape == (96, 80, 3)


def test_sample_from_the_wheel(wheel_env):
    proc = run(
        wheel_env,
        "nala-gen",
        "sample",
        "-m",
        "naladit-digits",
        "-c",
        "3",
        "--steps",
        "4",
        "-o",
        "three.png",
        "--json",
        "-q",
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(wheel_env["work"] / "three.png").is_file() and record["model"] == "naladit-digits"


def test_the_app_serves_from_the_wheel(wheel_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = subprocess.Popen(
        ["nala-app", "--port", str(port)],
        cwd=wheel_env["work"],
        env=wheel_env["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, page = time.time() + 120, ""
        while time.time() < deadline and app.poll() is None:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(1)
        assert app.poll() is None, app.stderr.read()[-2000:]
        assert "nalasr-light-x4" in page and "naladit-digits" in page  # the shipped weights are offered
    finally:
        app.terminate()
        app.wait(30)
