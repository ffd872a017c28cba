"""NaLaSR and ESRT as BasicSR citizens: archs, data preparation, and real train/resume/test runs on CPU."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import nala_gen.sr.basicsr  # noqa: F401  (registers the archs before basicsr is imported)
from nala_gen.attention import kernel_names  # noqa: E402
from nala_gen.profiling import PeakMemory  # noqa: E402
from nala_gen.sr.data import prepare_benchmark, prepare_div2k, prepare_mini  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def build_network(opt: dict) -> torch.nn.Module:
    from basicsr.archs import build_network as basicsr_build  # after nala_gen.sr (import sorting moves tops)

    return basicsr_build(opt)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch", ["ESRT", "NaLaSR"])
@pytest.mark.parametrize("scale", [2, 3, 4])
def test_archs_build_through_basicsr_and_keep_odd_sizes(arch, scale):
    net = build_network({"type": arch, "upscale": scale})
    with torch.no_grad():
        out = net(torch.rand(2, 3, 13, 18))
    assert out.shape == (2, 3, 13 * scale, 18 * scale)


# ESRT's published parameter counts (a parameter-only port of its release) and ours: the release's ARFB holds a
# fifth residual scale that its forward never uses, 12 scalars in all (4 ARFBs x 3 HPBs), which ours leaves out.
ESRT_PUBLISHED = {2: 677_783, 3: 770_263, 4: 751_767}
ESRT_OURS = {2: 677_771, 3: 770_251, 4: 751_755}
# NaLaSR-light adds the NaLa block's gate projection, LePE and output LayerNorm to ESRT's attention.
NALASR_EXTRA = 25_344


@pytest.mark.parametrize("scale", [2, 3, 4])
def test_parameter_counts_match_esrt_as_published(scale):
    esrt = n_params(build_network({"type": "ESRT", "upscale": scale}))
    nalasr = n_params(build_network({"type": "NaLaSR", "upscale": scale}))
    assert esrt == ESRT_OURS[scale]
    assert abs(esrt - ESRT_PUBLISHED[scale]) / ESRT_PUBLISHED[scale] < 0.005
    assert nalasr == esrt + NALASR_EXTRA


def test_esrt_attention_is_split_softmax_with_its_published_scale():
    from nala_gen.sr.archs.esrt_arch import EMHA, split_softmax_attention

    emha = EMHA(288, 8, 4)
    assert emha.scale == 36**-0.5 and emha.reduce.bias is None and emha.qkv.bias is None
    q, k, v = (torch.randn(1, 2, 10, 6) for _ in range(3))
    # Segments of N // 4 = 2 tokens (five of them for N = 10): each query sees only its own segment.
    out = split_softmax_attention(q, k, v, 0.5, 4)
    first = torch.softmax(q[..., :2, :] @ k[..., :2, :].transpose(-2, -1) * 0.5, -1) @ v[..., :2, :]
    torch.testing.assert_close(out[..., :2, :], first)
    # One segment is plain softmax attention over all tokens.
    full = torch.softmax(q @ k.transpose(-2, -1) * 0.5, -1) @ v
    torch.testing.assert_close(split_softmax_attention(q, k, v, 0.5, 1), full)


def test_nalasr_large_builds():
    from nala_gen.sr import NALASR_SIZES

    net = build_network({"type": "NaLaSR", "upscale": 4, **NALASR_SIZES["large"]})
    assert 2.4e6 < n_params(net) < 2.6e6
    with torch.no_grad():
        assert net(torch.rand(1, 3, 10, 7)).shape == (1, 3, 40, 28)


@pytest.mark.parametrize("kernel", kernel_names())
def test_every_attention_kernel_runs(kernel):
    net = build_network({"type": "NaLaSR", "upscale": 2, "kernel": kernel, "num_block": 1})
    out = net(torch.rand(1, 3, 9, 11))
    out.mean().backward()
    assert out.shape == (1, 3, 18, 22)
    assert all(p.grad is not None for p in net.body.transformer.parameters())


def test_unknown_attention_kernel_is_rejected():
    with pytest.raises(ValueError, match="unknown kernel"):
        build_network({"type": "NaLaSR", "kernel": "flash"})


def test_tiny_inputs_are_a_clear_error():
    with pytest.raises(ValueError, match="at least 2x2"):
        build_network({"type": "ESRT", "upscale": 2})(torch.rand(1, 3, 1, 9))


def attention_peak(attention, tokens: int) -> int:
    """Peak extra memory (bytes) of a parameter-free attention ``attention(q, k, v)`` at a token count."""
    with torch.no_grad():
        attention(*(torch.randn(1, 8, 256, 18) for _ in range(3)))  # warm up thread pools
    q, k, v = (torch.randn(1, 8, tokens, 18) for _ in range(3))
    with torch.no_grad(), PeakMemory("cpu") as memory:
        attention(q, k, v)
    return memory.peak_bytes


def test_nala_memory_grows_linearly_emha_quadratically():
    from nala_gen.attention import linear_attention
    from nala_gen.sr.archs.esrt_arch import split_softmax_attention

    # 4x the tokens: NaLa's extra memory grows ~4x (output + fixed-size chunks), ESRT's EMHA ~16x.
    def nala(q, k, v):
        return linear_attention(q, k, v, "nala")

    def emha(q, k, v):
        return split_softmax_attention(q, k, v, 36**-0.5, 4)

    nala_growth = attention_peak(nala, 262144) / attention_peak(nala, 65536)
    emha_growth = attention_peak(emha, 16384) / attention_peak(emha, 4096)
    assert nala_growth < 6, nala_growth
    assert emha_growth > 10, emha_growth


def test_prepare_benchmark_layout(tmp_path):
    hr = tmp_path / "hr"
    hr.mkdir()
    rng = np.random.default_rng(0)
    for name, (h, w) in {"a": (50, 77), "b": (61, 40)}.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(hr / f"{name}.png")
    prepare_benchmark(hr, tmp_path / "Set", scales=[2, 3, 4])
    for name in ("a", "b"):
        gt = Image.open(tmp_path / "Set" / "GTmod12" / f"{name}.png")
        assert gt.width % 12 == 0 and gt.height % 12 == 0
        for s in (2, 3, 4):
            lr = Image.open(tmp_path / "Set" / f"LRbicx{s}" / f"{name}.png")
            assert (lr.width * s, lr.height * s) == gt.size


def test_prepare_div2k_with_lmdb(tmp_path):
    (tmp_path / "DIV2K_train_HR").mkdir()
    img = np.random.default_rng(1).integers(0, 255, (130, 200, 3), dtype=np.uint8)
    Image.fromarray(img).save(tmp_path / "DIV2K_train_HR" / "0001.png")
    counts = prepare_div2k(tmp_path, scales=[2, 4], crop=96, step=48, lmdb=True)
    subs = sorted((tmp_path / "DIV2K_train_HR_sub").glob("*.png"))
    assert counts["sub_images"] == len(subs) == 2 * 4  # rows at 0, 34; columns at 0, 48, 96, 104
    assert Image.open(subs[0]).size == (96, 96)
    assert Image.open(tmp_path / "DIV2K_train_LR_bicubic" / "X4_sub" / subs[0].name).size == (24, 24)
    meta = (tmp_path / "DIV2K_train_LR_bicubic" / "X2_sub.lmdb" / "meta_info.txt").read_text().splitlines()
    assert len(meta) == 8 and meta[0].startswith("0001_s001.png (48,48,3)")


def test_prepare_div2k_needs_its_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="DIV2K_train_HR"):
        prepare_div2k(tmp_path)


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("sr_run")
    prepare_mini(root / "datasets" / "mini", scales=[4], limit=2)
    return root


def test_prepare_mini_layout(mini_root):
    mini = mini_root / "datasets" / "mini"
    hr = sorted((mini / "train" / "HR_sub").glob("*.png"))
    assert hr and all(Image.open(p).size == (192, 192) for p in hr[:5])
    assert {p.name for p in (mini / "train" / "LR_bicubic" / "X4_sub").glob("*.png")} == {p.name for p in hr}
    val = sorted((mini / "val" / "GTmod12").glob("*.png"))
    assert [p.stem for p in val] == ["china", "flower"]  # held out: never in the train split
    for p in val:
        gt, lr = Image.open(p), Image.open(mini / "val" / "LRbicx4" / p.name)
        assert (lr.width * 4, lr.height * 4) == gt.size


def run_basicsr(entry: str, option: Path, cwd: Path, *extra: str) -> str:
    cmd = [sys.executable, "-m", f"nala_gen.sr.{entry}", "-opt", str(option), *extra]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


SHORT_RUN = [
    "--force_yml",
    "datasets:train:gt_size=64",
    "datasets:train:batch_size_per_gpu=4",
    "val:val_freq=4",
    "logger:save_checkpoint_freq=4",
    "logger:print_freq=1",
]


@pytest.mark.parametrize(
    ("arch", "run", "model_type"),
    [("NaLaSR", "NaLaSR_light_x4_mini", "SRModel"), ("ESRT", "ESRT_x4_mini", "UpscalerSRModel")],
)
def test_basicsr_train_resume_and_test_on_cpu(mini_root, arch, run, model_type):
    option = REPO / "options" / "train" / arch / f"train_{run}.yml"
    log = run_basicsr("train", option, mini_root, *SHORT_RUN, f"model_type={model_type}", "train:total_iter=4")
    assert f"Model [{model_type}] is created." in log
    assert re.search(r"# psnr: [0-9.]+", log)  # validated at iteration 4
    losses = [float(x) for x in re.findall(r"l_pix: ([0-9.e+-]+)", log)]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    exp = mini_root / "experiments" / run
    assert (exp / "models" / "net_g_4.pth").is_file() and (exp / "training_states" / "4.state").is_file()

    # Interrupted runs continue where they stopped, on the CPU (BasicSR 1.4.2 alone would load onto CUDA), past a
    # state truncated by a kill mid-write (BasicSR alone would fail on it at every later resume).
    (exp / "training_states" / "6.state").write_bytes(b"")
    log = run_basicsr("train", option, mini_root, "--auto_resume", *SHORT_RUN, "train:total_iter=8")
    assert "skipping unreadable training state" in log and "6.state" in log
    assert "Resuming training from epoch: 0, iter: 4" in log
    assert re.search(r"iter:\s+8,", log)
    assert (exp / "training_states" / "8.state").is_file()

    test_option = REPO / "options" / "test" / arch / f"test_{run}.yml"
    log = run_basicsr("test", test_option, mini_root)
    psnr = float(re.search(r"# psnr: ([0-9.]+)", log).group(1))
    ssim = float(re.search(r"# ssim: ([0-9.]+)", log).group(1))
    assert 5 < psnr < 60 and 0 < ssim <= 1
    assert len(list((mini_root / "results" / f"test_{run}").rglob("*.png"))) == 2


def test_upscaler_sr_model_validates_as_srmodel_does_and_leaves_the_trained_network_alone():
    import torch
    from basicsr.models import build_model
    from basicsr.models.sr_model import SRModel

    network = {"type": "NaLaSR", "upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    opt = {"name": "t", "model_type": "UpscalerSRModel", "num_gpu": 0, "is_train": False, "dist": False, "scale": 4}
    model = build_model({**opt, "network_g": network, "path": {"pretrain_network_g": None}})
    torch.manual_seed(0)
    lq = torch.randint(0, 256, (1, 3, 21, 30)).float() / 255  # odd sizes, as read from an 8-bit file
    model.feed_data({"lq": lq})
    weights = {k: v.clone() for k, v in model.net_g.state_dict().items()}
    model.test()
    ours = model.output
    SRModel.test(model)
    theirs = model.output.clamp(0, 1)
    assert ours.shape == theirs.shape == (1, 3, 84, 120)
    # 8-bit output (as BasicSR's metrics read it): within half a level, plus the inference graph's rounding
    assert (ours - theirs).abs().max() <= 0.5 / 255 + 1e-5
    assert (ours * 255 - (ours * 255).round()).abs().max() < 1e-4
    for name, value in model.net_g.state_dict().items():
        assert torch.equal(value, weights[name]) and value.is_contiguous(), name  # not made channels-last


def test_upscaler_sr_model_validates_within_the_option_files_budget():
    """``val: memory_budget_mb`` fixes the validation's budget: two trainings validating at once must not each
    take half of what is free."""
    import yaml
    from basicsr.models import build_model

    network = {"type": "NaLaSR", "upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    opt = {"name": "t", "model_type": "UpscalerSRModel", "num_gpu": 0, "is_train": False, "dist": False, "scale": 4}
    opt.update(network_g=network, path={"pretrain_network_g": None})
    assert build_model(opt)._make_engine().memory_budget is None  # default: the host's free memory at each job
    assert build_model({**opt, "val": {"memory_budget_mb": 64}})._make_engine().budget() == 64 * 2**20
    for stem in ("ESRT/train_ESRT_x4_photos", "NaLaSR/train_NaLaSR_light_x4_photos"):
        for option in (stem, stem + "_ft"):
            assert yaml.safe_load((REPO / "options" / "train" / f"{option}.yml").read_text())["val"]["memory_budget_mb"]


@pytest.mark.parametrize("stage", ["mini", "mini_ft", "photos", "photos_ft"])
def test_nalasr_and_esrt_train_alike_at_every_stage(stage):
    """The shipped x4 pair is compared at an equal budget: each stage's options differ only in the network, the
    run's name and the checkpoint it starts from."""
    import yaml

    nalasr, esrt = (
        yaml.safe_load((REPO / "options" / "train" / f"{arch}_x4_{stage}.yml").read_text())
        for arch in ("NaLaSR/train_NaLaSR_light", "ESRT/train_ESRT")
    )
    assert (nalasr["network_g"]["type"], esrt["network_g"]["type"]) == ("NaLaSR", "ESRT")
    starts = [opt["path"].pop("pretrain_network_g", None) for opt in (nalasr, esrt)]
    assert starts[0] == (starts[1] and starts[1].replace("ESRT_x4", "NaLaSR_light_x4"))
    for opt in (nalasr, esrt):
        del opt["name"], opt["network_g"]
    assert nalasr == esrt


def test_the_x2_photo_stage_trains_as_the_x4_one():
    """The shipped x2's photo stage has the x4 photo stage's schedule, data and validation, at its own scale."""
    import yaml

    x2, x4 = (
        yaml.safe_load((REPO / "options" / "train" / "NaLaSR" / f"train_NaLaSR_light_{s}_photos_ft.yml").read_text())
        for s in ("x2", "x4")
    )
    assert (x2["scale"], x2["network_g"]["upscale"]) == (2, 2)
    assert x2["datasets"]["train"]["gt_size"] // 2 == x4["datasets"]["train"]["gt_size"] // 4  # the same LR patch
    assert x2["datasets"]["train"]["dataroot_lq"].endswith("X2_sub") and x2["datasets"]["val"]["dataroot_lq"].endswith(
        "x2"
    )
    assert {m["crop_border"] for m in x2["val"]["metrics"].values()} == {2}
    assert x2["path"]["pretrain_network_g"] == "experiments/NaLaSR_light_x2_mini/models/net_g_latest.pth"
    assert x2["train"] == x4["train"] and x2["manual_seed"] == x4["manual_seed"]
    for opt in (x2, x4):
        del opt["name"], opt["scale"], opt["network_g"]["upscale"], opt["path"], opt["val"]["metrics"]
        for split in opt["datasets"].values():
            del split["dataroot_lq"]
            split.pop("gt_size", None)
    assert x2 == x4


def test_evaluate_bicubic_and_a_model(mini_root, tmp_path):
    from nala_gen.sr.evaluate import evaluate
    from nala_gen.sr.loading import build_arch
    from nala_gen.weights import write_weights

    config = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    write_weights(build_arch("NaLaSR", config).state_dict(), tmp_path, "tiny", "sr", "NaLaSR", config, {})
    results = evaluate(mini_root / "datasets" / "mini" / "val", 4, ["bicubic", str(tmp_path / "tiny.json")])
    bicubic = results["bicubic"]
    assert set(bicubic["per_image"]) == {"china", "flower"}
    assert 20 < bicubic["psnr"] < 40 and 0.5 < bicubic["ssim"] < 1
    # An untrained network is far worse than bicubic: the metric sees the difference.
    assert results[str(tmp_path / "tiny.json")]["psnr"] < bicubic["psnr"] - 3


def test_evaluate_keeps_to_its_memory_budget(mini_root, tmp_path):
    """The budget reaches the upscaler: ample, tiled scores match the whole-image ones; too small, a one-line
    error before any work (the ablation scores the photos with a fixed budget so that two runs fit the host)."""
    from nala_gen.sr.evaluate import evaluate
    from nala_gen.sr.loading import build_arch
    from nala_gen.sr.upscale.engine import MemoryBudgetError
    from nala_gen.weights import write_weights

    config = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    write_weights(build_arch("NaLaSR", config).state_dict(), tmp_path, "tiny", "sr", "NaLaSR", config, {})
    data, model = mini_root / "datasets" / "mini" / "val", str(tmp_path / "tiny.json")
    whole = evaluate(data, 4, [model])[model]
    auto = evaluate(data, 4, [model], tile="auto", memory_budget=2 * 2**30)[model]
    assert auto["psnr"] == pytest.approx(whole["psnr"], abs=0.05)
    with pytest.raises(MemoryBudgetError):
        evaluate(data, 4, [model], tile="auto", memory_budget=2**20)


def test_the_deprecated_kernel_names_still_load_with_a_warning():
    """Older option files and cards say attn_type: they still build (NaLaDiT's older names: test_diffusion_compat)."""
    from nala_gen.attention import NaLaAttention

    with pytest.warns(DeprecationWarning, match="attn_type= is deprecated"):
        net = build_network({"type": "NaLaSR", "upscale": 2, "attn_type": "relu", "num_block": 1})
    assert {m.kernel for m in net.modules() if isinstance(m, NaLaAttention)} == {"relu"}
    with pytest.raises(ValueError, match="disagree"):
        NaLaAttention(16, 2, kernel="relu", attn_type="elu1")


@pytest.fixture
def ship():
    """scripts/ship_sr_weights.py as a module (a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ship", REPO / "scripts" / "ship_sr_weights.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ship_script_reports_every_training_stage(ship, tmp_path, monkeypatch):
    # The shipped x4 weights train in two stages; a stage whose logs are in another checkout keeps the figures of the
    # card shipped before, a stage trained here reads its own log.
    import json

    monkeypatch.chdir(tmp_path)
    stage1, stage2 = "options/train/NaLaSR/a.yml", "options/train/NaLaSR/a_ft.yml"
    (tmp_path / "weights").mkdir()
    old = {"command": ship.command(stage1), "iterations": 3000, "train_time_s": 6185.0, "hardware": "CPU: old"}
    (tmp_path / "weights" / "w.json").write_text(json.dumps({"info": old}))
    log = tmp_path / "experiments" / "A_ft" / "train_A_ft_1.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "2026-12-02 14:01:07,733 INFO: Start training from epoch: 0, iter: 0\n"
        "2026-12-02 14:02:07,000 INFO: [A..][epoch:  0, iter:     500, lr:(6.250e-05,)] l_pix: 1e-02\n"
        "2026-12-02 14:03:07,000 INFO: [A..][epoch:  1, iter:   1,000, lr:(3.125e-05,)] l_pix: 1e-02\n"
        "2026-12-02 14:03:08,000 INFO: End of training. Time consumed: 0:02:01\n"
    )
    first = ship.stage_facts("w", stage1, {"name": "A", "train": {"total_iter": 3000}}, "CPU: new")
    second = ship.stage_facts("w", stage2, {"name": "A_ft", "train": {"total_iter": 1000}}, "CPU: new")
    assert first == old
    assert second == {
        "command": ship.command(stage2),
        "iterations": 1000,
        "train_time_s": 121.0,
        "hardware": "CPU: new",
    }
    assert ship.stage_facts("w", "options/other.yml", {"name": "B", "train": {"total_iter": 5}}, "CPU: new") is None


def test_ship_script_refuses_an_unknown_weight_name(ship, tmp_path, monkeypatch):
    """``ship_sr_weights.py NAME ...`` ships the named weights only; a name it does not ship stops it before any
    export or scoring (no card is written)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="unknown weights nalasr-x9; shipped here: nalasr-light-x4, esrt-x4"):
        ship.main(["nalasr-light-x2", "nalasr-x9"])
    assert not any(tmp_path.iterdir())


def test_evaluate_runs_a_model_at_the_precision_its_spec_names(mini_root, tmp_path):
    """``NAME@bf16`` is the same weights under bf16 autocast, reported beside ``NAME``; where this CPU has no native
    bf16, the whole evaluation is refused in one line before any image."""
    from nala_gen.devices import cpu_native_bf16
    from nala_gen.sr.evaluate import evaluate, model_precision
    from nala_gen.sr.loading import build_arch
    from nala_gen.weights import write_weights

    assert model_precision("nalasr-light-x4@bf16") == ("nalasr-light-x4", "bf16")
    assert model_precision("runs/net@v2.json") == ("runs/net@v2.json", "auto")  # not a precision: part of the name
    config = {"upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}
    net = build_arch("NaLaSR", config)
    with torch.no_grad():  # a network whose output is not near zero, so bf16 rounding shows in the scores
        net.tail[-1].bias.fill_(0.3)
    write_weights(net.state_dict(), tmp_path, "tiny", "sr", "NaLaSR", config, {})
    model = str(tmp_path / "tiny.json")
    data = mini_root / "datasets" / "mini" / "val"
    if not cpu_native_bf16():
        with pytest.raises(ValueError, match="AVX512_BF16 or AMX"):
            evaluate(data, 4, [model, model + "@bf16"])
        return
    results = evaluate(data, 4, [model, model + "@bf16"])
    fp32, bf16 = results[model], results[model + "@bf16"]
    assert bf16["per_image"].keys() == fp32["per_image"].keys()
    assert bf16["psnr"] == pytest.approx(fp32["psnr"], abs=0.05)  # the same network ...
    assert bf16["per_image"] != fp32["per_image"]  # ... at another precision
