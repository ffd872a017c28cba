"""Every kernel that may run one of NaLaSR's convolutions computes it: each is forced on the shapes the fast form
runs (each Winograd tile, the 1x1 kernel, the direct convolution; AVX-512 and AVX2 where this CPU runs them) and
compared with the direct convolution, and the whole fast form with the AVX2 kernels forced keeps to the plain
layers."""

import pytest
import torch
import torch.nn.functional as F

from nala_gen.ops import RuntimeOptions, using, winograd
from nala_gen.sr.archs.nalasr_arch import NaLaSR

TOL = 1e-5
needs_kernels = pytest.mark.skipif(winograd.unavailable_reason() is not None, reason=str(winograd.unavailable_reason()))
CPU_ISAS = winograd.instruction_sets(RuntimeOptions())


def within_tol(ours: torch.Tensor, reference: torch.Tensor) -> bool:
    """Within TOL of the reference relative to its largest magnitude where that exceeds 1 (float32 rounding, the
    F(4x4, 3x3) transforms' above all, scales with the values)."""
    return (ours.double() - reference).abs().max().item() <= TOL * max(1.0, reference.abs().max().item())


def small_nalasr(seed: int = 0) -> NaLaSR:
    """NaLaSR-light's layout (32 features, so its 3x3 and 1x1 shapes are the shipped network's) with one block and
    random weights away from their initial values."""
    torch.manual_seed(seed)
    net = NaLaSR(upscale=4, num_block=1)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net.eval()


def fast_form_shapes(monkeypatch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(input shape, weight shape) of every 3x3 and 1x1 convolution the fast form asks the kernels about in one
    pass, each (input channels, output channels, kernel size) once."""
    seen: dict[tuple, tuple] = {}
    algorithms = winograd.algorithms

    def recording(x, weight, runtime=None):
        seen.setdefault((x.shape[1], weight.shape[0], weight.shape[-1]), (tuple(x.shape), tuple(weight.shape)))
        return algorithms(x, weight, runtime)

    net = small_nalasr()
    monkeypatch.setattr(winograd, "algorithms", recording)
    with torch.inference_mode():
        net.inference_form()(torch.rand(1, 3, 21, 26))
    monkeypatch.setattr(winograd, "algorithms", algorithms)
    return list(seen.values())


@pytest.fixture(scope="module")
def network_shapes():
    with pytest.MonkeyPatch.context() as monkeypatch:
        return fast_form_shapes(monkeypatch)


def test_the_fast_form_asks_about_its_3x3_and_1x1_convolutions(network_shapes):
    kernels = {weight[-1] for _, weight in network_shapes}
    assert kernels == {1, 3}, network_shapes
    assert len(network_shapes) >= 6, network_shapes  # the body's, the transformer's, the attention's


@needs_kernels
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_each_kernel_computes_each_of_the_networks_convolutions(network_shapes, isa):
    if isa not in CPU_ISAS:
        pytest.skip(f"this CPU does not run the {isa} kernels")
    forced = set()
    for number, (x_shape, w_shape) in enumerate(network_shapes):
        gen = torch.Generator().manual_seed(number)
        x = torch.randn(x_shape, generator=gen).contiguous(memory_format=torch.channels_last)
        weight = torch.randn(w_shape, generator=gen) / (w_shape[-1] * w_shape[1] ** 0.5)
        bias = torch.randn(w_shape[0], generator=gen)
        padding = w_shape[-1] // 2
        reference = F.conv2d(x.double(), weight.double(), bias.double(), padding=padding)
        run = winograd.conv3x3 if w_shape[-1] == 3 else winograd.conv1x1
        with torch.inference_mode():
            for algorithm in winograd.algorithms(x, weight):
                out = run(x, weight, bias, algorithm=algorithm, isa=None if algorithm == winograd.DIRECT else isa)
                assert out.shape == reference.shape, (x_shape, w_shape, algorithm)
                assert within_tol(out, reference), (x_shape, w_shape, algorithm, isa)
                forced.add(algorithm)
    # the network has shapes for every kernel: a test that forced fewer would pass on a broken one
    assert forced == {winograd.WINOGRAD_4X4, winograd.WINOGRAD_2X2, winograd.POINTWISE, winograd.DIRECT}, forced


class CountingOp:
    """The compiled kernels, counting the instruction set each call names."""

    def __init__(self, op) -> None:
        self.op, self.calls = op, []

    def instruction_sets(self):
        return self.op.instruction_sets()

    def conv3x3(self, x, packed, bias, isa=""):
        self.calls.append(("conv3x3", isa))
        return self.op.conv3x3(x, packed, bias, isa)

    def conv1x1(self, x, weight_t, bias, isa=""):
        self.calls.append(("conv1x1", isa))
        return self.op.conv1x1(x, weight_t, bias, isa)


@needs_kernels
@pytest.mark.skipif("avx2" not in CPU_ISAS, reason="this CPU does not run the AVX2 kernels")
def test_the_fast_form_with_the_avx2_kernels_keeps_to_the_plain_layers(monkeypatch):
    net = small_nalasr(seed=1)
    x = torch.rand(2, 3, 19, 24, generator=torch.Generator().manual_seed(2))
    counting = CountingOp(winograd._op)
    monkeypatch.setattr(winograd, "_op", counting)
    with torch.inference_mode(), using(winograd_isa="avx2"):
        plain, fast = net.forward_layers(x), net.inference_form()(x)
    assert within_tol(fast, plain.double())
    kinds = {kind for kind, _ in counting.calls}
    assert kinds == {"conv3x3", "conv1x1"} and {isa for _, isa in counting.calls} == {"avx2"}, counting.calls
