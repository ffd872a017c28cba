"""Every kernel that may run one of NaLaSR's convolutions computes it: each is forced on the shapes the fast form
runs (each Winograd tile, the 1x1 kernel, the direct convolution; AVX-512 and AVX2 where this CPU runs them) and
compared with the direct convolution, and the whole fast form with the AVX2 kernels forced keeps to the plain
layers. Then the per-machine choice among them (nala_gen.sr.archs.fast.conv_choice): each shape timed once and the
choice kept in a file for later processes, under a key of the CPU, torch, threads, options and code; nothing timed
under the static choice; a corrupt file or a choice this machine cannot run timed again."""

import json

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


# --- the per-machine choice (nala_gen.sr.archs.fast.conv_choice): probed once, kept, keyed, harmless ---


@pytest.fixture
def choice_cache(tmp_path, monkeypatch):
    """A cache file of this test's own, and no choice held in the process before or after it."""
    from nala_gen.sr.archs.fast import conv_choice

    path = tmp_path / "cache" / "conv_choice.json"
    monkeypatch.setenv(conv_choice.CACHE_ENV, str(path))
    conv_choice.forget()
    yield path
    conv_choice.forget()


def a_shape(side=20):
    """One of the body's 3x3 convolutions: 32 channels in and out, channels-last as the fast form runs it."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 32, side, side, generator=gen).contiguous(memory_format=torch.channels_last)
    return x, torch.randn(32, 32, 3, 3, generator=gen) / 32


class ProbeCounter:
    def __init__(self, probe) -> None:
        self.probe, self.calls = probe, 0

    def __call__(self, *args):
        self.calls += 1
        return self.probe(*args)


@needs_kernels
def test_a_shape_is_timed_once_and_the_choice_kept_for_the_next_process(choice_cache, monkeypatch):
    from nala_gen.sr.archs.fast import conv_choice

    counter = ProbeCounter(conv_choice._probe)
    monkeypatch.setattr(conv_choice, "_probe", counter)
    x, weight = a_shape()
    with using(conv_choice="probe") as options:
        chosen = conv_choice.choose(x, weight)
        assert conv_choice.choose(x, weight) == chosen and counter.calls == 1  # held in the process
        stored = json.loads(choice_cache.read_text())
        (entry,) = stored.values()
        shape = entry["shapes"][conv_choice.shape_key(x, weight)]
        assert set(shape["seconds"]) == set(conv_choice.candidates(x, weight, options))
        assert len(shape["seconds"]) >= 3 and shape["choice"] == min(shape["seconds"], key=shape["seconds"].get)
        assert shape["probe_seconds"] >= sum(shape["seconds"].values())
        assert entry["machine"]["cpu"] and entry["machine"]["torch"] == torch.__version__
        conv_choice.forget()  # as a new process: read from the file, timed no more
        assert conv_choice.choose(x, weight) == chosen and counter.calls == 1
    # and the kernel it names computes the convolution
    out = conv_choice.conv3x3(x, weight)
    reference = F.conv2d(x.double(), weight.double(), padding=1)
    assert within_tol(out, reference)


@needs_kernels
def test_the_static_choice_times_nothing_and_writes_nothing(choice_cache, monkeypatch):
    from nala_gen.sr.archs.fast import conv_choice

    def no_probe(*args):
        raise AssertionError("timed under the static choice")

    monkeypatch.setattr(conv_choice, "_probe", no_probe)
    x, weight = a_shape()
    with using(conv_choice="static"):
        assert conv_choice.choose(x, weight) is None
        out = conv_choice.conv3x3(x, weight)
    assert within_tol(out, F.conv2d(x.double(), weight.double(), padding=1))
    assert not choice_cache.exists()


@needs_kernels
def test_other_options_or_size_classes_are_timed_apart(choice_cache, monkeypatch):
    from nala_gen.sr.archs.fast import conv_choice

    counter = ProbeCounter(conv_choice._probe)
    monkeypatch.setattr(conv_choice, "_probe", counter)
    small, weight = a_shape(side=20)
    medium, _ = a_shape(side=60)
    assert conv_choice.size_class(small) != conv_choice.size_class(medium)
    with using(conv_choice="probe"):
        conv_choice.choose(small, weight)
        conv_choice.choose(medium, weight)
        assert counter.calls == 2
        with using(winograd_isa="avx2" if "avx2" in CPU_ISAS else "baseline"):
            if len(winograd.algorithms(small, weight)) >= 2:
                conv_choice.choose(small, weight)
                assert counter.calls == 3
                assert len(json.loads(choice_cache.read_text())) == 2  # one machine key per option set


@needs_kernels
def test_a_corrupt_cache_is_timed_again_and_rewritten(choice_cache):
    from nala_gen.sr.archs.fast import conv_choice

    choice_cache.parent.mkdir(parents=True)
    choice_cache.write_text("{not json")
    x, weight = a_shape()
    with using(conv_choice="probe"):
        assert conv_choice.choose(x, weight) is not None
    (entry,) = json.loads(choice_cache.read_text()).values()
    assert conv_choice.shape_key(x, weight) in entry["shapes"]


@needs_kernels
def test_a_cached_choice_this_machine_cannot_run_is_timed_again(choice_cache, monkeypatch):
    """A file edited by hand (or by a build with other kernels) names a kernel not among this call's candidates."""
    from nala_gen.sr.archs.fast import conv_choice

    x, weight = a_shape()
    with using(conv_choice="probe") as options:
        conv_choice.choose(x, weight)
        stored = json.loads(choice_cache.read_text())
        (key,) = stored
        stored[key]["shapes"][conv_choice.shape_key(x, weight)]["choice"] = "winograd9/avx1024"
        choice_cache.write_text(json.dumps(stored))
        conv_choice.forget()
        algorithm, isa = conv_choice.choose(x, weight)
        assert f"{algorithm}/{isa}" in conv_choice.candidates(x, weight, options) or algorithm == winograd.DIRECT


@needs_kernels
def test_the_fast_form_keeps_to_the_plain_layers_whatever_the_probe_chose(choice_cache):
    net = small_nalasr(seed=4)
    x = torch.rand(1, 3, 23, 19, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode(), using(conv_choice="probe"):
        plain, fast = net.forward_layers(x), net.inference_form()(x)
    assert within_tol(fast, plain.double())
    (entry,) = json.loads(choice_cache.read_text()).values()
    assert len(entry["shapes"]) >= 4
