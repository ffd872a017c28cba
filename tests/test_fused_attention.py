"""The fused C++ NaLa op against the PyTorch path: forward and gradients for every shape class, odd inputs, dtypes.

The eager path (``using(fused=False)``, ``NALA_GEN_FUSED=0``) is itself pinned to the explicit O(N^2) reference by
test_attention, so agreement here to 1e-5 carries the fused op to the paper's formula.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nala_gen.attention import NaLaAttention, fused, linear_attention, reference_attention
from nala_gen.attention.kernels import kernel as kernel_spec
from nala_gen.attention.rope import rope_2d
from nala_gen.ops import RuntimeOptions, nala_fused, using


def test_the_fused_op_is_built_in_this_checkout():
    # `make install` builds it; if this fails, every other test here would only compare the eager path with itself.
    assert fused.available(), fused.unavailable_reason()
    assert fused.instruction_set() in ("avx512", "avx2", "baseline")


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_the_narrower_kernels_pass_the_same_checks(isa):
    # The op runs the widest kernels the CPU has (AVX-512 for heads of 16, 32, ... floats), so on such a CPU the
    # AVX2 and baseline kernels would go untested: NALA_GEN_FUSED_ISA caps the choice in a child process, which
    # runs this file's comparisons with the PyTorch path (forward, gradients, zero/tiny/huge inputs).
    if fused.instruction_set() == "baseline" and isa == "avx2":
        pytest.skip("this CPU has no AVX2")
    env = {**os.environ, "NALA_GEN_FUSED_ISA": isa}
    check = f"from nala_gen.attention import fused; assert fused.instruction_set() == {isa!r}"
    subprocess.run([sys.executable, "-c", check], env=env, check=True)
    selected = "fused_equals or zero_tiny or thread_count or key_pass or written_into or inference or streamed"
    tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", selected]
    proc = subprocess.run(tests, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


def _both_paths(fn):
    """fn() with the fused op on, then with it off (same inputs): the two results."""
    with using(fused=True):
        first = fn()
    with using(fused=False):
        second = fn()
    return first, second


def _grid(n: int) -> tuple[int, int]:
    h = max(1, int(n**0.5))
    while n % h:
        h -= 1
    return h, n // h


CASES = {
    "odd-N-rope": dict(b=2, h=3, n=77, d=32, dv=24, rope=True),
    "N-below-one-tile": dict(b=1, h=2, n=3, d=16, dv=16, rope=True),
    "several-tiles": dict(b=1, h=4, n=300, d=32, dv=32, rope=False),
    "d-not-multiple-of-8": dict(b=2, h=2, n=50, d=20, dv=7, rope=True),
    "dv-wider-than-d": dict(b=1, h=2, n=65, d=8, dv=72, rope=False),
    "direction-keys": dict(b=1, h=2, n=40, d=32, dv=32, rope=True, options={"key_map": "direction"}),
    "non-integer-power": dict(b=1, h=2, n=40, d=16, dv=16, rope=False, options={"lam": 2.5, "tau": 0.3}),
    "sqrt-d-angles": dict(b=1, h=2, n=40, d=32, dv=16, rope=True, options={"angle_scale": "sqrt_d"}),
    "fixed-norm-scale": dict(b=1, h=2, n=40, d=32, dv=16, rope=True, options={"norm_scale": 4.0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_the_pytorch_path_forward_and_gradients(case):
    c = CASES[case]
    torch.manual_seed(0)
    q = (torch.randn(c["b"], c["h"], c["n"], c["d"]) * 2).requires_grad_()
    k = (torch.randn(c["b"], c["h"], c["n"], c["d"]) * 2).requires_grad_()
    v = torch.randn(c["b"], c["h"], c["n"], c["dv"]).requires_grad_()
    rope = rope_2d(*_grid(c["n"]), 2 * c["d"]) if c["rope"] else None
    grad = torch.randn(c["b"], c["h"], c["n"], c["dv"])

    def run():
        out = linear_attention(q, k, v, rope=rope, **c.get("options", {}))
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad))

    fused_results, eager_results = _both_paths(run)
    for name, a, b in zip(("out", "dq", "dk", "dv"), fused_results, eager_results):
        scale = b.abs().max().clamp_min(1e-6)
        assert torch.isfinite(a).all(), name
        assert ((a - b).abs().max() / scale) < 1e-5, (name, ((a - b).abs().max() / scale).item())


def _with_extreme_rows(where: str, magnitude: float, n: int, d: int, dv: int) -> tuple[torch.Tensor, ...]:
    """Random q, k, v (1, 2, n, .) whose every third query or key row is zero or +-magnitude."""
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 2, n, d), torch.randn(1, 2, n, d), torch.randn(1, 2, n, dv)
    target = q if where == "queries" else k
    target[:, :, ::3] = target[:, :, ::3].sign() * magnitude if magnitude else 0.0
    return q, k, v


# Inference (no gradient to track) runs the op's forward_into: for heads that a vector does not divide, the kernels
# with the tokens in the lanes (nala_soa.inc); these shapes take that path (test_heads_of_18_take_the_soa_kernels).
SOA_CASES = {
    "nalasr-heads": dict(b=1, h=8, n=2100, d=18, dv=18, rope=True),  # 17 tiles of 128 tokens: all heads per item
    "soa-odd-N": dict(b=2, h=3, n=77, d=18, dv=18, rope=True),
    "soa-narrow-values": dict(b=1, h=2, n=300, d=18, dv=7, rope=False),
    "soa-direction-keys": dict(b=1, h=2, n=130, d=18, dv=18, rope=True, options={"key_map": "direction"}),
    "soa-non-integer-power": dict(b=1, h=2, n=130, d=18, dv=18, rope=False, options={"lam": 2.5, "tau": 0.3}),
    "soa-sqrt-d-angles": dict(b=1, h=2, n=130, d=18, dv=18, rope=True, options={"angle_scale": "sqrt_d"}),
    "soa-per-head-norm-scale": dict(
        b=1, h=3, n=130, d=18, dv=18, rope=True, options={"norm_scale": torch.tensor([1.5, 3.0, 6.0]).view(3, 1, 1)}
    ),
}


def test_heads_of_18_take_the_soa_kernels():
    if fused.instruction_set() == "baseline":  # 8-float vectors without FMA: the layouts' costs compare the same
        assert nala_fused.inference_layout(18, 18) in ("soa", "tiles")
        return
    assert nala_fused.inference_layout(18, 18) == "soa"
    assert nala_fused.inference_layout(32, 32) == "tiles"  # no padding to save


@pytest.mark.parametrize("case", list(CASES) + list(SOA_CASES))
def test_inference_equals_the_pytorch_path(case):
    c = {**CASES, **SOA_CASES}[case]
    torch.manual_seed(0)
    q, k = (torch.randn(c["b"], c["h"], c["n"], c["d"]) * 2 for _ in range(2))
    v = torch.randn(c["b"], c["h"], c["n"], c["dv"])
    rope = rope_2d(*_grid(c["n"]), 2 * c["d"]) if c["rope"] else None

    def run():
        with torch.inference_mode():
            return linear_attention(q, k, v, rope=rope, **c.get("options", {}))

    fused_out, eager_out = _both_paths(run)
    assert torch.isfinite(fused_out).all()
    assert ((fused_out - eager_out).abs().max() / eager_out.abs().max()) < 1e-5


@pytest.mark.parametrize("where", ["queries", "keys"])
@pytest.mark.parametrize("magnitude", [0.0, 1e-30, 5e3, 1e30])
def test_inference_on_zero_tiny_and_huge_vectors(where, magnitude):
    q, k, v = _with_extreme_rows(where, magnitude, n=150, d=18, dv=18)

    def run():
        with torch.inference_mode():
            return linear_attention(q, k, v)

    out_f, out_e = _both_paths(run)
    assert torch.isfinite(out_f).all()
    assert torch.allclose(out_f, out_e, rtol=1e-5, atol=1e-6), (out_f - out_e).abs().max()
    assert out_f.abs().max() <= v.abs().max() + 1e-5


def _at_one_and_two_threads(fn):
    """fn() with one thread, then with two or more: the two results."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fn()
        torch.set_num_threads(max(2, threads))
        return one, fn()
    finally:
        torch.set_num_threads(threads)


def test_inference_results_do_not_depend_on_the_thread_count():
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 3000, 18) for _ in range(3))

    def run():
        with torch.inference_mode():
            return linear_attention(q, k, v)

    one, many = _at_one_and_two_threads(run)
    assert torch.equal(one, many)


def test_a_per_head_norm_scale_gets_the_same_gradient():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 70, 32, requires_grad=True) for _ in range(3))
    gamma = torch.tensor([1.5, 3.0, 6.0]).view(3, 1, 1).requires_grad_()

    def run():
        out = linear_attention(q, k, v, norm_scale=gamma)
        return torch.autograd.grad(out.square().sum(), (q, gamma))

    (dq_f, dg_f), (dq_e, dg_e) = _both_paths(run)
    assert dg_f.shape == gamma.shape and torch.allclose(dg_f, dg_e, rtol=1e-5, atol=1e-6), (dg_f, dg_e)
    assert torch.allclose(dq_f, dq_e, rtol=1e-5, atol=1e-6)


def test_strided_projections_as_the_module_passes_them():
    """NaLaAttention hands q, k, v as strided views of one projection; the op reads them in place."""
    torch.manual_seed(2)
    block = NaLaAttention(64, 4, norm_scale="learned").train()
    x = torch.randn(2, 48, 64, requires_grad=True)

    def run():
        out = block(x, (6, 8))
        grads = torch.autograd.grad(out.square().sum(), (x, block.log_norm_scale, block.qkvg.weight))
        return (out.detach(), *grads)

    block(x, (6, 8))  # the first training batch starts the learned scale; both paths then see the same gamma
    for a, b in zip(*_both_paths(run)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()


INTO_CASES = {
    "per-head-items": dict(b=2, h=3, n=77, d=18, dv=18, rope=True, keys=2.0),
    "whole-token-items": dict(b=1, h=2, n=2100, d=18, dv=18, rope=True, keys=2.0),  # 33 tiles: all heads per item
    "raw-keys-rescaled": dict(b=1, h=2, n=90, d=16, dv=8, rope=False, keys=5e3),  # beyond RAW_KEY_LIMIT: rerun
}


@pytest.mark.parametrize("case", list(INTO_CASES))
def test_written_into_a_wider_map_with_an_addend(case):
    """out=/add= (inference): the attention plus LePE's output written into a head group's channels of a wider
    (B, N, C) map in one pass of the op, as the SR inference graph calls it; the map's other channels untouched."""
    c = INTO_CASES[case]
    b, h, n, d, dv = c["b"], c["h"], c["n"], c["d"], c["dv"]
    gen = torch.Generator().manual_seed(7)
    qkv = torch.randn(b, n, h, 3, d, generator=gen)  # heads side by side, q/k/v interleaved (HeadGroupedMix)
    q, k, v = (qkv[..., i, :].transpose(1, 2) for i in range(3))
    k, v = k * c["keys"], v[..., :dv]
    rope = rope_2d(*_grid(n), 2 * d) if c["rope"] else None
    add = torch.randn(b, n, h, dv, generator=gen).transpose(1, 2)  # a (B, N, h * dv) map's view
    sentinel = -7.0
    assert fused.writes_into(add, add, q, k, v)

    def run():
        wide = torch.full((b, n, 5 + h * dv + 3), sentinel)
        into = wide[..., 5 : 5 + h * dv].view(b, n, h, dv).transpose(1, 2)  # (B, h, N, dv), strided
        with torch.inference_mode():
            returned = linear_attention(q, k, v, rope=rope, out=into, add=add)
        assert returned.data_ptr() == into.data_ptr()
        return wide

    fused_wide, eager_wide = _both_paths(run)
    for wide in (fused_wide, eager_wide):
        assert (wide[..., :5] == sentinel).all() and (wide[..., -3:] == sentinel).all()
    expected = linear_attention(q, k, v, rope=rope) + add  # the eager path is pinned to the reference elsewhere
    got = fused_wide[..., 5 : 5 + h * dv].view(b, n, h, dv).transpose(1, 2)
    assert ((got - expected).abs().max() / expected.abs().max()) < 1e-5
    assert torch.allclose(eager_wide, fused_wide, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "case", ["odd-N-rope", "several-tiles", "d-not-multiple-of-8", "fixed-norm-scale"] + list(SOA_CASES)
)
def test_key_state_by_runs_then_queries_by_runs_equal_the_whole_attention(case):
    """The streamed inference entry (the SR graph's at large maps): key states of disjoint runs of tokens, each
    with its own RoPE rows, summed, then queries a run at a time through the sum, written with an addend into a
    strided map, equal the eager path over all tokens at once; a state that does not fit the queries is refused."""
    c = {**CASES, **SOA_CASES}[case]
    b, h, n, d, dv = c["b"], c["h"], c["n"], c["d"], c["dv"]
    torch.manual_seed(1)
    q, k = (torch.randn(b, h, n, d) * 2 for _ in range(2))
    v = torch.randn(b, h, n, dv)
    add = torch.randn(b, h, n, dv)
    rope = rope_2d(*_grid(n), 2 * d) if c["rope"] else None
    options = c.get("options", {})
    with torch.inference_mode(), using(fused=False):
        expected = linear_attention(q, k, v, rope=rope, **options) + add

    def rows(start, stop):
        return None if rope is None else (rope[0][start:stop], rope[1][start:stop])

    cuts = [0, n // 3, n // 3 + 1, n]  # a one-token run among them
    state = None
    for start, stop in zip(cuts, cuts[1:]):
        part, key_max = fused.key_state(k[:, :, start:stop], v[:, :, start:stop], rows(start, stop), **options)
        assert key_max.shape == (b * h,)
        state = part if state is None else state + part
    eps_total = kernel_spec("nala").denominator_eps * n
    wide = torch.zeros(b, n, h, dv + 2)
    out = wide[..., :dv].transpose(1, 2)  # (B, h, N, dv), strided
    for start, stop in ((0, n // 2), (n // 2, n)):
        piece = out[:, :, start:stop]
        fused.query_into(
            q[:, :, start:stop], state, rows(start, stop), eps_total, piece, add[:, :, start:stop], **options
        )
    assert (wide[..., dv:] == 0).all()
    assert ((out - expected).abs().max() / expected.abs().max()) < 1e-5
    with pytest.raises(RuntimeError, match="state does not fit"):
        fused.query_into(q, state[1:], rows(0, n), eps_total, torch.empty(b, h, n, dv), **options)


def test_out_and_add_follow_torch_semantics_on_every_path():
    torch.manual_seed(8)
    q, k, v = (torch.randn(1, 2, 30, 16) for _ in range(3))
    add = torch.randn(1, 2, 30, 16)
    for kernel in ("nala", "relu", "softmax"):
        expected = linear_attention(q, k, v, kernel=kernel) + add
        assert torch.allclose(linear_attention(q, k, v, kernel=kernel, add=add), expected, atol=1e-6)
        out = torch.empty(1, 2, 30, 16)
        assert linear_attention(q, k, v, kernel=kernel, out=out, add=add) is out
        assert torch.allclose(out, expected, atol=1e-6), kernel
    q.requires_grad_()
    assert not fused.writes_into(out, None, q, k, v)  # a gradient to track: the op's out= path is not taken


@pytest.mark.parametrize("where", ["queries", "keys"])
@pytest.mark.parametrize("magnitude", [0.0, 1e-30, 5e3, 1e30])
def test_zero_tiny_and_huge_vectors(where, magnitude):
    q, k, v = _with_extreme_rows(where, magnitude, n=30, d=16, dv=8)
    q.requires_grad_()
    k.requires_grad_()

    def run():
        out = linear_attention(q, k, v)
        return (out.detach(), *torch.autograd.grad(out.sum(), (q, k)))

    (out_f, dq_f, dk_f), (out_e, _, _) = _both_paths(run)
    assert torch.isfinite(out_f).all() and torch.isfinite(dq_f).all() and torch.isfinite(dk_f).all()
    assert torch.allclose(out_f, out_e, rtol=1e-5, atol=1e-6), (out_f - out_e).abs().max()
    # Each row of weights is a distribution, so outputs stay within the values' range.
    assert out_f.abs().max() <= v.abs().max() + 1e-5


def test_key_pass_reports_each_heads_largest_key_component():
    # The overflow check of the raw key power reads this instead of making a pass over the keys of its own.
    torch.manual_seed(6)
    q, v = torch.randn(2, 3, 70, 16), torch.randn(2, 3, 70, 8)
    k = torch.randn(2, 3, 70, 12) * torch.tensor([1.0, 10.0, 1e4]).view(1, 3, 1, 1)
    k[1, 2, 69, 11] = -3e4  # the last, partial tile; a negative component
    empty = torch.empty(0)
    expected = k.abs().amax(dim=(-2, -1)).reshape(-1)
    *_, key_max = nala_fused.op().forward(q[..., :12], k, v, empty, empty, torch.ones(3), 3.0, 0.5, 1.0, True, 0.0)
    assert torch.equal(key_max, expected)
    for d in (12, 18):  # the inference entry's two layouts
        qd, kd = (torch.nn.functional.pad(t[..., :12], (0, d - 12)) for t in (q, k))
        out = torch.empty(2, 3, 70, 8)
        arguments = (empty, empty, torch.ones(3), 3.0, 0.5, 1.0, True, 0.0, out, empty)
        key_max = nala_fused.op().forward_into(qd, kd, v, *arguments)
        assert torch.equal(key_max, expected), d


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_compute_in_float32_and_return_their_dtype(dtype):
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 40, 32).to(dtype) for _ in range(3))
    out_f, out_e = _both_paths(lambda: linear_attention(q, k, v))
    assert out_f.dtype == dtype
    assert torch.allclose(out_f.float(), out_e.float(), atol=1e-2)


def test_results_do_not_depend_on_the_thread_count():
    torch.manual_seed(5)
    # few heads, many tiles: work split within heads; inputs that need a gradient take the training forward
    q, k, v = (torch.randn(1, 2, 3000, 32, requires_grad=True) for _ in range(3))
    one, many = _at_one_and_two_threads(lambda: linear_attention(q, k, v).detach())
    assert torch.equal(one, many)


def test_without_the_op_the_pytorch_path_answers(monkeypatch):
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 50, 16) for _ in range(3))
    monkeypatch.setattr(nala_fused, "_op", None)
    assert not fused.enabled()
    assert torch.allclose(linear_attention(q, k, v), reference_attention(q, k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore")
def test_tracing_sees_pytorch_ops_not_the_op():
    """torch.jit.trace / ONNX export / torch.compile must see the PyTorch path (the C++ op is opaque to them)."""
    q, k, v = (torch.randn(1, 2, 20, 16) for _ in range(3))
    traced = torch.jit.trace(lambda q, k, v: linear_attention(q, k, v), (q, k, v), check_trace=False)
    assert "nala_fused" not in str(traced.graph) and "aten::matmul" in str(traced.graph)
    assert torch.allclose(traced(q, k, v), linear_attention(q, k, v), rtol=1e-5, atol=1e-6)


def test_the_time_split_diagnostic_runs_and_reports_each_part():
    """scripts/op_time_split.py (quoted by docs/results/attention.md) on a small shape: every part is timed."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "op_time_split.py"
    cmd = [sys.executable, str(script), "--shapes", "600x2x18", "--rounds", "1", "--threads", "1"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = [line for line in result.stdout.splitlines() if line.strip().startswith("600x2x18:")]
    assert len(summary) == 1, result.stdout
    for part in ("key", "query", "into", "op", "fresh", "relu"):
        assert float(summary[0].split(f" {part} ")[1].split()[0]) > 0, summary[0]


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_within_a_pass_a_freed_output_serves_the_next_without_page_faults():
    """The one answer to fresh-page faults (``reused_large_temporaries``, as the engine runs a pass) covers the op's
    outputs too: later calls' outputs, and later backwards' gradients, reuse freed pages. The blocks are 64 MiB,
    above glibc's largest dynamic mmap threshold (32 MiB), so without the scope each is a fresh mapping whose pages
    fault in on every call (``pages`` per output, ``3 * pages`` per backward); smaller blocks reuse the heap by
    glibc's own threshold after a few calls, which would make the check blind to the scope. Counted over four
    calls after two to warm up, allowing for the odd block glibc places in fresh heap pages: at most half of what
    four calls fault in without the scope."""
    from nala_gen.profiling import reused_large_temporaries

    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 4, 131072, 32) for _ in range(3))
    pages = q.numel() * 4 // 4096
    with reused_large_temporaries():
        with torch.inference_mode():
            expected = linear_attention(q, k, v).clone()
            linear_attention(q, k, v)
            before = _minor_faults()
            for _ in range(4):
                assert torch.equal(linear_attention(q, k, v), expected)
            assert _minor_faults() - before < 2 * pages  # without the scope: 4 * pages
        for t in (q, k, v):
            t.requires_grad_()
        grad = torch.randn_like(v)
        linear_attention(q, k, v).backward(grad)
        first = [t.grad.clone() for t in (q, k, v)]
        q.grad = k.grad = v.grad = None  # as a training step does once the gradients are applied
        linear_attention(q, k, v).backward(grad)
        q.grad = k.grad = v.grad = None
        before = _minor_faults()
        for _ in range(4):
            linear_attention(q, k, v).backward(grad)
            assert all(torch.equal(t.grad, f) for t, f in zip((q, k, v), first))
            q.grad = k.grad = v.grad = None
        assert _minor_faults() - before < 6 * pages  # without the scope: 12 * pages


def test_a_memory_measurement_shows_an_output_made_after_an_earlier_one():
    """A call measured after an earlier one (the app's live runs, the benchmarks) still shows its output in the peak."""
    from nala_gen.profiling import PeakMemory

    torch.manual_seed(11)
    q, k, v = (torch.randn(1, 4, 16384, 32) for _ in range(3))  # an 8 MiB output
    with torch.inference_mode():
        linear_attention(q, k, v)  # freed at once
        with PeakMemory("cpu") as memory:
            out = linear_attention(q, k, v)
    assert memory.peak_bytes >= 0.9 * out.numel() * 4


def test_an_output_larger_than_the_cache_is_streamed_with_the_same_values():
    """Above the last-level cache's size the query pass writes its output by non-temporal stores (whole cache lines
    only): the values must be those of the ordinary stores, with and without an addend, and the PyTorch path's."""
    threshold = fused.stream_threshold_bytes()
    if threshold > 128 << 20:
        pytest.skip(f"a {threshold >> 20} MiB last-level cache: a streamed output would be too large for a test")
    heads, dim = 4, 32
    tokens = threshold // (heads * dim * 4) + 100  # just over: not a multiple of the op's tiles either
    torch.manual_seed(12)
    q, k, v, extra = (torch.randn(1, heads, tokens, dim) for _ in range(4))
    with torch.inference_mode():
        streamed = linear_attention(q, k, v)
        assert fused.streams_output(streamed)
        line_off = torch.empty(q.numel() + 1)[1:].view(q.shape)  # one float past a cache line: ordinary stores
        assert not fused.streams_output(line_off)
        assert not fused.streams_output(torch.empty(1, 2 * heads, tokens, 24))  # rows of 1.5 lines: not streamed
        assert torch.equal(linear_attention(q, k, v, out=line_off), streamed)
        with_addend = torch.empty_like(q)
        assert fused.streams_output(with_addend)
        linear_attention(q, k, v, out=with_addend, add=extra)
        assert torch.equal(with_addend, linear_attention(q, k, v, out=line_off, add=extra))
        assert torch.allclose(with_addend, streamed + extra, rtol=1e-6, atol=1e-7)  # one rounding of a*x+b, not two
        small = linear_attention(q[:, :, :4096], k, v)
        assert not fused.streams_output(small)  # a cache-sized output stays in the cache for its reader
    trained = linear_attention(q.requires_grad_(), k, v)  # the training forward streams its output too
    assert fused.streams_output(trained) and torch.allclose(trained, streamed, rtol=1e-5, atol=1e-6)
    with using(fused=False):
        assert torch.allclose(linear_attention(q.detach(), k, v), streamed, rtol=1e-5, atol=1e-6)


def test_the_build_comparison_diagnostic_times_each_module(tmp_path):
    """scripts/op_ab.py (quoted by docs/kernel.md), given the installed module twice: both load under names of
    their own, take turns, and the first is the base of the ratios."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "op_ab.py"
    module = Path(nala_fused._op.__file__)
    twin = tmp_path / module.name
    twin.write_bytes(module.read_bytes())
    cmd = [sys.executable, str(script), "--so", str(module), str(twin), "--shapes", "600x2x18", "--rounds", "2"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("600x2x18")]
    assert len(lines) == 2, result.stdout
    assert "x1.000" in lines[0].split(" into ")[1].split(" op ")[0]  # the base against itself
    for line in lines:
        assert float(line.split(" op ")[1].split()[0]) > 0, line


def test_a_backward_runs_the_kernels_of_its_forward_whatever_the_options_are_by_then():
    """The state a forward saves is laid out for its kernels' vector width: the backward must pick the same ones
    even when the options in force changed in between (a capped forward, an uncapped backward)."""
    if nala_fused.instruction_set() == "baseline":
        pytest.skip("no wider kernels on this CPU: every cap runs the same ones")
    torch.manual_seed(13)
    q, k, v = (torch.randn(1, 2, 200, 18, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 2, 200, 18)
    with using(fused=False):
        linear_attention(q, k, v).backward(grad)
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    with using(fused_isa="baseline"):
        out = linear_attention(q, k, v)
    out.backward(grad)
    assert all(torch.allclose(t.grad, e, rtol=1e-4, atol=1e-5) for t, e in zip((q, k, v), expected))
    out = linear_attention(q, k, v, runtime=RuntimeOptions(fused_isa="baseline"))  # passed, not in force
    for t in (q, k, v):
        t.grad = None
    out.backward(grad)
    assert all(torch.allclose(t.grad, e, rtol=1e-4, atol=1e-5) for t, e in zip((q, k, v), expected))
