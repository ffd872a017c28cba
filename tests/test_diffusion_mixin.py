"""The checks diffusers' own PipelineTesterMixin makes on its pipelines, written for NaLaDiT and NaLaSiT, and those
its AttentionTesterMixin makes on a model's attention processors, written for NaLaDiT.

Tiny random pipelines, each in pixel space and with a tiny VAE: return_dict / tuple equivalence, batch vs single
generation, num_images_per_prompt shapes, dtype casting of every component, progress-bar control, save/load round
trips (locally, with the optional VAE absent or present, and with a component replaced at load time). Callbacks,
latents and the signature are covered in test_diffusion_call.py.

Processors: diffusers' ``AttnProcessor()`` / ``AttnProcessor2_0()`` set on NaLaDiT (one for all, or a dict, also
mixed with NaLa processors) are listed back as set and run the softmax kernel in the block; others are refused.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler, DiffusionPipeline, FlowMatchEulerDiscreteScheduler
from diffusers.models.attention_processor import (
    AttnProcessor,
    AttnProcessor2_0,
    FusedAttnProcessor2_0,
    JointAttnProcessor2_0,
    XFormersAttnProcessor,
)
from test_diffusion import randomize, tiny_vae

from nala_gen.diffusion import NaLaAttnProcessor, NaLaDiTPipeline, NaLaDiTTransformer2DModel
from nala_gen.diffusion.processors import NaLaJointAttnProcessor

LABELS = {0: "a", 1: "b", 2: "c"}


@pytest.fixture(scope="module", params=["dit-pixels", "dit-vae", "sit-pixels", "sit-vae"])
def pipe(request):
    family, space = request.param.split("-")
    torch.manual_seed(0)
    channels = 4 if space == "vae" else 3
    model = NaLaDiTTransformer2DModel.from_size(
        "tiny", sample_size=8, in_channels=channels, num_classes=len(LABELS), learn_sigma=False
    )
    model = randomize(model).eval()  # zero-initialised outputs would make every comparison trivially equal
    scheduler = DDIMScheduler() if family == "dit" else FlowMatchEulerDiscreteScheduler()
    pipe = NaLaDiTPipeline(model, scheduler, vae=tiny_vae() if space == "vae" else None, id2label=LABELS)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call(pipe, labels, seed=0, **kwargs):
    kwargs = {"num_inference_steps": 3, "output_type": "pt", "guidance_scale": 2.0, **kwargs}
    if "generator" not in kwargs:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    return pipe(labels, **kwargs)


def test_dict_and_tuple_outputs_are_the_same(pipe):
    as_dict = call(pipe, [0, 1]).images
    (as_tuple,) = call(pipe, [0, 1], return_dict=False)
    torch.testing.assert_close(as_tuple, as_dict, atol=0, rtol=0)
    assert as_dict.abs().sum() > 0  # not a trivially equal blank


def test_a_batch_equals_its_images_made_one_by_one(pipe):
    generators = [torch.Generator().manual_seed(s) for s in (11, 12, 13)]
    batch = call(pipe, [0, 1, 2], generator=generators).images
    singles = [
        call(pipe, [label], generator=torch.Generator().manual_seed(s)).images
        for label, s in zip((0, 1, 2), (11, 12, 13))
    ]
    torch.testing.assert_close(batch, torch.cat(singles), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(singles[0], singles[1])  # different labels and noise give different images


@pytest.mark.parametrize("per_label", [1, 3])
def test_num_images_per_prompt_shapes(pipe, per_label):
    images = call(pipe, [0, 2], num_images_per_prompt=per_label).images
    side = 8 * pipe.vae_scale_factor
    assert images.shape == (2 * per_label, 3, side, side)
    latents = call(pipe, [0, 2], num_images_per_prompt=per_label, output_type="latent").images
    assert latents.shape == (2 * per_label, pipe.transformer.config.in_channels, 8, 8)


def test_casting_the_pipeline_casts_every_component_and_it_still_generates(pipe):
    cast = NaLaDiTPipeline(pipe.transformer, pipe.scheduler, vae=pipe.vae, id2label=LABELS)
    cast.set_progress_bar_config(disable=True)
    try:
        cast.to(torch.bfloat16)
        dtypes = {name: c.dtype for name, c in cast.components.items() if isinstance(c, torch.nn.Module)}
        assert dtypes and set(dtypes.values()) == {torch.bfloat16}, dtypes
        images = call(cast, [0, 1]).images
        assert torch.isfinite(images.float()).all() and images.shape[0] == 2
        reference = call(pipe.to(torch.float32), [0, 1]).images  # shared modules: back to fp32 for the reference
        cast.to(torch.bfloat16)
        assert (call(cast, [0, 1]).images.float() - reference).abs().mean() < 0.1  # bf16 rounding, same picture
    finally:
        pipe.to(torch.float32)


def test_the_progress_bar_follows_its_config(pipe, capsys):
    pipe.set_progress_bar_config(disable=False)
    try:
        call(pipe, [0], num_inference_steps=2)
        shown = capsys.readouterr().err
    finally:
        pipe.set_progress_bar_config(disable=True)
    call(pipe, [0], num_inference_steps=2)
    hidden = capsys.readouterr().err
    assert "2/2" in shown and hidden == ""


def test_save_load_round_trip_keeps_the_optional_vae_as_it_was(pipe, tmp_path):
    pipe.save_pretrained(tmp_path / "pipe")
    loaded = NaLaDiTPipeline.from_pretrained(tmp_path / "pipe")
    loaded.set_progress_bar_config(disable=True)
    assert (loaded.vae is None) == (pipe.vae is None)
    assert type(loaded.scheduler) is type(pipe.scheduler)
    torch.testing.assert_close(call(loaded, [0, 2]).images, call(pipe, [0, 2]).images, atol=0, rtol=0)
    generic = DiffusionPipeline.from_pretrained(tmp_path / "pipe", trust_remote_code=True)
    generic.set_progress_bar_config(disable=True)
    torch.testing.assert_close(call(generic, [1]).images, call(pipe, [1]).images, atol=0, rtol=0)


def test_a_component_passed_at_load_time_replaces_the_saved_one(pipe, tmp_path):
    pipe.save_pretrained(tmp_path / "pipe")
    other = DDIMScheduler(num_train_timesteps=500) if isinstance(pipe.scheduler, DDIMScheduler) else None
    if other is None:
        other = FlowMatchEulerDiscreteScheduler(shift=3.0)
    loaded = NaLaDiTPipeline.from_pretrained(tmp_path / "pipe", scheduler=other)
    assert loaded.scheduler is other
    loaded.set_progress_bar_config(disable=True)
    assert not torch.allclose(call(loaded, [0]).images, call(pipe, [0]).images)  # the new schedule is used


# ----------------------------------------------------------------------- diffusers' processors on the model


def tiny_model(**parts) -> NaLaDiTTransformer2DModel:
    torch.manual_seed(0)
    model = NaLaDiTTransformer2DModel.from_size(
        "tiny", sample_size=8, in_channels=3, num_classes=len(LABELS), learn_sigma=False, **parts
    )
    return randomize(model).eval()


def forward(model) -> torch.Tensor:
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(x, timestep=torch.tensor([10.0, 600.0]), class_labels=torch.tensor([0, 2])).sample


def readout_kernel(model) -> str:
    """The kernel(s) a pipeline call reports having run."""
    pipe = NaLaDiTPipeline(model, DDIMScheduler())
    pipe.set_progress_bar_config(disable=True)
    pipe([0], num_inference_steps=1, output_type="pt")
    return pipe.last_readout["kernel"]


@pytest.mark.parametrize("plain", [AttnProcessor, AttnProcessor2_0])
@pytest.mark.parametrize("parts", [{}, {"rope": False, "lepe": False, "gate": False}], ids=["block", "no-parts"])
def test_diffusers_plain_processors_run_the_softmax_kernel_inside_the_block(plain, parts):
    model = tiny_model(**parts)
    nala = forward(model)
    model.set_attn_processor(NaLaAttnProcessor("softmax"))
    softmax = forward(model)

    # diffusers' test_attention_processor_dict: a dict of AttnProcessor() keyed like attn_processors
    keys = list(model.attn_processors)
    model.set_attn_processor({key: plain() for key in keys})
    assert list(model.attn_processors) == keys
    assert all(type(p) is plain for p in model.attn_processors.values())  # listed back as set, not replaced
    torch.testing.assert_close(forward(model), softmax, atol=0, rtol=0)  # softmax, the block's parts kept
    assert not torch.allclose(softmax, nala, atol=1e-4)
    assert readout_kernel(model) == "softmax"

    # diffusers' test_get_set_processor, on the modules that hold a processor
    for module in (m for m in model.modules() if hasattr(m, "get_processor")):
        one = plain()
        module.set_processor(one)
        assert module.get_processor() is one
    torch.testing.assert_close(forward(model), softmax, atol=0, rtol=0)


def test_a_processor_dict_may_mix_diffusers_and_nala_processors():
    model = tiny_model()
    first, second = model.attn_processors
    model.set_attn_processor({first: AttnProcessor2_0(), second: NaLaAttnProcessor("relu")})
    assert [type(p) for p in model.attn_processors.values()] == [AttnProcessor2_0, NaLaAttnProcessor]
    mixed = forward(model)
    assert readout_kernel(model) == "relu+softmax"

    model.set_attn_processor({first: NaLaAttnProcessor("softmax"), second: NaLaAttnProcessor("relu")})
    torch.testing.assert_close(mixed, forward(model), atol=0, rtol=0)  # each block runs its own kernel
    model.set_attn_processor(AttnProcessor())
    assert not torch.allclose(mixed, forward(model), atol=1e-4)  # the relu block is not softmax
    model.set_attn_processor(NaLaAttnProcessor("relu"))
    assert not torch.allclose(mixed, forward(model), atol=1e-4)  # nor the softmax block relu


class CustomProcessor(AttnProcessor2_0):
    """A user's subclass: it may compute anything, so it is not taken as plain softmax."""


@pytest.mark.parametrize(
    "refused",
    [JointAttnProcessor2_0, FusedAttnProcessor2_0, XFormersAttnProcessor, CustomProcessor, NaLaJointAttnProcessor],
)
def test_a_processor_the_block_cannot_run_is_refused_and_no_block_changes(refused):
    model = tiny_model()
    before = model.attn_processors
    output = forward(model)
    with pytest.raises(TypeError, match=f"not {refused.__name__}$"):
        model.set_attn_processor(refused())
    first, second = before
    with pytest.raises(TypeError, match=f"AttnProcessor2_0 .* not {refused.__name__}$"):
        model.set_attn_processor({first: AttnProcessor(), second: refused()})  # the first one is fine
    assert model.attn_processors == before  # the very same processors: nothing was set
    with pytest.raises(TypeError, match=refused.__name__):
        model.blocks[0].attn.set_processor(refused())
    assert model.attn_processors == before
    torch.testing.assert_close(forward(model), output, atol=0, rtol=0)


def test_diffusers_processor_count_and_fusion_checks_hold():
    model = tiny_model()
    output = forward(model)
    # diffusers' test_attention_processor_count_mismatch_raises_error
    with pytest.raises(ValueError, match="number of processors"):
        model.set_attn_processor({next(iter(model.attn_processors)): AttnProcessor()})
    # diffusers' test_fuse_unfuse_qkv_projections: the block's q/k/v/g projection is fused already; nothing changes
    model.fuse_qkv_projections()
    torch.testing.assert_close(forward(model), output, atol=0, rtol=0)
    model.unfuse_qkv_projections()
    torch.testing.assert_close(forward(model), output, atol=0, rtol=0)
