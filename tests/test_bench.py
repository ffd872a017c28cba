"""Benchmark helpers that feed the README's Results: run on real (shipped) models at tiny sizes."""

import json

import pytest

from nala_gen.bench import trained_entropy


def test_trained_entropy_on_shipped_sr_weights(tmp_path):
    records = trained_entropy.sr_queries_keys("nalasr-light-x4", crop=12)
    assert len(records) == 1 and records[0][0].shape == (1, 8, 144, 18)  # one ET layer, 8 heads, 12x12 tokens
    summary = trained_entropy.summarise(records, "nala", points=50)
    assert summary["queries"] == 8 * 144 and len(summary["norm_sample"]) == 50
    kernels = summary["kernels"]
    # ReLU features are homogeneous: doubling a query cannot change its weights; softmax sharpens.
    assert abs(kernels["relu"]["entropy_change_at_2x_norm"]) < 1e-9
    assert kernels["softmax"]["entropy_change_at_2x_norm"] < 0
    assert all(-1 <= k["spearman"] <= 1 for k in kernels.values())


def test_trained_entropy_cli_writes_json_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    assert trained_entropy.main(["--models", "esrt-x4", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "trained_entropy.json").read_text())
    assert set(result) == {"esrt-x4"} and result["esrt-x4"]["own_kernel"] == "softmax"
    assert (tmp_path / "trained_entropy.png").read_bytes()[:4] == b"\x89PNG"
