"""The NaLa block's inference form (nala_gen.attention.inference) computes the block's own ``mix``: whole, a group of
heads at a time, its norm and gate in bands, and streamed a band of rows at a time; on tokens or on an object that
only projects them. And the attention package imports nothing of the rest of nala_gen."""

import ast
import itertools
from pathlib import Path

import pytest
import torch

import nala_gen.attention
from nala_gen.attention import NaLaAttention, fused
from nala_gen.attention import inference as block_inference
from nala_gen.attention.inference import HeadGroupedMix, pointwise

HW = (7, 9)
DIM, HEADS = 32, 4
SWITCHES = [dict(zip(("rope", "lepe", "gate"), on)) for on in itertools.product((True, False), repeat=3)]


def switch_id(switches: dict) -> str:
    return "-".join(f"{'' if on else 'no_'}{name}" for name, on in switches.items())


def trained_block(norm_scale=None, **switches) -> NaLaAttention:
    """Random weights with every bias and scale away from its initial value, in eval mode."""
    torch.manual_seed(0)
    block = NaLaAttention(DIM, HEADS, norm_scale=norm_scale, **switches)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if norm_scale == "learned":
            block.log_norm_scale.copy_(torch.linspace(-1.0, 0.8, HEADS))
    return block.eval()


def tokens(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, HW[0] * HW[1], DIM, generator=torch.Generator().manual_seed(1))


class Projected:
    """Tokens that are only ever projected (block_inference.ProjectedTokens), as NaLaSR's transformer hands them."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x, self.shape, self.dtype, self.device = x, x.shape, x.dtype, x.device

    def element_size(self) -> int:
        return self.x.element_size()

    def project(self, weight, bias=None, start=0, stop=None):
        rows = self.x[:, start * HW[1] : None if stop is None else stop * HW[1]]
        return pointwise(rows, (rows.shape[1] // HW[1], HW[1]), weight, bias)


def within_tol(ours: torch.Tensor, reference: torch.Tensor) -> bool:
    return (ours - reference).abs().max().item() <= 1e-5 * max(1.0, reference.abs().max().item())


@pytest.mark.parametrize("switches", SWITCHES, ids=switch_id)
@pytest.mark.parametrize("heads_per_group", [4, 2, 1])
@pytest.mark.parametrize("given", ["tokens", "projected"])
def test_head_groups_compute_the_blocks_mix(monkeypatch, switches, heads_per_group, given):
    block = trained_block(**switches)
    mirror = HeadGroupedMix(block)
    x = tokens()
    monkeypatch.setattr(block_inference, "QKV_GROUP_BYTES", x.shape[0] * x.shape[1] * 3 * 8 * 4 * heads_per_group)
    assert mirror.groups(x.shape[0] * x.shape[1], 4) == HEADS // heads_per_group
    with torch.inference_mode():
        expected = block.mix(x, HW)
        ours = mirror(x if given == "tokens" else Projected(x), HW)
    assert within_tol(ours, expected)


@pytest.mark.parametrize("switches", [s for s in SWITCHES if s["gate"]], ids=switch_id)
def test_the_norm_and_gate_in_bands_compute_the_blocks_mix(monkeypatch, switches):
    block = trained_block(**switches)
    x = tokens()
    row_bytes = x.shape[0] * HW[1] * 2 * DIM * 4
    monkeypatch.setattr(block_inference, "BAND_BYTES", 2 * row_bytes)  # bands of two rows
    assert len(block_inference.row_bands(HW[0], row_bytes)) == 4
    with torch.inference_mode():
        assert within_tol(HeadGroupedMix(block)(x, HW), block.mix(x, HW))


@pytest.mark.parametrize("switches", SWITCHES, ids=switch_id)
@pytest.mark.parametrize("norm_scale", [None, 2.0, "learned"])
def test_the_streamed_form_computes_the_blocks_mix(switches, norm_scale):
    block = trained_block(norm_scale, **switches)
    mirror = HeadGroupedMix(block)
    x = tokens()
    bands = [(0, 3), (3, 4), (4, 7)]
    with torch.inference_mode():
        if not mirror.streams(x):  # (it streams without autograd only)
            pytest.skip(fused.unavailable_reason() or "the fused op is switched off")
        expected = block.mix(x, HW)
        state = mirror.key_state(Projected(x), HW, bands)
        ours = torch.cat([mirror.rows(Projected(x), HW, state, start, stop) for start, stop in bands], 1)
    assert within_tol(ours, expected)


def test_the_blocks_projections_by_name():
    block = trained_block(rope=True, lepe=True, gate=True)
    weight, bias = block.projection("v")
    assert torch.equal(weight, block.qkvg.weight[2 * DIM : 3 * DIM])
    assert torch.equal(bias, block.qkvg.bias[2 * DIM : 3 * DIM])
    assert block.projection("g")[0].shape == (DIM, DIM)
    with pytest.raises(ValueError, match="not 'g'"):
        trained_block(gate=False).projection("g")


def _imports_of_ours(package) -> list[tuple[Path, str]]:
    """Every absolute import of a nala_gen module in ``package``'s modules (relative ones must stay inside it)."""
    found = []
    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
                assert node.level <= 1, path  # relative imports stay inside the package
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [(path, name) for name in names if name.startswith("nala_gen")]
    return found


def test_the_attention_package_imports_nothing_else_of_ours_but_the_kernels():
    for path, name in _imports_of_ours(nala_gen.attention):
        assert name.split(".")[:2] in (["nala_gen", "attention"], ["nala_gen", "ops"]), (path, name)


def test_the_kernels_import_nothing_else_of_ours():
    import nala_gen.ops

    for path, name in _imports_of_ours(nala_gen.ops):
        assert name.split(".")[:2] == ["nala_gen", "ops"], (path, name)
