"""The shipped x4 pair's training stages: a stage starts from the shipped weights of the one before (a
``.safetensors`` through BasicSR's options), and stage 4's options, runs and rebuild chain."""

import re
from pathlib import Path

import pytest
import torch
import yaml

import nala_gen.sr.basicsr  # noqa: F401  (registers the archs and UpscalerSRModel; basicsr must come after it)

REPO = Path(__file__).resolve().parents[1]
TINY = {"type": "NaLaSR", "upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4}


def build(path: dict):
    from basicsr.models import build_model

    opt = {"name": "t", "model_type": "UpscalerSRModel", "num_gpu": 0, "is_train": False, "dist": False, "scale": 4}
    return build_model({**opt, "network_g": TINY, "path": path})


def test_pretrain_network_g_loads_a_safetensors_file_and_a_pth_as_basicsr_does(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    source = build({"pretrain_network_g": None}).net_g.state_dict()
    torch.manual_seed(2)
    assert not torch.equal(build({"pretrain_network_g": None}).net_g.state_dict()["body.conv.weight"],
                           source["body.conv.weight"])  # fmt: skip
    save_file({k: v.contiguous() for k, v in source.items()}, str(tmp_path / "w.safetensors"))
    # param_key names a BasicSR checkpoint's entry; a safetensors file is one state dict, so it is ignored.
    loaded = build({"pretrain_network_g": str(tmp_path / "w.safetensors"), "param_key_g": "params_ema"})
    assert all(torch.equal(v, source[k]) for k, v in loaded.net_g.state_dict().items())
    torch.save({"params_ema": source}, tmp_path / "net_g.pth")  # BasicSR's own path, unchanged
    loaded = build({"pretrain_network_g": str(tmp_path / "net_g.pth"), "param_key_g": "params_ema"})
    assert all(torch.equal(v, source[k]) for k, v in loaded.net_g.state_dict().items())
    # strict_load_g holds as given: a key the network lacks fails a strict load, not a loose one.
    save_file({**source, "extra.weight": torch.zeros(1)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(RuntimeError, match="extra.weight"):
        build({"pretrain_network_g": str(tmp_path / "extra.safetensors")})
    build({"pretrain_network_g": str(tmp_path / "extra.safetensors"), "strict_load_g": False})


def ship_script():
    """scripts/ship_sr_weights.py as a module (its RUNS chain and card texts)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ship", REPO / "scripts" / "ship_sr_weights.py")
    ship = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship)
    return ship


def stage_options(stem: str, *stages: str) -> list[dict]:
    """The option files ``options/train/{stem}_{stage}.yml``, parsed."""
    return [yaml.safe_load((REPO / "options" / "train" / f"{stem}_{s}.yml").read_text()) for s in stages]


def assert_chained(weights: str, stem: str, before: str, after: str) -> tuple[dict, dict]:
    """Stage ``after`` of ``weights`` starts from stage ``before``'s run (its EMA) and follows it in the ship chain
    and in ``make weights-sr``; its header says how to start it in another checkout. Returns both stages' options."""
    first, second = stage_options(stem, before, after)
    assert second["path"]["pretrain_network_g"] == f"experiments/{first['name']}/models/net_g_latest.pth"
    assert second["path"]["param_key_g"] == "params_ema"
    header = (REPO / "options" / "train" / f"{stem}_{after}.yml").read_text()
    assert f"--force_yml path:pretrain_network_g=weights/{weights}.safetensors" in header
    assert f"-opt options/train/{stem}_{after}.yml --auto_resume" in header
    chain = ship_script().RUNS[weights]
    assert chain[chain.index(f"options/train/{stem}_{before}.yml") + 1] == f"options/train/{stem}_{after}.yml"
    runs = re.search(r"^SR_RUNS := (.*?)\n(?!\t)", (REPO / "Makefile").read_text(), re.S | re.M).group(1).split()
    assert runs.index(f"{stem}_{after}") > runs.index(f"{stem}_{before}")
    return first, second


STAGE4 = {
    "nalasr-light-x4": ("NaLaSR/train_NaLaSR_light_x4", "NaLaSR_light_x4"),
    "esrt-x4": ("ESRT/train_ESRT_x4", "ESRT_x4"),
}


@pytest.mark.parametrize("weights", list(STAGE4))
def test_stage4_starts_from_stage3_and_follows_it_in_the_rebuild(weights):
    stem, name = STAGE4[weights]
    stage3, stage4 = stage_options(stem, "photos_ft", "photos_stage4")
    # make weights-sr chains the stages: stage 4 starts from stage 3's run (its EMA), after it.
    assert stage4["path"]["pretrain_network_g"] == f"experiments/{stage3['name']}/models/net_g_latest.pth"
    assert stage4["path"]["param_key_g"] == "params_ema"
    train = stage4["train"]
    assert (train["optim_g"]["lr"], train["ema_decay"]) == (1e-4, 0.999)
    milestones = train["scheduler"]["milestones"]  # the learning rate halves within the stage, not after it
    assert milestones == sorted(milestones) and 0 < milestones[0] and milestones[-1] < train["total_iter"]
    assert stage4["val"]["val_freq"] == train["total_iter"]  # validated once, at the end
    data = stage4["datasets"]["train"]
    assert data["use_hflip"] and data["use_rot"] and data["dataroot_gt"] == stage3["datasets"]["train"]["dataroot_gt"]
    assert stage4["datasets"]["val"] == stage3["datasets"]["val"]  # compared on the same held-out split
    # The header's command for a stage 3 that trained elsewhere: the shipped weights, through --force_yml.
    header = (REPO / "options" / "train" / f"{stem}_photos_stage4.yml").read_text()
    assert f"--force_yml path:pretrain_network_g=weights/{weights}.safetensors" in header
    ship = ship_script()
    chain = ship.RUNS[weights]  # stage 4 right after stage 3 in the ship script's chain
    assert chain[chain.index(f"options/train/{stem}_photos_ft.yml") + 1] == f"options/train/{stem}_photos_stage4.yml"
    assert data["name"] in ship.DATA
    runs = re.search(r"^SR_RUNS := (.*?)\n(?!\t)", (REPO / "Makefile").read_text(), re.S | re.M).group(1).split()
    runs = [r for r in runs if r != "\\"]
    assert runs.index(f"{stem}_photos_stage4") > runs.index(f"{stem}_photos_ft")


@pytest.mark.parametrize("stage", ["stage4", "stage5", "stage6", "stage7", "stage8"])
def test_the_pairs_stage_options_differ_only_in_the_network_and_run(stage):
    (nalasr,), (esrt,) = (stage_options(stem, f"photos_{stage}") for stem, _ in STAGE4.values())
    starts = [opt["path"].pop("pretrain_network_g") for opt in (nalasr, esrt)]
    assert starts[0] == starts[1].replace("ESRT_x4", "NaLaSR_light_x4")
    for opt in (nalasr, esrt):
        del opt["name"], opt["network_g"]
    assert nalasr == esrt


def test_x2_stage3_is_the_x4_stage4_schedule_at_x2_after_its_photo_stage():
    x4, x2 = stage_options("NaLaSR/train_NaLaSR_light", "x4_photos_stage4", "x2_photos_stage3")
    assert x2["path"]["pretrain_network_g"] == "experiments/NaLaSR_light_x2_photos_ft/models/net_g_latest.pth"
    assert x2["scale"] == x2["network_g"]["upscale"] == 2
    assert x2["datasets"]["train"]["dataroot_lq"].endswith("X2_sub") and x2["datasets"]["val"]["dataroot_lq"].endswith(
        "x2"
    )
    assert x2["datasets"]["train"]["gt_size"] == 64  # the x4 runs' LR patch of 32 px
    assert {m["crop_border"] for m in x2["val"]["metrics"].values()} == {2}
    assert x2["train"] == x4["train"]  # the same schedule, budget and EMA
    ship = ship_script()
    chain = ship.RUNS["nalasr-light-x2"]
    assert chain[chain.index("options/train/NaLaSR/train_NaLaSR_light_x2_photos_ft.yml") + 1] == (
        "options/train/NaLaSR/train_NaLaSR_light_x2_photos_stage3.yml"
    )
    runs = re.search(r"^SR_RUNS := (.*?)\n(?!\t)", (REPO / "Makefile").read_text(), re.S | re.M).group(1).split()
    assert runs.index("NaLaSR/train_NaLaSR_light_x2_photos_stage3") > runs.index(
        "NaLaSR/train_NaLaSR_light_x2_photos_ft"
    )


@pytest.mark.parametrize("weights", list(STAGE4))
def test_stage5_starts_from_stage4s_run_with_its_command_for_another_checkout(weights):
    stage4, stage5 = assert_chained(weights, STAGE4[weights][0], "photos_stage4", "photos_stage5")
    assert stage5["datasets"] == stage4["datasets"]  # same data and held-out split: only the schedule differs
    assert stage5["network_g"] == stage4["network_g"]
    train = stage5["train"]
    milestones = train["scheduler"]["milestones"]
    assert milestones == sorted(milestones) and milestones[-1] < train["total_iter"] == stage5["val"]["val_freq"]


@pytest.mark.parametrize("weights", list(STAGE4))
def test_stage6_is_stage5s_data_at_the_papers_patch_from_stage5s_run(weights):
    stage5, stage6 = assert_chained(weights, STAGE4[weights][0], "photos_stage5", "photos_stage6")
    before, after = stage5["datasets"]["train"], stage6["datasets"]["train"]
    # LR patch 48 px (ESRT's paper) at half the batch: about the same LR pixels per step as stage 5's 32 px x 8.
    assert (after.pop("gt_size") // 4, after.pop("batch_size_per_gpu")) == (48, 4)
    del before["gt_size"], before["batch_size_per_gpu"]
    assert after == before and stage6["datasets"]["val"] == stage5["datasets"]["val"]
    assert stage6["network_g"] == stage5["network_g"]
    train = stage6["train"]
    milestones = train["scheduler"]["milestones"]
    assert milestones == sorted(milestones) and milestones[-1] < train["total_iter"] == stage6["val"]["val_freq"]


# Stages that repeat stage 6's recipe: (the stage before, the stage), each from the one before's run.
RECIPE_REPEATS = [
    ("photos_stage6", "photos_stage7"),
    ("photos_stage7", "photos_stage8"),
    ("photos_stage8", "photos_stage9"),
]
# The last stage each x4 network has shipped (a stage still training is not yet in the ship chain).
LAST_SHIPPED = {"nalasr-light-x4": "photos_stage9", "esrt-x4": "photos_stage9"}
# The stage each exports last: NaLaSR's stage 10 on the 490 photographs (issue 56) follows its stage 9.
LAST_EXPORTED = {"nalasr-light-x4": "sets", "esrt-x4": "photos_stage9"}


def shipped(weights: str, stage: str) -> bool:
    order = [after for _, after in RECIPE_REPEATS]
    return order.index(stage) <= order.index(LAST_SHIPPED[weights])


@pytest.mark.parametrize("weights", list(STAGE4))
@pytest.mark.parametrize(("before", "after"), RECIPE_REPEATS)
def test_a_repeated_stage_is_the_stage_befores_recipe_from_its_run(weights, before, after):
    stem = STAGE4[weights][0]
    if shipped(weights, after):
        first, second = assert_chained(weights, stem, before, after)
    else:  # still training: its options repeat the recipe from the stage before's run, not yet in the ship chain
        first, second = stage_options(stem, before, after)
        assert second["path"]["pretrain_network_g"] == f"experiments/{first['name']}/models/net_g_latest.pth"
        assert f"options/train/{stem}_{after}.yml" not in ship_script().RUNS[weights]
    assert second["datasets"] == first["datasets"] and second["network_g"] == first["network_g"]
    assert second["train"] == first["train"] and second["val"] == first["val"]  # the recipe unchanged


@pytest.mark.parametrize("weights", list(STAGE4))
def test_the_last_shipped_stage_is_the_one_exported(weights):
    assert ship_script().RUNS[weights][-1] == f"options/train/{STAGE4[weights][0]}_{LAST_EXPORTED[weights]}.yml"


def test_x2_stage4_is_the_x4_stage6_patch_and_rate_at_x2_after_stage3():
    x4, x2_before, x2 = (
        *stage_options("NaLaSR/train_NaLaSR_light", "x4_photos_stage6"),
        *stage_options("NaLaSR/train_NaLaSR_light", "x2_photos_stage3", "x2_photos_stage4"),
    )
    assert x2["path"]["pretrain_network_g"] == f"experiments/{x2_before['name']}/models/net_g_latest.pth"
    data = x2["datasets"]["train"]
    assert data["gt_size"] // 2 == x4["datasets"]["train"]["gt_size"] // 4 == 48  # the same LR patch
    assert data["batch_size_per_gpu"] == x4["datasets"]["train"]["batch_size_per_gpu"]
    assert data["dataroot_lq"].endswith("X2_sub") and x2["datasets"]["val"] == x2_before["datasets"]["val"]
    assert x2["network_g"] == x2_before["network_g"]
    train = x2["train"]
    assert train["optim_g"] == x4["train"]["optim_g"]  # the x4 stage 6's rate
    assert [m / train["total_iter"] for m in train["scheduler"]["milestones"]] == [
        m / x4["train"]["total_iter"] for m in x4["train"]["scheduler"]["milestones"]
    ]  # halved at the same fractions of a shorter stage
    assert train["total_iter"] == x2["val"]["val_freq"]
    ship = ship_script()
    assert ship.RUNS["nalasr-light-x2"][-2] == "options/train/NaLaSR/train_NaLaSR_light_x2_photos_stage4.yml"
    runs = re.search(r"^SR_RUNS := (.*?)\n(?!\t)", (REPO / "Makefile").read_text(), re.S | re.M).group(1).split()
    assert runs.index("NaLaSR/train_NaLaSR_light_x2_photos_stage4") > runs.index(
        "NaLaSR/train_NaLaSR_light_x2_photos_stage3"
    )


def test_x2_stage5_is_stage4_twice_as_long_from_its_end():
    before, after = stage_options("NaLaSR/train_NaLaSR_light", "x2_photos_stage4", "x2_photos_stage5")
    assert after["path"]["pretrain_network_g"] == f"experiments/{before['name']}/models/net_g_latest.pth"
    assert after["datasets"] == before["datasets"] and after["network_g"] == before["network_g"]
    train, train_before = after["train"], before["train"]
    assert train["total_iter"] == 2 * train_before["total_iter"] == after["val"]["val_freq"]
    assert train["optim_g"] == train_before["optim_g"]
    assert [m / train["total_iter"] for m in train["scheduler"]["milestones"]] == [
        m / train_before["total_iter"] for m in train_before["scheduler"]["milestones"]
    ]  # halved at the same fractions
    ship = ship_script()
    assert ship.RUNS["nalasr-light-x2"][-1] == "options/train/NaLaSR/train_NaLaSR_light_x2_photos_stage5.yml"
    runs = re.search(r"^SR_RUNS := (.*?)\n(?!\t)", (REPO / "Makefile").read_text(), re.S | re.M).group(1).split()
    assert runs.index("NaLaSR/train_NaLaSR_light_x2_photos_stage5") > runs.index(
        "NaLaSR/train_NaLaSR_light_x2_photos_stage4"
    )


def training_model(tmp_path: Path, **train):
    """A tiny NaLaSR UpscalerSRModel set up for training with ``train``'s options (and Adam, L1, EMA)."""
    from basicsr.models import build_model

    opt = {"name": "t", "model_type": "UpscalerSRModel", "num_gpu": 0, "is_train": True, "dist": False, "scale": 4}
    opt["path"] = {"pretrain_network_g": None, "experiments_root": str(tmp_path), "models": str(tmp_path)}
    opt["train"] = {
        "ema_decay": 0.5,
        "optim_g": {"type": "Adam", "lr": 1e-3},
        "scheduler": {"type": "MultiStepLR", "milestones": [100], "gamma": 0.5},
        "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0},
        **train,
    }
    return build_model({**opt, "network_g": TINY})


@pytest.mark.parametrize(("layout", "precision"), [(False, "fp32"), (True, "fp32"), (True, "bf16")])
def test_training_options_set_the_layout_and_the_forwards_precision(tmp_path, layout, precision):
    """``train: channels_last`` and ``train: autocast`` (nala-bench train-speed's variants): the batch and the
    weights in that layout, the forward in that precision, the weights, their gradients and the EMA in fp32."""
    torch.manual_seed(0)
    model = training_model(tmp_path, channels_last=layout, autocast=precision)
    before = {k: v.clone() for k, v in model.net_g.state_dict().items()}
    ema_before = {k: v.clone() for k, v in model.net_g_ema.state_dict().items()}
    model.feed_data({"lq": torch.rand(2, 3, 12, 12), "gt": torch.rand(2, 3, 48, 48)})
    fmt = torch.channels_last if layout else torch.contiguous_format
    assert model.lq.is_contiguous(memory_format=fmt) and model.gt.is_contiguous(memory_format=fmt)
    model.optimize_parameters(1)
    assert model.output.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert "forward" not in vars(model.net_g)  # the step's autocast wrapper is gone after it
    for name, value in model.net_g.state_dict().items():
        assert value.dtype == torch.float32 and torch.isfinite(value).all(), name
    conv = model.net_g.conv_first.weight if hasattr(model.net_g, "conv_first") else next(model.net_g.parameters())
    assert conv.grad is not None and conv.grad.dtype == torch.float32
    changed = [k for k, v in model.net_g.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and any(not torch.equal(v, ema_before[k]) for k, v in model.net_g_ema.state_dict().items())
    weight4d = [p for p in model.net_g.parameters() if p.dim() == 4 and p.shape[-1] > 1]
    assert all(p.is_contiguous(memory_format=fmt) for p in weight4d)


def test_training_autocast_auto_follows_the_cpu_and_a_typo_is_refused(tmp_path):
    from nala_gen.devices import cpu_native_bf16
    from nala_gen.sr.basicsr.model import training_precision

    native = cpu_native_bf16() or torch.cuda.is_available()
    assert training_precision("auto") == ("bf16" if native else "fp32")
    assert training_precision("fp32") == "fp32" and training_precision("bf16") == "bf16"
    with pytest.raises(ValueError, match="autocast must be fp32, bf16 or auto, not 'fp16'"):
        training_model(tmp_path, autocast="fp16")


def test_the_sets_stage_follows_stage9_and_ships_only_on_better_set5_and_urban100():
    """Stage 10 (issue 56) trains on the 490 photographs from stage 9's run and is validated on Set5 and Urban100,
    which its shipping must improve."""
    ship = ship_script()
    stem = "NaLaSR/train_NaLaSR_light_x4"
    if f"options/train/{stem}_sets.yml" in ship.RUNS["nalasr-light-x4"]:
        _, sets = assert_chained("nalasr-light-x4", stem, "photos_stage9", "sets")
    else:  # still training: it starts from stage 9's run, not yet in the ship chain
        stage9, sets = stage_options(stem, "photos_stage9", "sets")
        assert sets["path"]["pretrain_network_g"] == f"experiments/{stage9['name']}/models/net_g_latest.pth"
    assert sets["datasets"]["train"]["name"] in ship.DATA
    assert ship.validated_on(sets) == "Set5 and Urban100" and set(ship.MUST_IMPROVE) == {"Set5", "Urban100"}
    assert sets["train"]["ema_decay"] > 0  # an interim save ships its EMA (the stage starts from trained weights)
