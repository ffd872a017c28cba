"""The pipeline call as diffusers' newer pipelines (PixArt, SANA) take it."""

import inspect

import pytest
import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler
from diffusers.utils.torch_utils import randn_tensor
from test_diffusion import randomize

from nala_gen.diffusion import NaLaDiTPipeline, NaLaDiTTransformer2DModel


@pytest.fixture(scope="module", params=["dit", "sit"])
def pipe(request):
    torch.manual_seed(0)
    model = NaLaDiTTransformer2DModel.from_size("tiny", sample_size=8, in_channels=3, num_classes=4, learn_sigma=False)
    scheduler = DDIMScheduler() if request.param == "dit" else FlowMatchEulerDiscreteScheduler()
    pipe = NaLaDiTPipeline(model, scheduler, id2label={0: "a", 1: "b", 2: "c", 3: "d"})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, labels, **kwargs):
    kwargs.setdefault("num_inference_steps", 3)
    kwargs.setdefault("output_type", "pt")
    return pipe(labels, **kwargs).images


def seeded(seed=0):
    return torch.Generator().manual_seed(seed)


def test_latents_replace_the_drawn_noise(pipe):
    noise = randn_tensor((2, 3, 8, 8), generator=seeded(), dtype=torch.float32)
    torch.testing.assert_close(run(pipe, [0, 1], latents=noise), run(pipe, [0, 1], generator=seeded()))
    with pytest.raises(ValueError, match=r"latents must have shape \(2, 3, 8, 8\)"):
        run(pipe, [0, 1], latents=noise[:1])


def test_num_images_per_prompt_keeps_a_labels_images_together(pipe):
    noise = randn_tensor((4, 3, 8, 8), generator=seeded(), dtype=torch.float32)
    grouped = run(pipe, ["a", "b"], num_images_per_prompt=2, latents=noise)
    assert grouped.shape == (4, 3, 8, 8)
    torch.testing.assert_close(grouped, run(pipe, [0, 0, 1, 1], latents=noise))
    with pytest.raises(ValueError, match="num_images_per_prompt"):
        run(pipe, [0], num_images_per_prompt=0)


def test_nested_and_mixed_labels_are_flattened(pipe):
    assert run(pipe, [[0, "b"], 2, torch.tensor([[3]])], generator=seeded()).shape == (4, 3, 8, 8)


def test_callbacks_see_and_change_the_latents_and_can_interrupt(pipe):
    seen = []

    def zero_at_the_end(p, step, timestep, kwargs):
        seen.append((step, tuple(kwargs["latents"].shape)))
        return {"latents": torch.zeros_like(kwargs["latents"])} if step == p.num_timesteps - 1 else {}

    images = run(pipe, [0, 1], generator=seeded(), callback_on_step_end=zero_at_the_end)
    assert seen == [(0, (2, 3, 8, 8)), (1, (2, 3, 8, 8)), (2, (2, 3, 8, 8))]
    torch.testing.assert_close(images, torch.full_like(images, 0.5))  # zero latents decode to mid-grey

    def stop(p, step, timestep, kwargs):
        p._interrupt = True
        return {}

    run(pipe, [0], generator=seeded(), num_inference_steps=5, callback_on_step_end=stop)
    assert pipe.last_readout["model_evals"] == 1 and pipe.num_timesteps == 5
    with pytest.raises(ValueError, match="callback_on_step_end_tensor_inputs"):
        run(pipe, [0], callback_on_step_end=stop, callback_on_step_end_tensor_inputs=["noise_pred"])


@pytest.fixture(scope="module", params=["dit", "sit"])
def random_pipe(request):
    """A pipeline whose transformer is perturbed: a fresh one outputs zeros (adaLN-Zero), and guidance then changes
    nothing."""
    torch.manual_seed(0)
    model = NaLaDiTTransformer2DModel.from_size("tiny", sample_size=8, in_channels=3, num_classes=4, learn_sigma=False)
    scheduler = DDIMScheduler() if request.param == "dit" else FlowMatchEulerDiscreteScheduler()
    pipe = NaLaDiTPipeline(randomize(model).eval(), scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def batches_run(pipe, labels, **kwargs) -> tuple[torch.Tensor, list[int]]:
    """The images and the batch size of each transformer evaluation."""
    sizes = []
    hook = pipe.transformer.register_forward_pre_hook(lambda module, args: sizes.append(args[0].shape[0]))
    try:
        return run(pipe, labels, generator=seeded(), num_inference_steps=4, **kwargs), sizes
    finally:
        hook.remove()


def test_a_callback_that_changes_guidance_steers_the_remaining_steps(random_pipe):
    pipe = random_pipe
    guided, sizes = batches_run(pipe, [0, 1], guidance_scale=4.0)
    assert sizes == [4, 4, 4, 4]  # the null class alongside
    unguided, sizes = batches_run(pipe, [0, 1], guidance_scale=1.0)
    assert sizes == [2, 2, 2, 2] and not torch.allclose(guided, unguided, atol=1e-3)

    def cut_off(p, step, timestep, kwargs):  # diffusers' CFG cut-off: guidance off after the first step
        if step == 0:
            p._guidance_scale = 0.0
        return kwargs

    cut, sizes = batches_run(pipe, [0, 1], guidance_scale=4.0, callback_on_step_end=cut_off)
    assert sizes == [4, 2, 2, 2]  # the null class is no longer run
    assert not torch.allclose(cut, guided, atol=1e-3) and not torch.allclose(cut, unguided, atol=1e-3)
    assert pipe.guidance_scale == 0.0 and not pipe.do_classifier_free_guidance
    assert pipe.last_readout["batch"] == 4  # the largest batch the transformer ran

    def turn_on(p, step, timestep, kwargs):
        p._guidance_scale = 4.0
        return kwargs

    late, sizes = batches_run(pipe, [0, 1], guidance_scale=1.0, callback_on_step_end=turn_on)
    assert sizes == [2, 4, 4, 4]
    assert not torch.allclose(late, unguided, atol=1e-3) and not torch.allclose(late, guided, atol=1e-3)


def test_diffusers_callback_cfg_increases_guidance_every_step(random_pipe):
    pipe = random_pipe

    def increase(p, step, timestep, kwargs):  # diffusers' test_callback_cfg
        p._guidance_scale += 1.0
        return kwargs

    inputs = {"guidance_scale": 2.0, "callback_on_step_end_tensor_inputs": pipe._callback_tensor_inputs}
    increased, _ = batches_run(pipe, [0, 1], callback_on_step_end=increase, **inputs)
    assert pipe.guidance_scale == 2.0 + pipe.num_timesteps
    constant, _ = batches_run(pipe, [0, 1], guidance_scale=2.0)
    assert not torch.allclose(increased, constant, atol=1e-3)  # the scales 3, 4, 5 were used, not 2


def test_latent_output_is_what_the_other_outputs_decode(pipe):
    latent = run(pipe, [0, 1], generator=seeded(), output_type="latent")
    assert latent.shape == (2, 3, 8, 8)
    torch.testing.assert_close(run(pipe, [0, 1], generator=seeded()), (latent / 2 + 0.5).clamp(0, 1))


def test_the_signature_has_diffusers_optional_parameters(pipe):
    params = inspect.signature(type(pipe).__call__).parameters
    for name in ("num_inference_steps", "guidance_scale", "num_images_per_prompt", "generator", "latents"):
        assert name in params
    for name in ("output_type", "return_dict", "callback_on_step_end", "callback_on_step_end_tensor_inputs"):
        assert name in params
    assert params["num_images_per_prompt"].default == 1 and params["output_type"].default == "pil"


def tiny(prediction_type, scheduler):
    torch.manual_seed(0)
    model = NaLaDiTTransformer2DModel.from_size(
        "tiny", sample_size=8, in_channels=3, num_classes=4, learn_sigma=False, prediction_type=prediction_type
    )
    pipe = NaLaDiTPipeline(model, scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_a_scheduler_of_the_other_objective_is_refused_naming_those_that_fit():
    with pytest.raises(ValueError, match="trained for flow matching .* use FlowMatchEulerDiscreteScheduler"):
        run(tiny("flow", DDIMScheduler()), [0])
    with pytest.raises(ValueError, match="trained to predict epsilon .* use DDPMScheduler, DDIMScheduler"):
        run(tiny("epsilon", FlowMatchEulerDiscreteScheduler()), [0])
    from nala_gen.diffusion.loading import new_scheduler

    with pytest.raises(ValueError, match="does not fit a flow-matching"):
        new_scheduler(tiny("flow", FlowMatchEulerDiscreteScheduler()), "ddim")
    unrecorded = tiny(None, FlowMatchEulerDiscreteScheduler())  # an old folder: the scheduler decides, as before
    assert unrecorded.prediction_type == "flow" and run(unrecorded, [0]).shape == (1, 3, 8, 8)


@pytest.mark.parametrize("wanted", ["v_prediction", "sample"])
def test_a_scheduler_expecting_another_noise_output_gets_it_converted(wanted):
    reference = run(tiny("epsilon", DDIMScheduler()), [0, 1], generator=seeded(), num_inference_steps=4)
    converted = tiny("epsilon", DDIMScheduler(prediction_type=wanted))
    images = run(converted, [0, 1], generator=seeded(), num_inference_steps=4)
    torch.testing.assert_close(images, reference, atol=1e-4, rtol=0)  # the same sampler, the same images


def test_the_shipped_folders_record_their_objective():
    from nala_gen.diffusion.loading import load_pipeline

    kinds = {name: load_pipeline(name)[0].prediction_type for name in ("naladit-digits", "nalasit-digits")}
    assert kinds == {"naladit-digits": "epsilon", "nalasit-digits": "flow"}
    sit, _ = load_pipeline("nalasit-digits")
    sit.scheduler = DDIMScheduler.from_config(sit.scheduler.config)
    with pytest.raises(ValueError, match="trained for flow matching"):
        run(sit, [3])
