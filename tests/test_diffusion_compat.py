"""NaLaDiT as diffusers users drive a transformer: one name for the kernel (older names still load), layerwise
casting, and attention processors (``attn_processors`` / ``set_attn_processor``). Tiny models, CPU."""

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from diffusers import DDIMScheduler  # noqa: E402
from diffusers.models.attention_processor import AttnProcessor2_0  # noqa: E402

from nala_gen.attention import NaLaAttention  # noqa: E402
from nala_gen.diffusion import NaLaAttnProcessor, NaLaDiTPipeline, NaLaDiTTransformer2DModel  # noqa: E402
from nala_gen.diffusion.train_config import config_from_dict, load_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OLD_KEYS = ("attention_kernel", "attention_kernel_options", "attention_type")
DEPRECATED = "is deprecated; it is called"  # the words of the warning an old key name gives


def tiny(seed: int = 0, **overrides) -> NaLaDiTTransformer2DModel:
    """A tiny NaLaDiT with every parameter perturbed (adaLN-Zero would otherwise make the output zero)."""
    torch.manual_seed(seed)
    config = {"sample_size": 8, "in_channels": 4, "num_classes": 10, "learn_sigma": False, **overrides}
    model = NaLaDiTTransformer2DModel.from_size("tiny", **config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval()


def batch(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 12, generator=gen).to(dtype)
    return {"hidden_states": x, "timestep": torch.tensor([10.0, 700.0]), "class_labels": torch.tensor([3, 10])}


def forward(model, dtype=torch.float32) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch(dtype)).sample


def no_kernel_deprecation(caught) -> bool:
    return not [w for w in caught if DEPRECATED in str(w.message)]


# ------------------------------------------------------------------------------- one name for the kernel


DIFFUSION_CARDS = sorted(p.stem for p in (REPO / "weights").glob("*.json") if '"diffusion"' in p.read_text())


@pytest.mark.parametrize("name", DIFFUSION_CARDS)
def test_every_shipped_diffusion_folder_loads_under_the_one_kernel_name(name):
    from nala_gen.diffusion.loading import load_pipeline
    from nala_gen.weights import resolve

    card = resolve(name)
    config = json.loads((card.payload / "transformer" / "config.json").read_text())
    for written in (card.config, config):
        assert "kernel" in written and "kernel_options" in written and not set(OLD_KEYS) & set(written)
    assert {k: v for k, v in config.items() if not k.startswith("_")} == card.config
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe, _ = load_pipeline(name)  # verifies the folder's sha256 against the card
    assert no_kernel_deprecation(caught)
    assert pipe.transformer.config.kernel == card.config["kernel"]
    assert {b.attn.kernel for b in pipe.transformer.blocks} == {card.config["kernel"]}


@pytest.mark.parametrize("option", sorted((REPO / "options" / "diffusion").glob("*.yml")), ids=lambda p: p.stem)
def test_every_diffusion_option_file_loads_under_the_one_kernel_name(option):
    import yaml

    model = yaml.safe_load(option.read_text())["model"]
    assert "kernel" in model and not set(OLD_KEYS) & set(model), option
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(option)
    assert no_kernel_deprecation(caught)
    fields = dict(config.model)
    with torch.device("meta"):
        net = NaLaDiTTransformer2DModel.from_size(fields.pop("size", "tiny"), **fields)
    assert {m.kernel for m in net.modules() if isinstance(m, NaLaAttention)} == {model["kernel"]}


@pytest.mark.parametrize(
    "old",
    [
        {"attention_kernel": "nala_split", "attention_kernel_options": {"lam": 2.0}},  # names of 2026-11 to 12-04
        {"attention_type": "nala_split", "attention_kernel_options": {"lam": 2.0}},  # the first name
    ],
    ids=["attention_kernel", "attention_type"],
)
def test_a_folder_with_the_old_keys_loads_with_a_warning_the_same_and_saves_the_new_ones(tmp_path, old):
    model = tiny(kernel="nala_split", kernel_options={"lam": 2.0})
    pipe = NaLaDiTPipeline(model, DDIMScheduler(), id2label={i: str(i) for i in range(10)})
    pipe.set_progress_bar_config(disable=True)
    pipe.save_pretrained(tmp_path / "old")
    path = tmp_path / "old" / "transformer" / "config.json"
    config = json.loads(path.read_text())
    assert config["kernel"] == "nala_split" and not set(OLD_KEYS) & set(config)  # saving writes today's names
    del config["kernel"], config["kernel_options"]
    path.write_text(json.dumps({**config, **old}))

    for name in old:
        with pytest.warns(DeprecationWarning, match=f"{name}= {DEPRECATED}"):
            NaLaDiTTransformer2DModel.from_pretrained(tmp_path / "old" / "transformer")
    with pytest.warns(DeprecationWarning):
        loaded = NaLaDiTPipeline.from_pretrained(tmp_path / "old")
    transformer = loaded.transformer.eval()
    assert transformer.config.kernel == "nala_split" and transformer.config.kernel_options == {"lam": 2.0}
    assert not set(OLD_KEYS) & set(transformer.config)
    torch.testing.assert_close(forward(transformer), forward(model), atol=0, rtol=0)
    again = NaLaDiTTransformer2DModel.from_config(transformer.config)  # an old name's value is kept, not defaulted
    assert again.config.kernel == "nala_split" and again.blocks[0].attn.kernel_options == {"lam": 2.0}

    loaded.save_pretrained(tmp_path / "new")
    saved = json.loads((tmp_path / "new" / "transformer" / "config.json").read_text())
    assert saved["kernel"] == "nala_split" and saved["kernel_options"] == {"lam": 2.0}
    assert not set(OLD_KEYS) & set(saved)
    with pytest.raises(ValueError, match="disagree"):
        NaLaDiTTransformer2DModel.from_size("tiny", kernel="relu", attention_kernel="softmax")


def test_export_writes_an_old_folder_under_the_new_names_with_a_verified_card(tmp_path):
    from nala_gen.diffusion.cli import export_pipeline
    from nala_gen.weights import read_card, verify

    NaLaDiTPipeline(tiny(kernel="softmax"), DDIMScheduler()).save_pretrained(tmp_path / "run")
    path = tmp_path / "run" / "transformer" / "config.json"
    config = json.loads(path.read_text())
    config["attention_kernel"], config["attention_kernel_options"] = config.pop("kernel"), config.pop("kernel_options")
    path.write_text(json.dumps(config))
    with pytest.warns(DeprecationWarning):
        card_path = export_pipeline(tmp_path / "run", "old-softmax", tmp_path / "weights")
    card = read_card(card_path)
    verify(card)
    exported = json.loads((card.payload / "transformer" / "config.json").read_text())
    for written in (card.config, exported):
        assert written["kernel"] == "softmax" and "kernel_options" in written and not set(OLD_KEYS) & set(written)


TRAIN = {"output_dir": "unused", "model": {"size": "tiny", "depth": 1}, "data": {"image_size": 8}}


def test_a_training_config_with_the_old_keys_loads_with_a_warning_under_the_new_names():
    old_model = {**TRAIN["model"], "attention_kernel": "softmax", "attention_kernel_options": {}}
    with pytest.warns(DeprecationWarning, match="attention_kernel= is deprecated"):
        config = config_from_dict({**TRAIN, "model": old_model})
    assert config.model == {"size": "tiny", "depth": 1, "kernel": "softmax", "kernel_options": {}}
    assert not set(OLD_KEYS) & set(config.as_dict()["model"])  # what the run's config.yml records
    with pytest.warns(DeprecationWarning):  # an old file, a new override: the override wins
        assert config_from_dict({**TRAIN, "model": old_model}, ["model.kernel=relu"]).model["kernel"] == "relu"
    with pytest.warns(DeprecationWarning, match="attention_type= is deprecated"):  # an old override
        assert config_from_dict(TRAIN, ["model.attention_type=elu1"]).model["kernel"] == "elu1"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert config_from_dict(TRAIN, ["model.kernel=relu"]).model["kernel"] == "relu"
    with pytest.raises(ValueError, match="disagree"):
        config_from_dict({**TRAIN, "model": {**TRAIN["model"], "kernel": "relu", "attention_kernel": "softmax"}})


# ------------------------------------------------------------------------------------- layerwise casting


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    """diffusers' ``numpy_cosine_similarity_distance``: 1 - cosine similarity of the flattened arrays."""
    return float(1.0 - np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize(
    "storage, compute, tolerance",
    [
        (torch.float16, torch.float32, 1e-5),
        (torch.float8_e4m3fn, torch.float32, 2e-3),
        (torch.float8_e5m2, torch.float32, 1e-2),
        (torch.float8_e4m3fn, torch.bfloat16, 2e-3),
    ],
    ids=["fp16/fp32", "e4m3/fp32", "e5m2/fp32", "e4m3/bf16"],
)
def test_layerwise_casting_inference_stays_close_to_the_plain_run(storage, compute, tolerance):
    """diffusers' ``test_layerwise_casting_inference``: weights stored in ``storage``, cast to ``compute`` for each
    layer's call; every supported layer not skipped holds the storage dtype; the output is close to the plain run.
    diffusers asks for a cosine distance below 1; ours, measured on seeds 0-2: at most 1.2e-7 (fp16), 8.4e-4
    (e4m3), 2.5e-3 (e5m2) and 8.4e-4 (e4m3 with bf16 compute), bounded here at 2-80x that."""
    from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    base = forward(tiny()).flatten().numpy()
    model = tiny().to(compute)
    model.enable_layerwise_casting(storage_dtype=storage, compute_dtype=compute)
    patterns = DEFAULT_SKIP_MODULES_PATTERN + tuple(model._skip_layerwise_casting_patterns)
    stored = []
    for name, module in model.named_modules():
        if isinstance(module, _GO_LC_SUPPORTED_PYTORCH_LAYERS):
            expected = compute if any(re.search(p, name) for p in patterns) else storage
            assert module.weight.dtype == expected, name
            assert getattr(module, "bias", None) is None or module.bias.dtype == expected, name
            stored += [name] if expected == storage else []
    assert {"blocks.0.attn.qkvg", "blocks.0.attn.lepe", "blocks.0.attn.proj"} <= set(stored)
    output = forward(model, compute).float().flatten().numpy()
    assert np.isfinite(output).all()
    distance = cosine_distance(base, output)
    assert distance < 1.0 and distance < tolerance, distance
    assert model.blocks[0].attn.qkvg.weight.dtype == storage  # back in storage after the call


@pytest.mark.parametrize("storage", [torch.float16, torch.float8_e4m3fn], ids=["fp16", "e4m3"])
def test_layerwise_casting_training_runs(storage):
    """diffusers' ``test_layerwise_casting_training`` (fp32 compute; bf16 compute is skipped on CPU there too)."""
    model = tiny().to(torch.float32)
    model.enable_layerwise_casting(storage_dtype=storage, compute_dtype=torch.float32)
    model.train()
    with torch.amp.autocast(device_type="cpu"):
        out = model(**batch()).sample
        loss = torch.nn.functional.mse_loss(out.float(), torch.randn(out.shape))
    loss.backward()
    assert torch.isfinite(loss)


def test_layerwise_casting_in_a_pipeline_gives_finite_images():
    """diffusers' pipeline ``test_layerwise_casting_inference``: bf16 pipeline, fp8 transformer storage."""
    pipe = NaLaDiTPipeline(tiny(in_channels=3), DDIMScheduler(), id2label={i: str(i) for i in range(10)})
    pipe.set_progress_bar_config(disable=True)
    pipe.to(dtype=torch.bfloat16)
    pipe.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    images = pipe([1, 2], num_inference_steps=2, output_type="pt", generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (2, 3, 8, 8) and torch.isfinite(images.float()).all()


# -------------------------------------------------------------------------------------- attention processors


def test_attn_processors_list_one_nala_processor_per_block():
    model = tiny(kernel="nala_split", kernel_options={"lam": 2.0})
    processors = model.attn_processors
    assert list(processors) == [f"blocks.{i}.attn.processor" for i in range(model.config.depth)]
    for processor in processors.values():
        assert isinstance(processor, NaLaAttnProcessor)
        assert processor.kernel == "nala_split" and processor.kernel_options == {"lam": 2.0}
    assert "processor" not in "".join(model.state_dict())  # processors hold no weights


@pytest.mark.parametrize("rope, lepe, gate", [(True, True, True), (False, False, False)], ids=["block", "plain"])
def test_set_attn_processor_swaps_the_kernel_and_swaps_back(rope, lepe, gate):
    parts = {"rope": rope, "lepe": lepe, "gate": gate}
    model = tiny(**parts)
    nala = forward(model)
    original = model.attn_processors

    model.set_attn_processor(NaLaAttnProcessor("softmax"))  # one instance for every layer
    assert {p.kernel for p in model.attn_processors.values()} == {"softmax"}
    swapped = forward(model)
    assert not torch.allclose(swapped, nala, atol=1e-4)
    twin = tiny(kernel="softmax", **parts)  # the config's softmax twin, with the same weights
    twin.load_state_dict(model.state_dict())
    torch.testing.assert_close(swapped, forward(twin), atol=1e-6, rtol=1e-5)

    model.set_attn_processor(dict(original))  # a dict keyed like attn_processors
    assert model.attn_processors == original
    torch.testing.assert_close(forward(model), nala, atol=0, rtol=0)
    with pytest.raises(ValueError, match="number of attention layers"):
        model.set_attn_processor({"blocks.0.attn.processor": NaLaAttnProcessor("relu")})
    model.set_attn_processor(AttnProcessor2_0())  # diffusers' plain processor: the softmax kernel, in the block
    torch.testing.assert_close(forward(model), swapped, atol=0, rtol=0)
