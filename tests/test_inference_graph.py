"""The fast inference form (nala_gen.sr.archs.fast) computes the plain forward's function, and the networks build
it and run it from their own forward in inference."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nala_gen.attention import inference as block_inference
from nala_gen.attention.inference import HeadGroupedMix
from nala_gen.sr.archs import esrt_arch
from nala_gen.sr.archs.esrt_arch import ESRT
from nala_gen.sr.archs.fast import ESRTInferenceGraph
from nala_gen.sr.archs.fast.body import Float32PReLU
from nala_gen.sr.archs.fast.transformer import ConvolvedTokens
from nala_gen.sr.archs.fast.upsampler import REACH_PROBES, ComposedUpsampler, compose_chain, support_radius
from nala_gen.sr.archs.nalasr_arch import NaLaSR
from nala_gen.sr.upscale.engine import Upscaler

TOL = 1e-5


def within_tol(ours, reference) -> bool:
    """Within TOL of the reference, relative to its largest magnitude where that exceeds 1: float32 rounding (the
    Winograd F(4x4, 3x3) convolutions' above all) scales with the values, and these random networks' outputs reach
    a few units, not the [0, 1] of a trained network's image."""
    return (ours - reference).abs().max().item() <= TOL * max(1.0, reference.abs().max().item())


def trained_looking(net: nn.Module, seed: int) -> nn.Module:
    """Random weights with every learned scale and bias away from its initial value, so no term hides."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return net.eval()


def plain_and_graph(net: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return net.forward_layers(x), net.inference_form()(x)


@pytest.mark.parametrize("scale", [2, 3, 4])
@pytest.mark.parametrize("size", [(23, 31), (13, 12), (5, 7), (2, 2)])
def test_nalasr_graph_equals_the_plain_forward(scale, size):
    net = trained_looking(NaLaSR(upscale=scale, num_feat=16, num_block=1, num_heads=4), seed=scale)
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
    plain, graph = plain_and_graph(net, x)
    assert graph.shape == (2, 3, size[0] * scale, size[1] * scale)
    assert within_tol(plain, graph)


def test_esrt_graph_equals_the_plain_forward_channels_last():
    net = trained_looking(ESRT(upscale=4, num_feat=16, num_block=1, num_heads=4), seed=0)
    net = net.to(memory_format=torch.channels_last)
    x = torch.rand(1, 3, 29, 18).contiguous(memory_format=torch.channels_last)
    plain, graph = plain_and_graph(net, x)
    assert within_tol(plain, graph)


def reach_three_chain():
    # reduce (3x3) -> x4 as two (3x3 conv, shuffle) stages -> 3x3 conv: 1 + 1 + 1/2 + 1/4 LR px, so 3 taps out
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(8, 8, 3, padding=1),
        nn.Conv2d(8, 32, 3, padding=1),
        nn.PixelShuffle(2),
        nn.Conv2d(8, 32, 3, padding=1),
        nn.PixelShuffle(2),
        nn.Conv2d(8, 3, 3, padding=1),
    )


def test_composed_kernel_has_the_chains_reach():
    chain = reach_three_chain()
    weight, bias, radius = compose_chain(chain, 8, 4)
    assert radius == 3 and weight.shape == (48, 8, 7, 7) and bias.shape == (48,)
    with pytest.raises(ValueError, match="max_radius"):
        compose_chain(chain, 8, 4, max_radius=3)


def test_the_reach_read_off_the_layers_shapes_sizes_the_probe_as_the_response_would():
    chain = reach_three_chain()
    assert support_radius(chain, 4, 5) == 3
    assert support_radius(chain, 2, 5) is None  # not this chain's scale
    # Layers it does not know (here a nested Sequential): the reach is read off the float64 response, as before,
    # and the composed convolution is the same.
    nested = nn.Sequential(chain[0], nn.Sequential(*chain[1:]))
    assert support_radius(nested, 4, 5) is None
    weight, bias, radius = compose_chain(chain, 8, 4)
    weight_n, bias_n, radius_n = compose_chain(nested, 8, 4)
    assert radius_n == radius == 3
    assert (weight - weight_n).abs().max().item() < 1e-12 and (bias - bias_n).abs().max().item() < 1e-12


def test_a_chain_beyond_the_first_probe_is_composed_from_a_larger_one():
    chain = reach_three_chain().eval()
    assert REACH_PROBES[0] == 3  # this chain reaches exactly the first probe's edge
    upsampler = ComposedUpsampler(chain, 8, 4)
    x = torch.randn(2, 8, 13, 11)
    with torch.no_grad():
        assert upsampler.radius == 3
        assert within_tol(F.pixel_shuffle(upsampler(x), 4), chain(x))


def test_the_graph_is_built_once_and_again_after_new_weights():
    net = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4), seed=3)
    graph = net.inference_form()
    assert net.inference_form() is graph
    other = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4), seed=4)
    net.load_state_dict(other.state_dict())
    assert net.inference_form() is not graph
    x = torch.rand(1, 3, 17, 19)
    with torch.inference_mode():
        assert within_tol(net.inference_form()(x), other.forward_layers(x))
    assert net.train().inference_form() is net  # training runs the plain modules


def count_calls(monkeypatch, cls: type, name: str) -> list:
    calls, method = [], getattr(cls, name)
    monkeypatch.setattr(cls, name, lambda self, *args: calls.append(1) or method(self, *args))
    return calls


@pytest.mark.parametrize("switched_off", ["after", "at_construction"])
def test_the_engine_runs_what_the_network_chooses_and_matches_the_layers_on_tiles(monkeypatch, switched_off):
    img = np.random.default_rng(0).integers(0, 65536, (45, 38, 3), dtype=np.uint16)
    graph_calls = count_calls(monkeypatch, ESRTInferenceGraph, "forward")
    layer_calls = count_calls(monkeypatch, NaLaSR, "forward_layers")
    net = trained_looking(NaLaSR(upscale=4, num_feat=16, num_block=1, num_heads=4), seed=5)
    engine = Upscaler(net, 4, "cpu", tile=32, tile_pad=8)
    fast, _ = engine.upscale(img)
    assert graph_calls and not layer_calls
    graph_calls.clear()
    if switched_off == "after":  # the engine calls the network: a switch on it holds at once
        net.fast_inference = False
    else:
        layers_net = NaLaSR(upscale=4, num_feat=16, num_block=1, num_heads=4, fast_inference=False)
        layers_net.load_state_dict(net.state_dict())
        engine = Upscaler(layers_net, 4, "cpu", tile=32, tile_pad=8)
    plain, _ = engine.upscale(img)
    assert layer_calls and not graph_calls
    assert np.abs(fast.astype(np.int64) - plain.astype(np.int64)).max() <= 1


@pytest.mark.parametrize(
    "options",
    [{"gate": False}, {"lepe": False, "rope": False}, {"kernel": "relu"}, {"kernel": "softmax"}, {"norm_scale": 2.0}],
)
def test_graph_of_every_block_variant(options):
    net = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4, **options), seed=6)
    x = torch.rand(1, 3, 19, 14, generator=torch.Generator().manual_seed(2))
    plain, graph = plain_and_graph(net, x)
    assert within_tol(plain, graph)


@pytest.mark.parametrize("heads", [2, 6, 8])
@pytest.mark.parametrize("norm_scale", ["tracked", "learned"])
@pytest.mark.parametrize("per_group", ["all", "half", "one"])
def test_head_groups_keep_each_heads_own_norm_scale(monkeypatch, heads, norm_scale, per_group):
    # The graph attends a group of heads at a time where q/k/v would be large (HeadGroupedMix): whatever the
    # grouping, each head keeps its own gamma, q/k/v rows and output channels.
    net = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=heads, norm_scale=norm_scale), 8)
    block = net.body.transformer[0].attn.block
    with torch.no_grad():
        block.log_norm_scale.copy_(torch.linspace(-1.5, 1.0, heads))
    x = torch.rand(1, 3, 15, 13, generator=torch.Generator().manual_seed(4))
    mix = net.inference_form().body.transformer[0].mix
    heads_per_group = {"all": heads, "half": heads // 2, "one": 1}[per_group]
    monkeypatch.setattr(block_inference, "QKV_GROUP_BYTES", 15 * 13 * 3 * mix.head_dim * 4 * heads_per_group)
    assert mix.groups(15 * 13, 4) == heads // heads_per_group
    plain, graph = plain_and_graph(net, x)
    assert within_tol(plain, graph)


@pytest.mark.parametrize("rows_per_band", [1, 2, 5])
@pytest.mark.parametrize("batch", [1, 2])
def test_transformer_bands_compute_the_whole_maps_function(monkeypatch, rows_per_band, batch):
    # Large maps run the transformer's steps around the attention (and the block's norm and gate) in bands of rows
    # with halos: the bands' seams and the map's top and bottom edges must come out as the whole map's.
    net = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4), seed=11)
    x = torch.rand(batch, 3, 17, 13, generator=torch.Generator().manual_seed(5))
    transformer = net.inference_form().body.transformer[0]
    row_bytes = batch * 13 * (transformer.x_weight_proj.shape[0] + transformer.h_weight_proj.shape[0]) * 4
    monkeypatch.setattr(block_inference, "BAND_BYTES", row_bytes * rows_per_band)
    bands = block_inference.row_bands(17, row_bytes)
    assert len(bands) == -(-17 // rows_per_band) and bands[0][0] == 0 and bands[-1][1] == 17
    assert all(stop == start for (_, stop), (start, _) in zip(bands, bands[1:]))  # adjacent, no gaps or overlaps
    plain, graph = plain_and_graph(net, x)
    assert within_tol(plain, graph)


@pytest.mark.parametrize(
    "options",
    [{}, {"gate": False}, {"lepe": False, "rope": False}, {"norm_scale": 2.0}, {"norm_scale": "learned"}, "huge keys"],
)
def test_streamed_attention_in_bands_for_every_block_variant(monkeypatch, options):
    # In float32 bands the NaLa block's attention streams (key_state over the bands, then each band's queries with
    # the fold's halo rows): every block variant equals the plain forward. Keys too large for the raw key map
    # as they stand need the whole map's rescaling: the graph attends the whole map instead, to the same result.
    huge = options == "huge keys"
    net = NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4, **({} if huge else options))
    net = trained_looking(net, seed=13)
    block = net.body.transformer[0].attn.block
    if huge:
        with torch.no_grad():
            block.qkvg.weight[72:144] *= 3e5  # the key rows (C = 72): components far beyond RAW_KEY_LIMIT
    x = torch.rand(2, 3, 16, 11, generator=torch.Generator().manual_seed(9))
    transformer = net.inference_form().body.transformer[0]
    row_bytes = 2 * 11 * (transformer.x_weight_proj.shape[0] + transformer.h_weight_proj.shape[0]) * 4
    monkeypatch.setattr(block_inference, "BAND_BYTES", row_bytes * 3)
    states, whole = [], []
    key_state, forward = HeadGroupedMix.key_state, HeadGroupedMix.forward
    monkeypatch.setattr(HeadGroupedMix, "key_state", lambda *a: states.append(key_state(*a)) or states[-1])
    monkeypatch.setattr(HeadGroupedMix, "forward", lambda *a: whole.append(1) or forward(*a))
    plain, graph = plain_and_graph(net, x)
    assert len(states) == 1 and (states[0] is None) == huge and len(whole) == huge
    assert within_tol(plain, graph), (plain - graph).abs().max().item()


@pytest.mark.parametrize("autocast", [False, True])
def test_banded_transformer_projects_convolutions_of_x_not_a_held_attention_input(monkeypatch, autocast):
    # In bands (large maps) the NaLa block's q/k/v and gate are convolutions of x with the reduction composed in:
    # the block is handed ConvolvedTokens, never a (B, N, R) map (in float32 its attention streams: key_state,
    # then rows; under bf16 autocast the whole-map mix), and computes what the whole-map graph computes (under
    # autocast within bf16's rounding of the same network).
    net = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4), seed=12)
    x = torch.rand(1, 3, 18, 15, generator=torch.Generator().manual_seed(7))
    transformer = net.inference_form().body.transformer[0]
    seen = []
    for name in ("forward", "key_state"):
        method = getattr(HeadGroupedMix, name)
        monkeypatch.setattr(
            HeadGroupedMix,
            name,
            lambda mix, t, *args, method=method, name=name: seen.append((name, type(t))) or method(mix, t, *args),
        )
    with torch.inference_mode():
        reference = net.forward_layers(x)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            whole = net.inference_form()(x).float()
            row_bytes = 15 * (transformer.x_weight_proj.shape[0] + transformer.h_weight_proj.shape[0]) * 4
            monkeypatch.setattr(block_inference, "BAND_BYTES", row_bytes * 4)
            banded = net.inference_form()(x).float()
    banded_call = ("forward" if autocast else "key_state", ConvolvedTokens)
    assert seen == [("forward", torch.Tensor), banded_call]
    if autocast:  # bf16's own rounding, no more than the whole-map graph's
        assert (banded - reference).abs().max().item() <= 2 * (whole - reference).abs().max().item()
    else:
        assert within_tol(banded, whole) and within_tol(banded, reference)


def test_negative_and_zero_residual_scales_are_not_folded_through_relu():
    net = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4), seed=7)
    with torch.no_grad():
        net.body.hpbs[0].entry.scale_res.scale.fill_(-0.5)
        net.body.hpbs[0].exit.scale_res.scale.fill_(0.0)
    x = torch.rand(1, 3, 16, 17, generator=torch.Generator().manual_seed(3))
    plain, graph = plain_and_graph(net, x)
    assert within_tol(plain, graph)


def test_graph_is_faithful_on_the_shipped_weights():
    from nala_gen.sr.loading import load_sr_model

    for name in ("nalasr-light-x4", "esrt-x4"):
        net = load_sr_model(name, 4)[0].to(memory_format=torch.channels_last)
        x = torch.rand(1, 3, 40, 33, generator=torch.Generator().manual_seed(4)).contiguous(
            memory_format=torch.channels_last
        )
        plain, graph = plain_and_graph(net, x)
        assert within_tol(plain, graph)


def test_the_graph_moves_to_channels_last_as_the_engine_moves_it():
    # The engine calls .to(memory_format=channels_last) on what it runs: every buffer of the graph must take it.
    net = trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=2, num_heads=4), seed=3)
    x = torch.rand(1, 3, 19, 22, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        plain = net.forward_layers(x)
        graph = net.inference_form().to(memory_format=torch.channels_last)
        moved = graph(x.contiguous(memory_format=torch.channels_last))
    assert within_tol(plain, moved)


def tiny_nalasr(seed: int = 9) -> NaLaSR:
    return trained_looking(NaLaSR(upscale=2, num_feat=16, num_block=1, num_heads=4), seed=seed)


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_the_networks_own_forward_runs_the_graph_in_inference(context):
    # What spandrel, BasicSR's test and a user's script call: net.eval(), then net(x) without autograd.
    for net in (tiny_nalasr(), trained_looking(ESRT(upscale=3, num_feat=16, num_block=1, num_heads=4), seed=1)):
        x = torch.rand(1, 3, 21, 18, generator=torch.Generator().manual_seed(5))
        with getattr(torch, context)():
            out = net(x)
            assert out.is_contiguous()  # the caller's layout (the graph itself runs channels-last)
            assert net in esrt_arch._FAST_FORMS  # built by the call above
            assert torch.equal(out, net.inference_form()(x))
            layers = net.forward_layers(x)
        assert not torch.equal(out, layers)  # a different computation (composed and folded layers) ...
        assert within_tol(out, layers)  # ... of the same function


def test_frozen_parameters_and_an_input_without_grad_run_the_graph_with_autograd_on():
    net = tiny_nalasr().requires_grad_(False)
    x = torch.rand(1, 3, 14, 15)
    out = net(x)
    assert torch.equal(out, net.inference_form()(x)) and not out.requires_grad


@pytest.mark.parametrize("case", ["training", "parameter_grads", "input_grad", "switched_off"])
def test_the_layers_run_where_autograd_or_the_user_needs_them(case):
    net = tiny_nalasr()
    x = torch.rand(1, 3, 14, 15, requires_grad=case == "input_grad")
    if case == "training":
        net.train()
    if case == "switched_off":
        net.fast_inference = False
    with torch.set_grad_enabled(case != "switched_off"):
        out = net(x)
        assert torch.equal(out, net.forward_layers(x))
    assert net not in esrt_arch._FAST_FORMS
    if case in ("training", "parameter_grads"):  # gradients reach the weights, in eval mode too
        out.square().mean().backward()
        assert net.head.weight.grad is not None and net.head.weight.grad.abs().sum() > 0
    if case == "input_grad":  # and the input (an adversarial or perceptual loss through a frozen network)
        out.sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0


def test_the_graph_under_bf16_autocast_keeps_to_the_layers_under_it():
    # bf16 on a CPU (where it is native) runs the graph under autocast; its PReLUs compute in float32 there.
    net = tiny_nalasr(seed=11)
    x = torch.rand(1, 3, 20, 17, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        reference = net.forward_layers(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layers, graph = net.forward_layers(x).float(), net(x).float()
    assert any(isinstance(m, Float32PReLU) for m in net.inference_form().modules())
    layers_error = (layers - reference).abs().max().item()
    assert 0 < layers_error < 0.1  # bf16 rounding, visible
    assert (graph - reference).abs().max().item() <= 2 * layers_error


def test_bf16_leaves_no_mean_shift_on_a_smooth_picture():
    # The skip path (the picture itself) and the head (the body's long residual) run in float32 under autocast:
    # rounded to bf16 (steps of 1/128 near 1) they shifted a smooth picture's output by ~1e-3 on average, a PSNR
    # loss on the smooth held-out photos that per-pixel noise alone does not cause.
    from nala_gen.sr.loading import load_sr_model

    net = load_sr_model("nalasr-light-x2", 2)[0]
    rows, cols = torch.meshgrid(torch.linspace(0.55, 0.95, 48), torch.linspace(0.6, 0.9, 48), indexing="ij")
    x = torch.stack([rows, cols, (rows + cols) / 2])[None]
    with torch.inference_mode():
        reference = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(x)
    assert out.dtype == torch.float32  # the skip's float32 picture plus the bf16 details
    error = out - reference
    assert 0 < error.abs().max().item() < 0.05  # bf16 rounding, visible
    assert abs(error.mean().item()) < 2.5e-4  # 9e-4 with the image's layers in bf16


def test_building_the_graph_leaves_the_network_as_it_was():
    # The graph shares the network's layers and makes new ones only where it folds weights.
    net = tiny_nalasr(seed=12)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    graph = net.inference_form()
    after = net.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    shared = {id(p) for p in net.parameters()}
    assert any(id(p) in shared for p in graph.parameters())  # the unfolded layers are the network's own
    assert any(id(p) not in shared for p in graph.parameters())  # the folded ones are new


@pytest.mark.parametrize("fast", [True, False])
def test_the_onnx_export_exports_what_the_network_runs_in_inference(monkeypatch, tmp_path, fast):
    from nala_gen.sr.interop import onnx_export

    class Exported(Exception):
        pass

    def export(module, *args, **kwargs):
        raise Exported(module)

    monkeypatch.setattr(torch.onnx, "export", export)
    net = tiny_nalasr()
    net.fast_inference = fast
    with pytest.raises(Exported) as exported:
        onnx_export.export_onnx(net, tmp_path / "net.onnx")
    module = exported.value.args[0]
    assert isinstance(module, ESRTInferenceGraph) if fast else module is net  # traced, net runs its layers


def test_the_fast_form_imports_none_of_the_networks_and_its_old_name_still_works():
    # The network imports its fast form: the form reads only the layers both share (esrt_layers), no arch module.
    import ast
    from pathlib import Path

    from nala_gen.sr.archs import fast

    for path in Path(fast.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").endswith("_arch"), (path, node.module)
    net = tiny_nalasr()
    with pytest.warns(DeprecationWarning, match="inference_form"):
        assert fast.inference_graph(net) is net.inference_form()
