"""The NaLa attention core: the linear form against the explicit one, and the kernel properties."""

import shutil

import pytest
import torch

from nala_gen.attention import (
    NaLaAttention,
    NaLaBlock,
    attention_entropy,
    attention_weights,
    entropy_vs_query_norm,
    kernel_names,
    linear_attention,
    query_norm_entropy,
    record_queries_keys,
    reference_attention,
    rope_2d,
)
from nala_gen.ops import RuntimeOptions

LINEAR = [k for k in kernel_names() if k != "softmax"]


def qkv(b=2, h=3, n=37, d=16, dv=8, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, x, generator=gen).to(dtype) for x in (d, d, dv))


@pytest.mark.parametrize("kernel", kernel_names())
def test_linear_equals_explicit(kernel):
    # Chunks smaller than N exercise the streaming path. Tolerance: 1e-5 absolute in fp32.
    q, k, v = qkv()
    fast = linear_attention(q, k, v, kernel=kernel, chunk_size=10)
    slow = reference_attention(q, k, v, kernel=kernel)
    assert fast.shape == (2, 3, 37, 8)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["nala", "nala_split", "relu", "softmax"])
def test_linear_equals_explicit_with_rope(kernel):
    q, k, v = qkv(n=5 * 7)
    from nala_gen.attention import feature_dim

    rope = rope_2d(5, 7, feature_dim(kernel, 16))
    fast = linear_attention(q, k, v, kernel=kernel, rope=rope, chunk_size=8)
    slow = reference_attention(q, k, v, kernel=kernel, rope=rope)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", kernel_names())
def test_weights_are_a_distribution(kernel):
    q, k, _ = qkv()
    w = attention_weights(q, k, kernel)
    assert (w >= 0).all()
    # nala_split keeps the release's epsilon (1e-6 per key in the denominator): its rows fall short by ~N * 1e-6.
    atol = 1e-3 if kernel == "nala_split" else 1e-5
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=atol, rtol=0)


def test_nala_is_the_papers_map():
    # theta = (pi/4) tanh(u) on the unit direction, |u|^p(q) for queries, raw |k|^lam for keys (defaults).
    import math

    from nala_gen.attention import feature_map

    x = torch.randn(5, 8)
    norm = x.norm(dim=-1, keepdim=True)
    u = x / norm
    theta = math.pi / 4 * torch.tanh(u)
    phi = feature_map("nala")
    m_q = u.abs() ** (3 * (0.5 + torch.tanh(norm)))
    torch.testing.assert_close(phi(x, True), torch.cat((m_q * theta.cos(), m_q * theta.sin()), -1))
    m_k = x.abs() ** 3
    torch.testing.assert_close(phi(x, False), torch.cat((m_k * theta.cos(), m_k * theta.sin()), -1))
    # The options by name: direction-only keys, and our sqrt(d) scale inside the angle.
    m_dir = u.abs() ** 3
    by_direction = torch.cat((m_dir * theta.cos(), m_dir * theta.sin()), -1)
    torch.testing.assert_close(phi(x, False, key_map="direction"), by_direction)
    wide = math.pi / 4 * torch.tanh(math.sqrt(8) * u)
    torch.testing.assert_close(phi(x, True, angle_scale="sqrt_d"), torch.cat((m_q * wide.cos(), m_q * wide.sin()), -1))
    with pytest.raises(ValueError, match="key_map"):
        phi(x, False, key_map="norm")


def test_raw_keys_weigh_a_longer_key_more_direction_keys_do_not():
    q = torch.randn(1, 1, 3, 8)
    k = torch.randn(1, 1, 1, 8).repeat(1, 1, 2, 1)
    k[..., 1, :] *= 2  # the same direction, twice as long
    raw = attention_weights(q, k, "nala", key_map="raw")
    direction = attention_weights(q, k, "nala", key_map="direction")
    torch.testing.assert_close(raw[..., 1] / raw[..., 0], torch.full((1, 1, 3), 8.0))  # 2^lam
    torch.testing.assert_close(direction[..., 1] / direction[..., 0], torch.ones(1, 1, 3))


@pytest.mark.parametrize("key_map", ["raw", "direction"])
@pytest.mark.parametrize("scale", [1e4, 1e30])
def test_raw_key_powers_do_not_overflow(key_map, scale):
    q, k, v = qkv()
    out = linear_attention(q, k * scale, v, "nala", key_map=key_map)
    assert torch.isfinite(out).all()
    # Rescaling keys leaves a raw-power kernel's weights unchanged, so huge keys give the same output.
    torch.testing.assert_close(out, linear_attention(q, k, v, "nala", key_map=key_map), atol=1e-5, rtol=1e-4)


def test_nala_split_is_the_released_map_and_normaliser():
    # The release's equations, written out: keys cubed raw, queries on the unit direction with the norm-aware
    # power, z = 1 / (phi(q) . mean_j phi(k_j) + 1e-6), output phi(q) (k^T v / N) z.
    q, k, v = (t.double() for t in qkv(n=29))
    k3 = k**3
    q_norm = q.norm(dim=-1, keepdim=True)
    power = 3 * (0.5 + torch.tanh(q_norm))
    phi_q = torch.cat((torch.relu(q / q_norm) ** power, torch.relu(-q / q_norm) ** power), -1)
    phi_k = torch.cat((torch.relu(k3), torch.relu(-k3)), -1)
    n = k.shape[-2]
    z = 1 / (phi_q @ phi_k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
    expected = phi_q @ ((phi_k.transpose(-2, -1) * n**-0.5) @ (v * n**-0.5)) * z
    torch.testing.assert_close(linear_attention(q, k, v, "nala_split", chunk_size=8), expected)
    torch.testing.assert_close(reference_attention(q, k, v, "nala_split"), expected)


@pytest.mark.parametrize("kernel", ["nala", "nala_split"])
def test_rope_breaks_non_negativity_as_documented(kernel):
    # RoPE rotates the numerator features only: some effective weights turn negative and rows stop summing to
    # one. Measured on random inputs (16 x 16 grid, d 16): the docstrings say so; this pins that it happens.
    from nala_gen.attention import feature_dim

    q, k, _ = qkv(b=1, h=2, n=256, d=16)
    rope = rope_2d(16, 16, feature_dim(kernel, 16))
    plain = attention_weights(q, k, kernel)
    rotated = attention_weights(q, k, kernel, rope=rope)
    assert (plain >= 0).all()
    negative = (rotated < 0).float().mean().item()
    sums = rotated.sum(-1)
    assert 0.01 < negative < 0.5, negative
    assert (sums - 1).abs().max() > 0.05


@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e-8])
def test_rows_sum_to_one_for_tiny_queries(scale):
    # The norm must not bias the normalisation: a zero or near-zero query still gets a distribution.
    q, k, _ = qkv()
    w = attention_weights(q * scale, k, "nala")
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-4, rtol=0)


def test_nala_entropy_falls_with_query_norm_relu_does_not():
    norms = torch.linspace(0.1, 2.5, 12)
    result = entropy_vs_query_norm(("nala", "nala_split", "relu", "softmax"), norms=norms)
    for kernel in ("nala", "nala_split", "softmax"):
        ent = torch.tensor(result[kernel]["entropy"], dtype=torch.float64)
        assert (ent[1:] < ent[:-1]).all(), f"{kernel} entropy is not strictly decreasing: {ent}"
    relu = torch.tensor(result["relu"]["entropy"], dtype=torch.float64)
    assert (relu - relu[0]).abs().max() < 1e-12


def test_entropy_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "entropy.png"
    entropy_vs_query_norm(("nala", "relu"), save_png=png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_entropy_of_uniform_weights():
    # Identical keys give uniform weights: entropy log(N), for any kernel.
    q = torch.randn(1, 1, 4, 8)
    k = torch.ones(1, 1, 16, 8)
    ent = attention_entropy(q, k, "nala")
    torch.testing.assert_close(ent, torch.full_like(ent, torch.log(torch.tensor(16.0)).item()).double())


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_feature_map_matches_eager():
    off = RuntimeOptions(fused=False)  # on a CPU the C++ op would answer both calls
    q, k, v = qkv(b=1, h=2, n=50, d=16)
    q[0, 0, 3] = 0  # the zero query takes the eager code's slow path; the fused one has no branch
    eager = linear_attention(q, k, v, "nala", chunk_size=32, runtime=off)
    # chunks of 32 and 18 tokens
    fused = linear_attention(q, k, v, "nala", chunk_size=32, compile=True, runtime=off)
    torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)


def test_record_queries_keys_sees_a_modules_real_queries():
    attn = NaLaAttention(16, num_heads=2).eval()
    x = torch.randn(2, 5 * 7, 16)
    attn(x, (5, 7))  # outside the block: nothing kept
    with record_queries_keys() as records:
        attn(x, (5, 7))
    attn(x, (5, 7))
    assert len(records) == 1
    q, k = records[0].q, records[0].k
    assert q.shape == k.shape == (2, 2, 35, 8) and not q.requires_grad
    assert records[0].kernel == "nala"
    # They are the module's own projections: recompute q from the qkv layer.
    expected_q = attn.qkvg(x).reshape(2, 35, 4, 2, 8)[:, :, 0].transpose(1, 2)
    torch.testing.assert_close(q, expected_q.detach())


def test_query_norm_entropy_relu_is_blind_to_scale_nala_and_softmax_are_not():
    q, k, _ = qkv(b=2, h=2, n=24, d=8)
    base = query_norm_entropy(q, k, ("relu", "nala", "softmax"))
    doubled = query_norm_entropy(2 * q, k, ("relu", "nala", "softmax"))
    assert base["norm"].shape == base["nala"].shape == (2 * 2 * 24,)
    torch.testing.assert_close(doubled["norm"], 2 * base["norm"])
    torch.testing.assert_close(doubled["relu"], base["relu"], atol=1e-9, rtol=0)
    assert (doubled["nala"] < base["nala"]).float().mean() > 0.9
    assert (doubled["softmax"] < base["softmax"]).float().mean() > 0.9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", kernel_names())
@pytest.mark.parametrize("scale", [0.0, 1e4])
def test_zero_and_huge_inputs_stay_finite(kernel, dtype, scale):
    q, k, v = qkv(dtype=dtype)
    out = linear_attention(q * scale, k * scale, v, kernel=kernel)
    assert out.dtype == dtype
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["nala", "nala_split"])
def test_nala_is_finite_up_to_the_dtype_limit(kernel, dtype):
    # NaLa's features depend on the direction (and a saturating tanh of the norm), so any finite input
    # works: here 1/16 of the dtype's largest value (randn stays below ~5, so the inputs are finite).
    scale = torch.finfo(dtype).max / 16
    q, k, v = qkv(dtype=dtype)
    q, k = (q.float() * scale).to(dtype), (k.float() * scale).to(dtype)
    assert torch.isfinite(q.float()).all()
    out = linear_attention(q, k, v, kernel=kernel)
    assert out.dtype == dtype
    assert torch.isfinite(out.float()).all()


def test_half_inputs_accumulate_in_fp32():
    q, k, v = qkv(n=256)
    ref = linear_attention(q, k, v)
    half = linear_attention(q.half(), k.half(), v.half())
    # Only the input rounding (fp16, ~5e-4 relative) is lost, not the accumulation over 256 tokens.
    torch.testing.assert_close(half.float(), ref, atol=3e-3, rtol=0)


@pytest.mark.parametrize("kernel", LINEAR)
def test_gradcheck(kernel):
    q, k, v = (t.double().requires_grad_() for t in qkv(b=1, h=1, n=6, d=4, dv=3))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c, kernel=kernel), (q, k, v))


def test_no_quadratic_tensor_is_built(monkeypatch):
    # Every tensor the PyTorch path allocates must be O(N * d): record the largest one. (The fused op holds
    # tiles of 64 tokens; `nala-bench attention` measures its peak memory.)
    q, k, v = qkv(b=1, h=1, n=2048, d=16, dv=16)
    sizes = []
    original = torch.Tensor.__matmul__

    def spy(a, b):
        out = original(a, b)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    linear_attention(q, k, v, kernel="nala", chunk_size=512, runtime=RuntimeOptions(fused=False))
    assert sizes and max(sizes) <= 2048 * 32


def test_unknown_kernel_is_a_clear_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="unknown attention kernel 'nope'"):
        linear_attention(q, k, v, kernel="nope")


@pytest.mark.parametrize("kernel", kernel_names())
@pytest.mark.parametrize("hw", [(7, 5), (1, 9), None])
def test_module_shapes_odd_grids(kernel, hw):
    n = 35 if hw is None else hw[0] * hw[1]
    attn = NaLaAttention(32, num_heads=4, kernel=kernel)
    block = NaLaBlock(32, num_heads=4, kernel=kernel)
    x = torch.randn(3, n, 32)
    assert attn(x, hw).shape == (3, n, 32)
    assert block(x, hw).shape == (3, n, 32)


def test_module_same_seed_same_output():
    def run(seed):
        torch.manual_seed(seed)
        block = NaLaBlock(32, num_heads=4)
        return block(torch.randn(2, 30, 32), (5, 6))

    torch.testing.assert_close(run(1), run(1), atol=0, rtol=0)
    assert not torch.equal(run(1), run(2))


def test_module_rejects_a_wrong_grid():
    with pytest.raises(ValueError, match="do not fill"):
        NaLaBlock(32, 4)(torch.randn(1, 30, 32), (4, 4))


def _copy_shared(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Copy src's parameters into dst wherever dst has the same name (the leading slice when dst's is smaller)."""
    source = dict(src.named_parameters())
    with torch.no_grad():
        for name, param in dst.named_parameters():
            param.copy_(source[name][tuple(slice(0, n) for n in param.shape)])


@pytest.mark.parametrize("switch", ["rope", "lepe", "gate"])
def test_each_block_switch_changes_the_output(switch):
    torch.manual_seed(0)
    full = NaLaAttention(32, num_heads=4)
    without = NaLaAttention(32, num_heads=4, **{switch: False})
    _copy_shared(full, without)
    x = torch.randn(2, 6 * 5, 32)
    with torch.no_grad():
        reference, ablated = full(x, (6, 5)), without(x, (6, 5))
        rebuilt = NaLaAttention(32, num_heads=4)
        _copy_shared(full, rebuilt)
        torch.testing.assert_close(rebuilt(x, (6, 5)), reference)  # the copy itself changes nothing
    assert (ablated - reference).abs().max() > 1e-3
    assert sum(p.numel() for p in without.parameters()) <= sum(p.numel() for p in full.parameters())


def test_block_has_the_released_layout():
    attn = NaLaAttention(32, num_heads=4, out_dim=48)
    assert attn.qkvg.out_features == 4 * 32 and attn.lepe.kernel_size == (5, 5) and attn.lepe.groups == 32
    assert attn.proj.out_features == 48
    assert attn(torch.randn(1, 12, 32), (3, 4)).shape == (1, 12, 48)


def test_neutral_parts_start_as_attention_then_layer_norm_and_still_learn():
    torch.manual_seed(0)
    block = NaLaAttention(32, num_heads=4)
    block.start_parts_neutral()
    bare = NaLaAttention(32, num_heads=4, lepe=False, gate=False)
    with torch.no_grad():
        bare.qkvg.weight.copy_(block.qkvg.weight[: 3 * 32])
        bare.qkvg.bias.copy_(block.qkvg.bias[: 3 * 32])
    x = torch.randn(2, 6 * 5, 32)
    out = block.mix(x, (6, 5))
    torch.testing.assert_close(out, block.out_norm(bare.mix(x, (6, 5))))  # no local term, the gate passes LN(o)
    out.square().mean().backward()
    assert block.lepe.weight.grad.abs().max() > 0  # both parts move from the first step
    assert block.qkvg.weight.grad[3 * 32 :].abs().max() > 0


def test_every_registered_method_runs_as_its_kernel_or_softmax_and_states_its_memory():
    from nala_gen.attention.registry import METHODS, explicit_bytes, linear_flops, method_fn, method_kernel

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    softmax = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for method in METHODS:
        if method.endswith("_compiled"):
            continue  # torch.compile's first call is slow; test_compiled_feature_map_matches_eager covers it
        out = method_fn(method, q, k, v)()
        if method.startswith("softmax"):
            assert torch.allclose(out, softmax, atol=1e-5), method
        else:
            assert torch.allclose(out, linear_attention(q, k, v, kernel=method_kernel(method)), atol=1e-5), method
            assert linear_flops(method, 16, 2, 8) > 0
    assert method_kernel("nala_eager") == method_kernel("nala_compiled") == "nala"
    assert explicit_bytes(16, 2) == 2 * 2 * 16 * 16 * 4  # scores and their softmax, fp32
