"""The Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions and the 1x1 kernel of the SR inference graph against
PyTorch's direct convolution, each tile and each instruction set (AVX-512F, AVX2) this CPU runs."""

import pytest
import torch
import torch.nn.functional as F

from nala_gen.ops import RuntimeOptions, using, winograd
from nala_gen.ops.options import from_environ

needs_kernels = pytest.mark.skipif(winograd.unavailable_reason() is not None, reason=str(winograd.unavailable_reason()))


def isa_param(isa: str):
    """``isa`` as a test parameter, skipped where this CPU does not run that variant of the kernels."""
    runs = isa in winograd.instruction_sets(RuntimeOptions())
    return pytest.param(isa, marks=pytest.mark.skipif(not runs, reason=f"this CPU does not run the {isa} kernels"))


ISAS = [isa_param("avx512"), isa_param("avx2")]


def direct(x, weight, bias):
    """The reference: PyTorch's convolution in float64."""
    return F.conv2d(x.double(), weight.double(), None if bias is None else bias.double(), padding=1)


@needs_kernels
@pytest.mark.parametrize(
    ("batch", "c_in", "c_out", "height", "width"),
    [
        (1, 32, 32, 17, 23),  # odd sizes: the last row and column of 2x2 blocks are half outside
        (2, 16, 64, 8, 10),  # batch 2
        (1, 48, 32, 1, 1),  # one pixel: every tap but the centre is padding
        (1, 64, 160, 3, 130),  # more than one segment of blocks along a row (64 blocks = 128 px)
        (1, 32, 96, 2, 5),
        (1, 32, 16, 17, 23),  # 16 output channels: register tiles of 16 blocks x 16 channels
        (2, 16, 16, 5, 131),  # ... two segments along a row, the second of 2 blocks (padded to a register tile)
        (1, 64, 48, 3, 9),  # 48: three tiles of 16 channels
    ],
)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("algorithm", [winograd.WINOGRAD_4X4, winograd.WINOGRAD_2X2])
def test_matches_the_direct_convolution(batch, c_in, c_out, height, width, algorithm, isa):
    large_tile = algorithm == winograd.WINOGRAD_4X4
    if large_tile and c_in not in winograd.LARGE_TILE_CHANNELS:
        pytest.skip("F(4x4, 3x3) is compiled for 16 and 32 input channels")
    torch.manual_seed(0)
    x = torch.randn(batch, c_in, height, width).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(c_out, c_in, 3, 3) / (3 * c_in**0.5), torch.randn(c_out)
    with torch.inference_mode():
        assert winograd.applies(x, weight)
        assert algorithm in winograd.algorithms(x, weight)
        y = winograd.conv3x3(x, weight, bias, algorithm=algorithm, isa=isa)
        ours = (y.double() - direct(x, weight, bias)).abs().max().item()
        theirs = (F.conv2d(x, weight, bias, padding=1).double() - direct(x, weight, bias)).abs().max().item()
    assert y.shape == (batch, c_out, height, width) and y.is_contiguous(memory_format=torch.channels_last)
    # within float32 rounding, as PyTorch's own float32 convolution is (a wrong tap or transform is off by ~0.1);
    # F(4x4, 3x3)'s transforms have entries up to 8 and round up to ~10x wider than the direct convolution
    assert winograd.pack(weight, algorithm).shape == ((36 if large_tile else 16), c_in, c_out)
    assert ours < max((16 if large_tile else 4) * theirs, 1e-6), (ours, theirs)


def test_the_static_rule_packs_and_runs_the_large_tile_for_16_and_32_input_channels():
    for c_in, positions in ((16, 36), (32, 36), (48, 16), (144, 16)):
        x, weight = torch.randn(1, c_in, 4, 4), torch.randn(16, c_in, 3, 3)
        assert winograd.pack(weight).shape[0] == positions
        if winograd.enabled():
            expected = winograd.WINOGRAD_4X4 if positions == 36 else winograd.WINOGRAD_2X2
            assert winograd.static_algorithm(x, weight) == expected


@needs_kernels
def test_a_forced_kernel_that_cannot_run_raises_instead_of_running_another():
    x, weight = torch.randn(1, 48, 4, 4), torch.randn(32, 48, 3, 3)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="winograd4"):
            winograd.conv3x3(x, weight, algorithm=winograd.WINOGRAD_4X4)  # compiled for 16 and 32 channels only
        with pytest.raises(ValueError, match="pointwise"):
            winograd.conv1x1(x, torch.randn(32, 48, 1, 1), algorithm=winograd.POINTWISE)
        with pytest.raises(ValueError, match="sse"):
            winograd.conv3x3(x, weight, isa="sse")
        with pytest.raises(ValueError, match="avx512"):  # capped below it
            winograd.conv3x3(x, weight, runtime=RuntimeOptions(winograd_isa="avx2"), isa="avx512")
    with pytest.raises(ValueError, match="winograd2"):  # autograd: only the direct convolution runs
        winograd.conv3x3(x, weight.requires_grad_(), algorithm=winograd.WINOGRAD_2X2)


@needs_kernels
def test_the_options_cap_the_instruction_set():
    widest = winograd.instruction_sets(RuntimeOptions())
    assert widest and winograd.instruction_set(RuntimeOptions()) == widest[0]
    if "avx2" in widest:
        assert winograd.instruction_sets(RuntimeOptions(winograd_isa="avx2")) == ("avx2",)
        with using(winograd_isa="avx2"):
            assert winograd.instruction_set() == "avx2"
    assert winograd.instruction_sets(RuntimeOptions(winograd_isa="baseline")) == ()  # none of the kernels
    x, weight = torch.randn(1, 32, 4, 4), torch.randn(32, 32, 3, 3)
    assert not winograd.applies(x, weight, RuntimeOptions(winograd_isa="baseline"))
    assert winograd.algorithms(x, weight, RuntimeOptions(winograd_isa="baseline")) == (winograd.DIRECT,)
    assert from_environ({"NALA_GEN_WINOGRAD_ISA": "AVX2"}).winograd_isa == "avx2"


@needs_kernels
def test_the_other_tile_is_transformed_once_per_packed_weight():
    """A caller keeps the static rule's transform; a per-machine choice of the other tile transforms the weight once
    and keeps it beside that transform, until the transform changes in place."""
    torch.manual_seed(5)
    x, weight = torch.randn(1, 32, 9, 11), torch.randn(32, 32, 3, 3) / 17
    packed = winograd.pack(weight)
    assert packed.shape[0] == 36
    with torch.inference_mode():
        y = winograd.conv3x3(x, weight, packed=packed, algorithm=winograd.WINOGRAD_2X2)
        other = packed._nala_gen_other_tile[1]
        assert other.shape[0] == 16 and torch.equal(other, winograd.pack(weight, winograd.WINOGRAD_2X2))
        winograd.conv3x3(x, weight, packed=packed, algorithm=winograd.WINOGRAD_2X2)
        assert packed._nala_gen_other_tile[1] is other  # kept, not made again
        assert winograd.conv3x3(x, weight, packed=packed, algorithm=winograd.WINOGRAD_4X4) is not None
    assert (y.double() - direct(x, weight, None)).abs().max() < 1e-5
    weight.mul_(2)
    packed.copy_(winograd.pack(weight))
    with torch.inference_mode():
        y = winograd.conv3x3(x, weight, packed=packed, algorithm=winograd.WINOGRAD_2X2)
    assert packed._nala_gen_other_tile[1] is not other  # the transform changed: the other tile is made again
    assert (y.double() - direct(x, weight, None)).abs().max() < 2e-5


@needs_kernels
def test_row_slices_strided_inputs_and_no_bias():
    torch.manual_seed(1)
    full = torch.randn(1, 32, 20, 9).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(64, 32, 3, 3) / 17
    with torch.inference_mode():
        for x in (full[..., 3:11, :], torch.randn(1, 32, 9, 20).transpose(-1, -2)):  # a band of rows; NCHW strides
            y = winograd.conv3x3(x, weight)
            assert (y.double() - direct(x, weight, None)).abs().max() < 5e-5  # F(4x4, 3x3) at 32 channels


def test_falls_back_to_pytorch_where_the_kernels_do_not_apply():
    torch.manual_seed(2)
    x, weight = torch.randn(1, 32, 6, 6), torch.randn(32, 32, 3, 3)
    cases = {
        "float64": (x.double(), weight.double()),
        "24 output channels": (x, weight[:24]),
        "24 input channels": (x[:, :24], weight[:, :24]),
    }
    for name, (xi, wi) in cases.items():
        assert not winograd.applies(xi, wi), name
        assert torch.equal(winograd.conv3x3(xi, wi), F.conv2d(xi, wi, padding=1)), name
    grad = weight.clone().requires_grad_()
    assert not winograd.applies(x, grad)  # training: autograd needs PyTorch's convolution
    winograd.conv3x3(x, grad).sum().backward()
    assert grad.grad is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 inference keeps autocast's convolution
        assert not winograd.applies(x, weight)
        assert winograd.conv3x3(x, weight).dtype == torch.bfloat16
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:  # the board counts the network's FLOPs
        winograd.conv3x3(x, weight)
    assert counter.get_total_flops() == 2 * 32 * 36 * 32 * 9


@needs_kernels
def test_switched_off_by_the_options():
    x, weight = torch.randn(1, 32, 4, 4), torch.randn(32, 32, 3, 3)
    assert winograd.applies(x, weight)
    assert not winograd.applies(x, weight, RuntimeOptions(winograd=False))
    with using(winograd=False):
        assert not winograd.applies(x, weight) and not winograd.applies_1x1(x, torch.randn(32, 32, 1, 1))
    assert not winograd.applies(x, weight, from_environ({"NALA_GEN_WINOGRAD": "0"}))


@needs_kernels
def test_layer_keeps_its_transformed_weight_until_the_weight_changes():
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(32, 32, 3, padding=1)
    layer = winograd.winograd_layer(conv)
    assert isinstance(layer, winograd.WinogradConv3x3)
    x = torch.randn(1, 32, 7, 7)
    with torch.inference_mode():
        first = layer.packed()
        assert layer.packed() is first
        assert (layer(x).double() - direct(x, conv.weight, conv.bias)).abs().max() < 1e-5
    with torch.no_grad():
        conv.weight.mul_(2)
    with torch.inference_mode():
        assert layer.packed() is not first  # made again: the old transform would give the old convolution
        assert (layer(x).double() - direct(x, conv.weight, conv.bias)).abs().max() < 1e-5
    others = (torch.nn.Conv2d(32, 24, 3, padding=1), torch.nn.Conv2d(32, 32, 3, padding=2), torch.nn.Conv2d(32, 32, 1))
    for other in others:
        assert winograd.winograd_layer(other) is other  # shapes or layouts the kernels do not run stay as they are


@needs_kernels
@pytest.mark.parametrize(
    ("batch", "c_in", "c_out", "height", "width"),
    [
        (1, 144, 144, 9, 13),  # 117 pixels: a block of 64 and one of 53 (tails of 8- and 16-pixel tiles)
        (2, 32, 32, 4, 2),  # 8 pixels per image, 16 in all: 32-channel tiles whole, no tail
        (1, 144, 48, 1, 8),  # 48 = 32 + 16: both tile widths; 8 pixels: a tail for the 16-pixel tiles only
        (1, 32, 16, 5, 5),
        (1, 32, 32, 1, 13),  # 13 pixels: two 6-pixel AVX2 tiles and a tail of one
        (1, 144, 16, 2, 61),  # 122 pixels: a block of 64 (AVX2: 10 tiles of 6 and a tail of 4) and one of 58
    ],
)
@pytest.mark.parametrize("isa", ISAS)
def test_1x1_kernel_matches_the_direct_convolution(batch, c_in, c_out, height, width, isa):
    torch.manual_seed(4)
    x = torch.randn(batch, c_in, height, width).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(c_out, c_in, 1, 1) / c_in**0.5, torch.randn(c_out)
    with torch.inference_mode():
        assert winograd.applies_1x1(x, weight)
        y = winograd.conv1x1(x, weight, bias, algorithm=winograd.POINTWISE, isa=isa)
        reference = F.conv2d(x.double(), weight.double(), bias.double())
        ours = (y.double() - reference).abs().max().item()
        theirs = (F.conv2d(x, weight, bias).double() - reference).abs().max().item()
        unbiased = winograd.conv1x1(x, weight, isa=isa).double()
        assert (unbiased - reference + bias.double().view(1, -1, 1, 1)).abs().max() < 1e-5
    assert y.shape == (batch, c_out, height, width) and y.is_contiguous(memory_format=torch.channels_last)
    assert ours < max(4 * theirs, 1e-6), (ours, theirs)


def test_1x1_falls_back_to_pytorch_where_its_kernel_does_not_apply():
    x, weight = torch.randn(1, 48, 4, 4), torch.randn(32, 48, 1, 1)
    assert not winograd.applies_1x1(x, weight)  # 48 input channels: not compiled
    assert torch.equal(winograd.conv1x1(x, weight), F.conv2d(x, weight))
    assert not winograd.applies_1x1(x[:, :32], torch.randn(24, 32, 1, 1))  # 24 outputs: not a multiple of 16
