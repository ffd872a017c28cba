"""The norm scale (our extension): p = lam * (tau + tanh(|q| / gamma)), fixed, learned or tracked per head."""

import pytest
import torch

from nala_gen.attention import NaLaAttention, attention_weights, linear_attention, reference_attention
from nala_gen.attention.diagnostics import attention_entropy
from nala_gen.attention.modules import TRACKED_NORM_MOMENTUM, TRACKED_NORM_RATIO

GAMMAS = [4.0, torch.tensor([0.5, 3.0, 7.0]).view(3, 1, 1)]  # one number; one per head (3 heads)


def qkv(b=2, h=3, n=37, d=16, dv=8, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, x, generator=gen).to(dtype) for x in (d, d, dv))


@pytest.mark.parametrize("gamma", GAMMAS, ids=["number", "per-head"])
def test_linear_form_equals_the_explicit_one_and_rows_sum_to_one(gamma):
    q, k, v = qkv()
    fast = linear_attention(q, k, v, kernel="nala", chunk_size=10, norm_scale=gamma)
    torch.testing.assert_close(
        fast, reference_attention(q, k, v, kernel="nala", norm_scale=gamma), atol=1e-5, rtol=1e-5
    )
    w = attention_weights(q, k, "nala", norm_scale=gamma)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5, rtol=0)


def test_gamma_one_is_the_papers_kernel_and_a_larger_gamma_wakes_the_norm():
    q, k, v = qkv()
    torch.testing.assert_close(linear_attention(q, k, v, norm_scale=1.0), linear_attention(q, k, v), rtol=0, atol=0)
    # Queries at a trained model's norms (about 5): with gamma = 1 tanh is saturated and doubling every query
    # changes almost nothing; with gamma = 5 the doubled queries are clearly peakier.
    q = 5 * q / q.norm(dim=-1, keepdim=True)
    change = {}
    for gamma in (1.0, 5.0):
        before = attention_entropy(q, k, "nala", norm_scale=gamma).mean()
        after = attention_entropy(2 * q, k, "nala", norm_scale=gamma).mean()
        change[gamma] = float(after - before)
    assert abs(change[1.0]) < 0.01 and change[5.0] < -0.03, change


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [0.0, 1e4])
@pytest.mark.parametrize("gamma", GAMMAS, ids=["number", "per-head"])
def test_zero_and_huge_inputs_stay_finite(dtype, scale, gamma):
    q, k, v = qkv(dtype=dtype)
    out = linear_attention(q * scale, k * scale, v, kernel="nala", norm_scale=gamma)
    assert out.dtype == dtype and torch.isfinite(out.float()).all()


def test_gradcheck_through_queries_keys_values_and_gamma():
    q, k, v = (t.double().requires_grad_() for t in qkv(b=1, h=2, n=6, d=4, dv=3))
    gamma = torch.tensor([0.7, 2.0], dtype=torch.float64).view(2, 1, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c, g: linear_attention(a, b, c, norm_scale=g), (q, k, v, gamma))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_norm_scale_is_refused(bad):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="norm_scale must be a positive number"):
        linear_attention(q, k, v, norm_scale=bad)
    with pytest.raises(ValueError, match="norm_scale must be None, a positive number, 'learned' or 'tracked'"):
        NaLaAttention(32, 4, norm_scale=bad if bad == bad else "sometimes")  # NaN never equals itself
    with pytest.raises(ValueError, match="not of 'relu'"):
        NaLaAttention(32, 4, kernel="relu", norm_scale=2.0)


def test_a_learned_gamma_starts_at_the_median_query_norm_and_learns():
    torch.manual_seed(0)
    attn = NaLaAttention(32, 4, norm_scale="learned")
    x = torch.randn(2, 6 * 5, 32)
    attn.eval()
    attn(x, hw=(6, 5))
    assert not bool(attn.norm_scale_started)  # evaluation alone does not start it: gamma = 1, the paper's
    torch.testing.assert_close(attn.log_norm_scale.detach(), torch.zeros(4))
    attn.train()
    out = attn(x, hw=(6, 5))
    q = attn.qkvg(x)[..., :32].unflatten(-1, (4, 8))
    expected = q.norm(dim=-1).permute(2, 0, 1).flatten(1).median(dim=1).values  # (heads, B * N) -> (heads,)
    torch.testing.assert_close(attn.log_norm_scale.detach().exp(), expected.detach(), rtol=1e-5, atol=1e-6)
    out.square().mean().backward()
    assert attn.log_norm_scale.grad is not None and attn.log_norm_scale.grad.abs().sum() > 0
    state = attn.state_dict()  # saved and restored with the weights: a loaded model does not start over
    fresh = NaLaAttention(32, 4, norm_scale="learned")
    fresh.load_state_dict(state)
    assert bool(fresh.norm_scale_started)
    torch.testing.assert_close(fresh.log_norm_scale, attn.log_norm_scale)


def test_a_tracked_gamma_follows_the_median_query_norm_and_is_not_trained():
    torch.manual_seed(1)
    attn = NaLaAttention(32, 4, norm_scale="tracked")
    assert not any(name.endswith("log_norm_scale") for name, _ in attn.named_parameters())

    def medians(x):
        q = attn.qkvg(x)[..., :32].unflatten(-1, (4, 8))
        return q.norm(dim=-1).permute(2, 0, 1).flatten(1).median(dim=1).values.detach()  # (heads,)

    x1, x2 = torch.randn(2, 30, 32), 3.0 * torch.randn(2, 30, 32)
    attn.train()
    attn(x1, hw=(6, 5))  # the first batch sets it: gamma = ratio x median
    torch.testing.assert_close(attn.log_norm_scale.exp(), TRACKED_NORM_RATIO * medians(x1), rtol=1e-5, atol=1e-6)
    attn(x2, hw=(6, 5))  # later batches move it by the momentum, in log space
    expected = torch.lerp(
        (TRACKED_NORM_RATIO * medians(x1)).log(), (TRACKED_NORM_RATIO * medians(x2)).log(), TRACKED_NORM_MOMENTUM
    )
    torch.testing.assert_close(attn.log_norm_scale, expected, rtol=1e-5, atol=1e-6)
    attn.eval()  # frozen in evaluation: a batch of long queries does not move it
    before = attn.log_norm_scale.clone()
    attn(10.0 * x2, hw=(6, 5))
    torch.testing.assert_close(attn.log_norm_scale, before)
    fresh = NaLaAttention(32, 4, norm_scale="tracked")  # a buffer: saved and restored with the weights
    fresh.load_state_dict(attn.state_dict())
    torch.testing.assert_close(fresh.log_norm_scale, before)


def test_both_models_take_the_option():
    from nala_gen.diffusion import NaLaDiTTransformer2DModel
    from nala_gen.sr.archs.nalasr_arch import NaLaSR

    sr = NaLaSR(num_feat=16, num_block=1, num_heads=4, upscale=2, norm_scale="learned")
    assert any(name.endswith("log_norm_scale") for name, _ in sr.named_parameters())
    tracked = NaLaSR(num_feat=16, num_block=1, num_heads=4, upscale=2, norm_scale="tracked")
    assert any(name.endswith("log_norm_scale") for name, _ in tracked.named_buffers())
    dit = NaLaDiTTransformer2DModel.from_size(
        "tiny", sample_size=8, in_channels=1, num_classes=3, attention_norm_scale=3.0
    )
    assert all(block.attn.kernel_options["norm_scale"] == 3.0 for block in dit.blocks)
    assert dit.config.attention_norm_scale == 3.0
