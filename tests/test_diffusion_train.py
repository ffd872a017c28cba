"""Training NaLaDiT / NaLaSiT with accelerate, and the ``nala-gen`` CLI (tiny models, 8x8 digits, CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("diffusers")
pytest.importorskip("accelerate")
pytest.importorskip("sklearn")

from PIL import Image  # noqa: E402

from nala_gen.diffusion import cli  # noqa: E402
from nala_gen.diffusion.data import DigitsDataset, EpochSampler, ImageFolderDataset, generator  # noqa: E402
from nala_gen.diffusion.model import NaLaDiTTransformer2DModel  # noqa: E402
from nala_gen.diffusion.objectives import build_objective  # noqa: E402
from nala_gen.diffusion.train import build_model, checkpoint_dirs, train  # noqa: E402
from nala_gen.diffusion.train import main as train_main  # noqa: E402
from nala_gen.diffusion.train_config import config_from_dict, load_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "objective": "dit",
    "model": {"size": "tiny", "hidden_size": 32, "depth": 1, "num_attention_heads": 2},
    "data": {"source": "digits", "image_size": 8, "channels": 1},
    "batch_size": 16,
    "lr": 2e-3,
    "max_steps": 4,
    "checkpoint_every": 100,
    "log_every": 1,
    "ema_decay": None,
    "seed": 0,
}


def tiny_config(output_dir: Path, **fields):
    return config_from_dict({**TINY, "output_dir": str(output_dir), **fields})


def write_config(path: Path, output_dir: Path, **fields) -> Path:
    path.write_text(yaml.safe_dump({**TINY, "output_dir": str(output_dir), **fields}))
    return path


def logged_losses(output_dir: Path) -> dict[int, float]:
    lines = (output_dir / "log.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


# ------------------------------------------------------------------------------------------- config and data
def test_shipped_configs_load_and_overrides_apply():
    for name in (
        "naladit_digits",
        "naladit_digits_block",
        "nalasit_digits",
        "naladit_digits_softmax",
        "naladit_digits_softmax_block",
    ):
        config = load_config(REPO / "options" / "diffusion" / f"{name}.yml")
        assert config.data.source == "digits" and config.model["patch_size"] == 2
    config = load_config(REPO / "options/diffusion/naladit_digits.yml", ["model.kernel=softmax", "lr=1e-3"])
    assert config.model["kernel"] == "softmax" and config.lr == 1e-3
    with pytest.raises(ValueError, match="unknown field"):
        config_from_dict({**TINY, "learning_rate": 1.0})
    with pytest.raises(ValueError, match="unknown model field"):
        config_from_dict(TINY, ["model.hidden=3"])
    with pytest.raises(ValueError, match="learn_sigma"):
        config_from_dict(TINY, ["model.learn_sigma=true"])


def test_digits_image_folder_and_sampler(tmp_path):
    digits = DigitsDataset(image_size=16, channels=3)
    images, labels = digits.batch(torch.tensor([0, 5, 1796]))
    assert images.shape == (3, 3, 16, 16) and images.min() >= -1 and images.max() <= 1
    assert labels.tolist() == [0, 5, 8] and digits.id2label[3] == "three"

    for name, color in (("cat", 40), ("dog", 200)):
        (tmp_path / name).mkdir()
        Image.new("RGB", (20, 12), (color,) * 3).save(tmp_path / name / "a.png")
    folder = ImageFolderDataset(tmp_path, image_size=8, channels=1)
    images, labels = folder.batch(torch.tensor([1, 0]))
    assert images.shape == (2, 1, 8, 8) and labels.tolist() == [1, 0] and folder.id2label == {0: "cat", 1: "dog"}
    assert images[0].mean() > 0 > images[1].mean()

    sampler = EpochSampler(10, seed=3)
    first, second = sampler.indices(0, 10), EpochSampler(10, seed=3).indices(5, 10)
    assert sorted(first.tolist()) == list(range(10))  # an epoch visits every image once
    assert torch.equal(second[:5], first[5:])  # positions, not call history, decide the indices


# ------------------------------------------------------------------------------------------------- training
def fixed_batch_loss(model, objective_name: str) -> float:
    """The objective's loss on 128 fixed digits with fixed timesteps and noise."""
    images, labels = DigitsDataset(8, 1).batch(torch.arange(128))
    with torch.no_grad():
        return build_objective(objective_name).loss(model.eval(), images, labels, generator(123)).item()


@pytest.mark.parametrize("objective", ["dit", "sit"])
def test_training_lowers_the_loss(tmp_path, objective):
    config = tiny_config(tmp_path, objective=objective, max_steps=30, lr=3e-3, batch_size=32)
    before = fixed_batch_loss(build_model(config, num_classes=10), objective)
    info = train(config, progress=False)
    after = fixed_batch_loss(
        NaLaDiTTransformer2DModel.from_pretrained(tmp_path / "pipeline" / "transformer"), objective
    )
    assert info["steps"] == 30 and info["objective"] == objective
    assert after < 0.8 * before, (before, after)
    saved = json.loads((tmp_path / "pipeline" / "scheduler" / "scheduler_config.json").read_text())
    assert saved["_class_name"] == ("DDPMScheduler" if objective == "dit" else "FlowMatchEulerDiscreteScheduler")


def test_resume_gives_the_same_losses_and_weights(tmp_path):
    fields = {"max_steps": 4, "grad_accum": 2, "ema_decay": 0.9}
    whole = train(tiny_config(tmp_path / "whole", checkpoint_every=1, **fields), progress=False)
    # Only the last keep_checkpoints (2) survive.
    assert [p.name for p in checkpoint_dirs(tmp_path / "whole")] == ["step_3", "step_4"]

    train(tiny_config(tmp_path / "split", checkpoint_every=2, **{**fields, "max_steps": 2}), progress=False)
    # What a run killed mid-save leaves behind is removed on the next start, never read.
    stale = tmp_path / "split" / "checkpoints" / ".step_3.tmp"
    stale.mkdir()
    (stale / "train_state.json").write_text("{")
    resumed = train(tiny_config(tmp_path / "split", checkpoint_every=2, **fields), resume="latest", progress=False)
    assert resumed["resumed_from"].endswith("step_2") and resumed["steps_this_run"] == 2
    assert not stale.exists()

    full, split = logged_losses(tmp_path / "whole"), logged_losses(tmp_path / "split")
    assert split[3] == full[3] and split[4] == full[4]
    assert resumed["weights_sha256_per_rank"] == whole["weights_sha256_per_rank"]
    # Resuming from an older checkpoint of a finished run redoes the later steps identically; the log keeps one
    # line per step.
    again = train(
        tiny_config(tmp_path / "whole", checkpoint_every=1, **fields),
        resume=str(tmp_path / "whole/checkpoints/step_3"),
        progress=False,
    )
    lines = (tmp_path / "whole" / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    assert (
        logged_losses(tmp_path / "whole")[4] == full[4]
        and again["weights_sha256_per_rank"] == whole["weights_sha256_per_rank"]
    )
    ema = [
        (d / "pipeline/transformer/diffusion_pytorch_model.safetensors").read_bytes()
        for d in (tmp_path / "whole", tmp_path / "split")
    ]
    assert ema[0] == ema[1]


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    config = write_config(tmp_path / "nan.yml", out, lr=1e30, max_steps=6, checkpoint_every=1)
    assert cli.main(["train", "--config", str(config), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nala-gen train: error: ")
    assert " is nan" in err or " is inf" in err, err
    failed = int(err.split(" at step ")[1].split(";")[0])
    saved = [int(p.name[5:]) for p in checkpoint_dirs(out)]
    assert saved and max(saved) == failed - 1 and f"step_{failed - 1}" in err
    assert not (out / "pipeline").exists() and not list((out / "checkpoints").glob(".*"))


def test_resume_mistakes_are_one_line_errors(tmp_path, capsys):
    config = write_config(tmp_path / "c.yml", tmp_path / "run", max_steps=1)
    assert train_main(["--config", str(config), "--resume", str(tmp_path / "nowhere"), "-q"]) == 1
    assert "not a checkpoint folder" in capsys.readouterr().err
    assert train_main(["--config", str(config), "-q"]) == 0
    # A second fresh start would mix two runs' checkpoints and logs.
    assert train_main(["--config", str(config), "-q"]) == 1
    assert "already holds checkpoints: pass --resume latest" in capsys.readouterr().err


def test_latent_training_with_a_local_vae(tmp_path, capsys):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    blocks = {"down_block_types": ("DownEncoderBlock2D",) * 2, "up_block_types": ("UpDecoderBlock2D",) * 2}
    vae = AutoencoderKL(block_out_channels=(8, 16), latent_channels=4, layers_per_block=1, norm_num_groups=8, **blocks)
    vae.save_pretrained(tmp_path / "vae")
    data = {"source": "digits", "image_size": 16, "channels": 3}
    info = train(tiny_config(tmp_path / "run", vae=str(tmp_path / "vae"), data=data, max_steps=2), progress=False)
    assert info["model_config"]["in_channels"] == 4 and info["model_config"]["sample_size"] == 8
    out = tmp_path / "latent.png"
    code, _, _ = run_cli(
        capsys, "sample", "-m", tmp_path / "run" / "pipeline", "-c", "2", "--steps", 1, "-o", out, "-q"
    )
    with Image.open(out) as img:
        assert code == 0 and img.size == (16, 16) and img.mode == "RGB"


def test_two_processes_end_with_the_same_weights(tmp_path):
    out = tmp_path / "ddp"
    config = write_config(tmp_path / "ddp.yml", out, max_steps=3, checkpoint_every=3, batch_size=8)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += ["-m", "nala_gen.diffusion.train", "--config", str(config), "-q"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    info = json.loads((out / "training_info.json").read_text())
    hashes = info["weights_sha256_per_rank"]
    assert info["num_processes"] == 2 and info["effective_batch"] == 16
    assert len(hashes) == 2 and hashes[0] == hashes[1]
    assert {p.name for p in (out / "checkpoints" / "step_3").glob("random_states_*")} == {
        "random_states_0.pkl",
        "random_states_1.pkl",
    }


# ---------------------------------------------------------------------------------------------------- sampling
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Pipeline folders of two tiny 2-step trainings: {"dit": Path, "sit": Path}."""
    root = tmp_path_factory.mktemp("trained")
    for objective in ("dit", "sit"):
        train(tiny_config(root / objective, objective=objective, max_steps=2, ema_decay=0.99), progress=False)
    return {objective: root / objective / "pipeline" for objective in ("dit", "sit")}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_trained_folder_records_what_its_model_outputs(trained, capsys):
    for objective, kind in (("dit", "epsilon"), ("sit", "flow")):
        config = json.loads((trained[objective] / "transformer" / "config.json").read_text())
        assert config["prediction_type"] == kind
    code, _, err = run_cli(capsys, "sample", "-m", trained["sit"], "--scheduler", "ddim", "--steps", 1, "-q")
    assert code == 1 and "does not fit a flow-matching (SiT) model" in err and len(err.strip().splitlines()) == 1


def test_sample_writes_the_requested_size_and_grid(trained, tmp_path, capsys):
    out = tmp_path / "three.png"
    code, stdout, _ = run_cli(
        capsys, "sample", "-m", trained["dit"], "--class", "3", "--steps", 2, "--size", 16, "-o", out, "-q"
    )
    assert code == 0 and stdout.strip() == str(out)
    with Image.open(out) as img:
        assert img.size == (16, 16) and img.mode == "L"

    grid = tmp_path / "grid.png"
    argv = ["sample", "-m", trained["sit"], "--class", "all", "--grid", 3, "--steps", 2, "--cfg", 2]
    code, stdout, _ = run_cli(capsys, *argv, "--scheduler", "heun", "--zoom", 2, "-o", grid, "--json")
    record = json.loads(stdout)
    assert code == 0 and record["output"] == str(grid) and record["mode"] == "flow"
    assert record["classes"] == list(range(10)) and record["tokens"] == 16 and record["steps"] == 2
    assert record["latency_s"] > 0 and record["peak_mem_bytes"] < 2**30 and record["batch"] == 60
    with Image.open(grid) as img:
        assert img.size == (3 * 8 * 2, 10 * 8 * 2)  # one row per class, three samples each


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--class", "12"], "bad class id 12"),
        (["--class", "eleven"], "unknown class name 'eleven'"),
        (["--class", "3", "--scheduler", "euler"], "does not fit an epsilon (DiT) model"),
        (["--class", "3", "-o", "{tmp}/out.xyz"], "cannot tell the image format"),
    ],
)
def test_sample_errors_are_one_line_and_write_nothing(trained, tmp_path, capsys, argv, message):
    out = tmp_path / "out.png"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, stdout, err = run_cli(capsys, "sample", "-m", trained["dit"], "--steps", 1, "-o", out, *argv)
    assert code == 1 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("nala-gen sample: error: ") and message in err
    assert list(tmp_path.iterdir()) == []


def test_named_weights_are_exported_verified_and_sampled(trained, tmp_path, capsys, monkeypatch):
    weights = tmp_path / "weights"
    code, _, _ = run_cli(capsys, "export", trained["dit"].parent, "--name", "digits-tiny", "--out", weights)
    card = json.loads((weights / "digits-tiny.json").read_text())
    assert code == 0 and card["task"] == "diffusion" and card["arch"] == "NaLaDiT" and card["info"]["steps"] == 2
    monkeypatch.setenv("NALA_GEN_WEIGHTS", str(weights))
    code, stdout, _ = run_cli(capsys, "models")
    assert code == 0 and "digits-tiny" in stdout

    out = tmp_path / "named.png"
    code, _, _ = run_cli(capsys, "sample", "-m", "digits-tiny", "--class", "seven", "--steps", 1, "-o", out, "-q")
    assert code == 0 and out.is_file()

    (weights / "digits-tiny" / "scheduler" / "scheduler_config.json").write_text("{}")
    code, _, err = run_cli(capsys, "sample", "-m", "digits-tiny", "--class", "1", "-o", tmp_path / "x.png")
    assert code == 1 and "sha256" in err and not (tmp_path / "x.png").exists()
