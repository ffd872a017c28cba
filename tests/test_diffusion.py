"""NaLaDiT in diffusers: the transformer, the attention processors, ``linearize`` and the pipeline (tiny, CPU)."""

import types

import numpy as np
import pytest
import torch

# The diffusers integration is an optional extra (pip install .[diffusion]).
pytest.importorskip("diffusers")

from diffusers import (  # noqa: E402
    AutoencoderKL,
    DDIMScheduler,
    DDPMScheduler,
    DiTTransformer2DModel,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    FlowMatchHeunDiscreteScheduler,
    PixArtTransformer2DModel,
    SanaTransformer2DModel,
)
from diffusers.models.attention_processor import Attention, AttnProcessor2_0  # noqa: E402
from PIL import Image  # noqa: E402

from nala_gen.attention import reference_attention  # noqa: E402
from nala_gen.diffusion import (  # noqa: E402
    MODEL_SIZES,
    NaLaAttnProcessor,
    NaLaDiTPipeline,
    NaLaDiTTransformer2DModel,
    NaLaJointAttnProcessor,
    attention_processors,
    linearize,
)

NUM_CLASSES = 10
ID2LABEL = {0: "tench, Tinca tinca", 1: "goldfish", 2: "white shark"}


def randomize(module: torch.nn.Module, seed: int = 0, std: float = 0.1) -> torch.nn.Module:
    """Perturb every parameter: adaLN-Zero and the output layer start at zero, which would make outputs trivial."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)
    return module


def tiny_model(seed: int = 0, **overrides) -> NaLaDiTTransformer2DModel:
    torch.manual_seed(seed)
    config = {"sample_size": 8, "in_channels": 4, "num_classes": NUM_CLASSES, **overrides}
    return randomize(NaLaDiTTransformer2DModel.from_size("tiny", **config), seed).eval()


def inputs(batch=2, channels=4, height=8, width=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, height, width, generator=gen)
    t = torch.tensor([10.0, 700.0])[:batch]
    y = torch.tensor([3, NUM_CLASSES])[:batch]  # one real class, one null class
    return x, t, y


def tiny_vae() -> AutoencoderKL:
    torch.manual_seed(0)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=8,
        latent_channels=4,
        sample_size=16,
    ).eval()


def tiny_pipeline(scheduler=None, vae=False, **model_overrides) -> NaLaDiTPipeline:
    channels = 4 if vae else 3
    transformer = tiny_model(in_channels=channels, **model_overrides)
    pipe = NaLaDiTPipeline(
        transformer, scheduler or DDIMScheduler(), vae=tiny_vae() if vae else None, id2label=ID2LABEL
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, labels=(0, 1), seed=0, **kwargs):
    kwargs = {"num_inference_steps": 2, "output_type": "pt", **kwargs}
    return pipe(list(labels), generator=torch.Generator().manual_seed(seed), **kwargs).images


# ------------------------------------------------------------------------------------------------- transformer


@pytest.mark.parametrize("learn_sigma", [True, False])
@pytest.mark.parametrize("size", [(8, 8), (8, 12)])
def test_forward_shapes(learn_sigma, size):
    model = tiny_model(learn_sigma=learn_sigma)
    x, t, y = inputs(height=size[0], width=size[1])
    with torch.no_grad():
        out = model(x, t, y).sample
        tup = model(x, t, y, return_dict=False)
    assert out.shape == (2, 8 if learn_sigma else 4, *size)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(tup[0], out)


def test_scalar_timestep_and_patch_check():
    model = tiny_model()
    x, _, y = inputs()
    with torch.no_grad():
        scalar = model(x, 500, y).sample
        batch = model(x, torch.tensor([500, 500]), y).sample
    torch.testing.assert_close(scalar, batch)
    with pytest.raises(ValueError, match="patch size"):
        model(torch.randn(1, 4, 7, 8), 1, torch.tensor([0]))
    with pytest.raises(ValueError, match="class labels"):
        model(torch.randn(1, 4, 8, 8), 1, torch.tensor([NUM_CLASSES + 1]))


def test_zero_init_output_and_class_table():
    # adaLN-Zero: a fresh model outputs exactly zero; the class table has a null row.
    model = NaLaDiTTransformer2DModel.from_size("tiny", sample_size=8, num_classes=NUM_CLASSES)
    x, t, y = inputs()
    with torch.no_grad():
        assert model(x, t, y).sample.abs().max() == 0
    assert model.embedder.class_embedder.num_embeddings == NUM_CLASSES + 1


def test_named_sizes_and_parameter_count():
    assert {"tiny", "S/2", "B/2", "L/2", "XL/2"} <= set(MODEL_SIZES)
    with torch.device("meta"):
        small = NaLaDiTTransformer2DModel.from_size("S/2")  # 32x32x4 latents, 1000 classes, learned sigma
        plain = NaLaDiTTransformer2DModel.from_size("S/2", rope=False, lepe=False, gate=False)
    count = sum(p.numel() for p in plain.parameters())
    assert 32.5e6 < count < 33.5e6  # DiT-S/2: 33M (the DiT paper's attention: q/k/v -> softmax -> projection)
    # The NaLa block adds its gate projection, 5x5 LePE and output LayerNorm: 34.8M.
    assert 34.5e6 < sum(p.numel() for p in small.parameters()) < 35e6
    assert small.config.hidden_size == 384 and small.config.depth == 12
    with pytest.raises(ValueError, match="unknown model size"):
        NaLaDiTTransformer2DModel.from_size("M/3")


def test_kernel_is_one_config_value():
    nala = tiny_model(kernel="nala")
    soft = tiny_model(kernel="softmax")
    assert nala.state_dict().keys() == soft.state_dict().keys()
    soft.load_state_dict(nala.state_dict())
    assert {block.attn.kernel for block in nala.blocks} == {"nala"}
    x, t, y = inputs()
    with torch.no_grad():
        assert not torch.allclose(nala(x, t, y).sample, soft(x, t, y).sample, atol=1e-4)


def test_softmax_model_without_block_parts_is_plain_sdpa_attention():
    # With RoPE, LePE and the gate off, the block is q/k/v -> attention -> projection: the DiT paper's attention.
    model = tiny_model(kernel="softmax", rope=False, lepe=False, gate=False)
    attn = model.blocks[0].attn
    x = torch.randn(2, 16, 64)
    q, k, v = attn.qkvg(x).unflatten(-1, (3, 2, 32)).permute(2, 0, 3, 1, 4)
    expected = attn.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 16, 64))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (4, 4)), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("switch", ["rope", "lepe", "gate"])
@pytest.mark.parametrize("kernel", ["nala", "softmax"])
def test_block_switches_change_the_output(kernel, switch):
    full = tiny_model(kernel=kernel)
    without = tiny_model(kernel=kernel, **{switch: False})
    x, t, y = inputs(width=12)
    with torch.no_grad():
        a, b = full(x, t, y).sample, without(x, t, y).sample
    assert torch.isfinite(b).all()
    assert not torch.allclose(a, b, atol=1e-4)


def test_model_save_load_identical(tmp_path):
    model = tiny_model(kernel="nala_split", kernel_options={"lam": 2.0}, learn_sigma=False)
    model.save_pretrained(tmp_path / "model")
    loaded = NaLaDiTTransformer2DModel.from_pretrained(tmp_path / "model").eval()
    assert loaded.config.kernel == "nala_split"
    assert loaded.config.kernel_options == {"lam": 2.0}
    assert loaded.blocks[0].attn.kernel_options == {"lam": 2.0}
    x, t, y = inputs(height=12)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t, y).sample, model(x, t, y).sample, atol=0, rtol=0)


def test_gradient_checkpointing_same_gradients():
    calls = []

    def checkpoint(module, *args):
        calls.append(type(module).__name__)
        return torch.utils.checkpoint.checkpoint(module.__call__, *args, use_reentrant=False)

    def grads(model):
        model.zero_grad()
        x, t, y = inputs()
        model(x, t, y).sample.square().mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    model = tiny_model().train()
    reference = grads(model)
    model.enable_gradient_checkpointing(gradient_checkpointing_func=checkpoint)
    assert model.is_gradient_checkpointing
    checkpointed = grads(model)
    assert calls == ["NaLaDiTBlock"] * model.config.depth
    assert reference.keys() == checkpointed.keys()
    for name in reference:
        torch.testing.assert_close(checkpointed[name], reference[name], atol=1e-6, rtol=1e-5, msg=name)
    assert any(g.abs().max() > 0 for g in reference.values())


# -------------------------------------------------------------------------------------------------- processors


def make_attention(cross_dim=None, **kwargs) -> Attention:
    torch.manual_seed(0)
    return randomize(Attention(query_dim=16, heads=2, dim_head=8, cross_attention_dim=cross_dim, bias=True, **kwargs))


@pytest.mark.parametrize(
    "case",
    ["tokens", "image_with_group_norm", "cross_with_mask", "qk_norm"],
)
def test_softmax_processor_matches_sdpa(case):
    gen = torch.Generator().manual_seed(1)
    context, mask = None, None
    if case == "tokens":
        attn, x = make_attention(), torch.randn(2, 20, 16, generator=gen)
    elif case == "image_with_group_norm":
        attn = make_attention(norm_num_groups=4, residual_connection=True, rescale_output_factor=2.0)
        x = torch.randn(2, 16, 4, 5, generator=gen)
    elif case == "qk_norm":
        attn, x = make_attention(qk_norm="layer_norm"), torch.randn(2, 20, 16, generator=gen)
    else:
        attn, x = make_attention(cross_dim=12), torch.randn(2, 20, 16, generator=gen)
        context = torch.randn(2, 7, 12, generator=gen)
        mask = torch.ones(2, 7, dtype=torch.bool)
        mask[0, 4:] = False
        mask = (~mask).float()[:, None] * -10000.0  # diffusers' additive key mask, (B, 1, N_k)
    assert isinstance(attn.processor, AttnProcessor2_0)
    with torch.no_grad():
        default = attn(x, encoder_hidden_states=context, attention_mask=mask)
        attn.set_processor(NaLaAttnProcessor("softmax"))
        ours = attn(x, encoder_hidden_states=context, attention_mask=mask)
    assert ours.shape == x.shape
    torch.testing.assert_close(ours, default, atol=1e-5, rtol=1e-5)


def test_nala_processor_is_nala_attention_on_the_projections():
    attn = make_attention()
    x = torch.randn(2, 20, 16, generator=torch.Generator().manual_seed(2))
    attn.set_processor(NaLaAttnProcessor("nala", lam=2.0))
    with torch.no_grad():
        ours = attn(x)
        q, k, v = (proj(x).unflatten(-1, (2, 8)).transpose(1, 2) for proj in (attn.to_q, attn.to_k, attn.to_v))
        expected = attn.to_out[0](reference_attention(q, k, v, "nala", lam=2.0).transpose(1, 2).flatten(2))
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_linear_processor_key_padding_mask_drops_keys():
    attn = make_attention(cross_dim=12)
    attn.set_processor(NaLaAttnProcessor("nala"))
    gen = torch.Generator().manual_seed(3)
    x, context = torch.randn(2, 10, 16, generator=gen), torch.randn(2, 6, 12, generator=gen)
    keep = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    with torch.no_grad():
        masked = attn(x, encoder_hidden_states=context, attention_mask=keep)
        first = attn(x[:1], encoder_hidden_states=context[:1, :4])
        second = attn(x[1:], encoder_hidden_states=context[1:])
    torch.testing.assert_close(masked, torch.cat([first, second]), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="key-padding"):
        attn(x, encoder_hidden_states=context, attention_mask=torch.zeros(2, 10, 6))


def test_unknown_kernel_rejected():
    with pytest.raises(ValueError, match="unknown attention kernel"):
        NaLaAttnProcessor("cosformer")


def _dit():
    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2, sample_size=8
    )
    x, t, y = inputs()
    return randomize(model).eval(), lambda m: m(x, timestep=t, class_labels=y.clamp(max=5)).sample


def _pixart():
    torch.manual_seed(0)
    model = PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        sample_size=8,
        cross_attention_dim=16,
        caption_channels=12,
    )
    x, t, _ = inputs()
    text = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(4))
    conds = {"resolution": None, "aspect_ratio": None}
    return randomize(
        model
    ).eval(), lambda m: m(x, encoder_hidden_states=text, timestep=t, added_cond_kwargs=conds).sample


@pytest.mark.parametrize("make", [_dit, _pixart], ids=["DiT", "PixArt"])
def test_linearize_swaps_only_self_attention(make):
    model, run = make()
    before = attention_processors(model)
    with torch.no_grad():
        softmax_out = run(model)
    swapped = linearize(model, "nala").swapped
    after = attention_processors(model)
    assert swapped and swapped == [name for name in before if name.endswith("attn1")]
    for name in before:
        if name in swapped:
            assert isinstance(after[name], NaLaAttnProcessor) and after[name].kernel == "nala"
        else:  # cross-attention: the very same processor object
            assert name.endswith("attn2") and after[name] is before[name]
    with torch.no_grad():
        nala_out = run(model)
    assert nala_out.shape == softmax_out.shape and torch.isfinite(nala_out).all()
    assert not torch.allclose(nala_out, softmax_out, atol=1e-4)


def test_linearize_sana_relu_reproduces_sana_linear_attention():
    # Sana's self-attention already is ReLU linear attention: swapping in our "relu" kernel must not change it.
    torch.manual_seed(0)
    model = SanaTransformer2DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=1,
        num_cross_attention_heads=2,
        cross_attention_head_dim=8,
        cross_attention_dim=16,
        caption_channels=12,
        sample_size=8,
        patch_size=1,
    )
    model = randomize(model).eval()
    x, t, _ = inputs()
    text = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        sana = model(x, encoder_hidden_states=text, timestep=t).sample
        assert linearize(model, "relu").swapped == ["transformer_blocks.0.attn1"]
        ours = model(x, encoder_hidden_states=text, timestep=t).sample
    torch.testing.assert_close(ours, sana, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------- pipeline


def test_pipeline_seeded_generation_is_reproducible():
    pipe = tiny_pipeline()
    a, b, c = generate(pipe, seed=0), generate(pipe, seed=0), generate(pipe, seed=1)
    assert a.shape == (2, 3, 8, 8) and 0 <= a.min() and a.max() <= 1
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.allclose(a, c, atol=1e-3)


def test_pipeline_guidance_uses_null_class():
    pipe = tiny_pipeline()
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["class_labels"].tolist()), with_kwargs=True
    )
    plain = generate(pipe, labels=(0, 2), guidance_scale=1.0)
    assert seen and all(labels == [0, 2] for labels in seen)
    seen.clear()
    guided = generate(pipe, labels=(0, 2), guidance_scale=4.0)
    hook.remove()
    assert seen and all(labels == [0, 2, NUM_CLASSES, NUM_CLASSES] for labels in seen)
    assert guided.shape == plain.shape and not torch.allclose(guided, plain, atol=1e-3)
    assert pipe.last_readout["batch"] == 4


def test_pipeline_labels_by_name_and_bad_labels():
    pipe = tiny_pipeline()
    assert pipe.get_label_ids(["goldfish", "Tinca tinca", 2, NUM_CLASSES]) == [1, 0, 2, NUM_CLASSES]
    torch.testing.assert_close(generate(pipe, labels=("white shark",)), generate(pipe, labels=(2,)))
    for bad in (NUM_CLASSES + 1, -1, 1.5, True):
        with pytest.raises(ValueError, match="bad class id"):
            pipe([bad], num_inference_steps=1)
    with pytest.raises(ValueError, match="unknown class name 'unicorn'"):
        pipe(["unicorn"], num_inference_steps=1)


@pytest.mark.parametrize(
    "scheduler",
    [
        DDIMScheduler(),
        DDPMScheduler(variance_type="learned_range"),
        DPMSolverMultistepScheduler(),
        FlowMatchEulerDiscreteScheduler(),
        FlowMatchHeunDiscreteScheduler(),
    ],
    ids=["DDIM", "DDPM-learned", "DPMSolver", "FlowEuler", "FlowHeun"],
)
def test_pipeline_schedulers_give_right_size(scheduler):
    pipe = tiny_pipeline(scheduler=scheduler)
    images = generate(pipe, height=8, width=12, guidance_scale=2.0)
    assert images.shape == (2, 3, 8, 12) and torch.isfinite(images).all()
    readout = pipe.last_readout
    assert readout["mode"] == ("flow" if "Flow" in type(scheduler).__name__ else "epsilon")
    assert readout["tokens"] == 4 * 6 and readout["steps"] == 2


def test_pipeline_flow_mode_feeds_1000_sigma():
    pipe = tiny_pipeline(scheduler=FlowMatchEulerDiscreteScheduler())
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["timestep"][0].item()), with_kwargs=True
    )
    generate(pipe, num_inference_steps=4)
    hook.remove()
    sigmas = pipe.scheduler.sigmas[:-1].tolist()
    assert seen == pytest.approx([1000 * s for s in sigmas], rel=1e-5)
    assert seen[0] == pytest.approx(1000.0)


def test_pipeline_vae_path_and_output_types():
    pipe = tiny_pipeline(vae=True)
    assert pipe.vae_scale_factor == 2
    pt = generate(pipe)
    assert pt.shape == (2, 3, 16, 16)  # sample_size 8 latents -> 16 pixels
    np_images = generate(pipe, output_type="np")
    assert isinstance(np_images, np.ndarray) and np_images.shape == (2, 16, 16, 3)
    np.testing.assert_allclose(np_images, pt.permute(0, 2, 3, 1).numpy(), atol=1e-6)
    pil = generate(pipe, output_type="pil")
    assert len(pil) == 2 and isinstance(pil[0], Image.Image) and pil[0].size == (16, 16)
    with pytest.raises(ValueError, match="multiples of 4"):
        generate(pipe, height=18)
    readout = pipe.last_readout
    assert {"latency_s", "peak_mem_bytes", "tokens", "steps"} <= readout.keys()
    # The job's memory above its start: bytes, not the process's whole RSS (a 16-token tiny model: far below a GiB).
    assert readout["latency_s"] > 0 and readout["peak_mem_bytes"] < 2**30 and readout["tokens"] == 16


@pytest.mark.parametrize("vae", [False, True], ids=["pixels", "latents"])
def test_pipeline_save_load_identical(tmp_path, vae):
    pipe = tiny_pipeline(vae=vae)
    pipe.save_pretrained(tmp_path / "pipe")
    loaded = NaLaDiTPipeline.from_pretrained(tmp_path / "pipe")
    loaded.set_progress_bar_config(disable=True)
    assert type(loaded.transformer) is NaLaDiTTransformer2DModel
    assert (loaded.vae is None) == (not vae)
    assert loaded.id2label == ID2LABEL
    assert loaded.get_label_ids(["white shark"]) == [2]
    torch.testing.assert_close(generate(loaded, guidance_scale=2.0), generate(pipe, guidance_scale=2.0), atol=0, rtol=0)


# ------------------------------------------------------------------------------- linearize on five model families


def _unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=4,
        norm_num_groups=4,
    )
    x, t, _ = inputs()
    text = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    return randomize(model).eval(), lambda m: m(x, t, encoder_hidden_states=text).sample


def _sd3():
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=12,
        out_channels=4,
        pos_embed_max_size=16,
    )
    x, t, _ = inputs()
    gen = torch.Generator().manual_seed(2)
    text, pooled = torch.randn(2, 5, 16, generator=gen), torch.randn(2, 12, generator=gen)
    run = lambda m: m(x, encoder_hidden_states=text, pooled_projections=pooled, timestep=t).sample  # noqa: E731
    return randomize(model).eval(), run


def _flux():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=12,
        axes_dims_rope=(2, 2, 4),
    )
    gen = torch.Generator().manual_seed(3)
    image = torch.randn(2, 16, 4, generator=gen)  # a packed 4x4 latent
    text, pooled = torch.randn(2, 5, 16, generator=gen), torch.randn(2, 12, generator=gen)
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
    img_ids = torch.stack((torch.zeros(16), rows.flatten(), cols.flatten()), dim=-1)
    txt_ids = torch.zeros(5, 3)
    t = torch.tensor([0.1, 0.7])

    def run(m):
        return m(
            image, encoder_hidden_states=text, pooled_projections=pooled, timestep=t, img_ids=img_ids, txt_ids=txt_ids
        ).sample

    return randomize(model).eval(), run


def _hunyuan():
    from diffusers import HunyuanDiT2DModel
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    torch.manual_seed(0)
    model = HunyuanDiT2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        patch_size=2,
        sample_size=8,
        hidden_size=16,
        num_layers=2,
        cross_attention_dim=16,
        cross_attention_dim_t5=16,
        pooled_projection_dim=8,
        text_len=5,
        text_len_t5=6,
        use_style_cond_and_image_meta_size=False,
    )
    x, t, _ = inputs()
    gen = torch.Generator().manual_seed(4)
    text, text_t5 = torch.randn(2, 5, 16, generator=gen), torch.randn(2, 6, 16, generator=gen)
    rotary = get_2d_rotary_pos_embed(8, ((0, 0), (4, 4)), (4, 4))  # head_dim 8 over the 4x4 patch grid

    def run(m):
        return m(
            x,
            t,
            encoder_hidden_states=text,
            text_embedding_mask=torch.ones(2, 5),
            encoder_hidden_states_t5=text_t5,
            text_embedding_mask_t5=torch.ones(2, 6),
            image_rotary_emb=rotary,
        ).sample

    return randomize(model).eval(), run


FAMILIES = {"UNet2DCondition": _unet, "PixArt": _pixart, "SD3": _sd3, "Flux": _flux, "HunyuanDiT": _hunyuan}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_linearize_softmax_keeps_the_model_and_nala_changes_it(family):
    model, run = FAMILIES[family]()
    with torch.no_grad():
        original = run(model)
        # The processors reproduce each family's own: with the softmax kernel nothing may change.
        report = linearize(model, "softmax")
        torch.testing.assert_close(run(model), original, atol=2e-5, rtol=1e-4)
        report = linearize(model, "nala")
        nala = run(model)
    assert report.swapped and not set(report.swapped) & set(report.skipped)
    processors = attention_processors(model)
    assert set(report.swapped) | set(report.skipped) == set(processors)
    assert all(isinstance(processors[name], NaLaAttnProcessor) for name in report.swapped)
    assert all("cross-attention" in why for why in report.skipped.values()), report.skipped
    if family in ("SD3", "Flux"):
        assert report.joint and all(isinstance(processors[n], NaLaJointAttnProcessor) for n in report.joint)
    assert nala.shape == original.shape and torch.isfinite(nala).all()
    assert not torch.allclose(nala, original, atol=1e-4)
    assert "swapped" in str(report)


def test_linearize_keeps_hunyuans_rotary_embedding():
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    model, _ = _hunyuan()
    linearize(model, "nala")
    attn = model.blocks[0].attn1
    x = torch.randn(2, 16, 16)
    rotary = get_2d_rotary_pos_embed(8, ((0, 0), (4, 4)), (4, 4))
    with torch.no_grad():
        with_rotary, without = attn(x, image_rotary_emb=rotary), attn(x)
    assert not torch.allclose(with_rotary, without, atol=1e-5)  # the embedding reaches the kernel
    with pytest.raises(ValueError, match="rotary"):
        attn(x, image_rotary_emb=torch.randn(16, 4))  # a complex-style table: refused, not dropped


def test_linearize_reports_what_it_cannot_swap():
    from diffusers.models.attention_processor import AttnAddedKVProcessor

    model, _ = _unet()
    name = next(n for n, m in model.named_modules() if n.endswith("attn1"))
    model.get_submodule(name).set_processor(AttnAddedKVProcessor())
    report = linearize(model, "nala")
    assert name not in report.swapped and "AttnAddedKVProcessor" in report.skipped[name]


# ------------------------------------------------------------------------------- linearize on cross-attention


def test_linearize_cross_attention_puts_nala_on_pixarts_text_attention():
    """cross_attention=True: PixArt's attn2 (queries from the image tokens, keys and values from the text tokens)
    runs NaLa too, and a text-padding mask still holds; by default it keeps its softmax processor."""
    x, t, _ = inputs()
    gen = torch.Generator().manual_seed(4)
    text = torch.randn(2, 5, 12, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # the second caption is two tokens shorter
    conds = {"resolution": None, "aspect_ratio": None}

    def run(m, captions=text):
        kwargs = {"encoder_attention_mask": mask, "added_cond_kwargs": conds}
        return m(x, encoder_hidden_states=captions, timestep=t, **kwargs).sample

    default, _ = _pixart()
    before = attention_processors(default)
    cross = [name for name in before if name.endswith("attn2")]
    report = linearize(default, "nala")
    assert cross and not report.cross and all(attention_processors(default)[n] is before[n] for n in cross)

    model, _ = _pixart()
    with torch.no_grad():
        original, self_only = run(model), run(default)
        report = linearize(types.SimpleNamespace(transformer=model), "softmax", cross_attention=True)  # a pipeline
        assert report.cross == cross and set(report.swapped) == set(before) and not report.skipped
        torch.testing.assert_close(run(model), original, atol=2e-5, rtol=1e-4)  # the processors reproduce PixArt's
        linearize(model, "nala", cross_attention=True)
        both = run(model)
        padded = text.clone()
        padded[1, 3:] = torch.randn(2, 12, generator=gen)  # what the mask hides must not matter
        masked = run(model, padded)
    processors = attention_processors(model)
    assert all(isinstance(p, NaLaAttnProcessor) and p.kernel == "nala" for p in processors.values())
    assert torch.isfinite(both).all() and both.shape == original.shape
    assert not torch.allclose(both, self_only, atol=1e-4) and not torch.allclose(both, original, atol=1e-4)
    torch.testing.assert_close(masked[1], both[1], atol=1e-5, rtol=1e-5)
    assert "cross-attention" in str(report)
    with pytest.raises(TypeError, match="pipeline"):
        linearize(object())


@pytest.mark.parametrize("family", ["UNet2DCondition", "PixArt", "HunyuanDiT"])
def test_linearize_cross_attention_with_softmax_keeps_the_model_and_nala_changes_it(family):
    # HunyuanDiT rotates the queries of its cross-attention: they still are, before the kernel.
    model, run = FAMILIES[family]()
    self_only, _ = FAMILIES[family]()
    with torch.no_grad():
        original = run(model)
        report = linearize(model, "softmax", cross_attention=True)
        assert report.cross and not report.skipped
        torch.testing.assert_close(run(model), original, atol=2e-5, rtol=1e-4)
        linearize(model, "nala", cross_attention=True)
        linearize(self_only, "nala")
        both, only = run(model), run(self_only)
    assert torch.isfinite(both).all()
    assert not torch.allclose(both, only, atol=1e-4)


def test_attention_init_neutral_by_default_xavier_as_the_older_pipelines_started():
    import torch.nn.functional as F

    torch.manual_seed(0)
    neutral = NaLaDiTTransformer2DModel.from_size("tiny")
    attn = neutral.blocks[0].attn
    c = attn.qkvg.in_features
    assert neutral.config.attention_init == "neutral" and not attn.lepe.weight.any()
    assert torch.allclose(F.silu(attn.qkvg.bias[3 * c :]), torch.ones(c)) and not attn.qkvg.weight[3 * c :].any()
    # q, k, v as wide as a gate-free block's: xavier over (3C, C)
    bound = (6 / (4 * c)) ** 0.5
    assert attn.qkvg.weight[: 3 * c].abs().max() <= bound and attn.qkvg.weight[: 3 * c].abs().max() > 0.9 * bound
    xavier = NaLaDiTTransformer2DModel.from_size("tiny", attention_init="xavier")
    assert xavier.blocks[0].attn.lepe.weight.any() and xavier.blocks[0].attn.qkvg.weight[3 * c :].any()
    with pytest.raises(ValueError, match="attention_init"):
        NaLaDiTTransformer2DModel.from_size("tiny", attention_init="zeros")
