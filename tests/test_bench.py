"""Benchmark helpers that feed the README's Results: run on real (shipped) models at tiny sizes."""

import json
from pathlib import Path

import pytest

from nala_gen.bench import trained_entropy

REPO = Path(__file__).resolve().parents[1]


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
    # A later run that scores another model keeps this row; one that rescores it replaces it.
    queries = result["esrt-x4"]["queries"]
    earlier = {**result["esrt-x4"], "queries": -2}
    result["esrt-x4"]["queries"] = -1
    (tmp_path / "trained_entropy.json").write_text(json.dumps({**result, "earlier": earlier}))
    assert trained_entropy.main(["--models", "esrt-x4", "--out", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "trained_entropy.json").read_text())
    assert merged["esrt-x4"]["queries"] == queries > 0 and merged["earlier"]["queries"] == -2


def test_sr_ablation_changes_only_the_attention_name_and_budget():
    import yaml

    from nala_gen.bench import sr_ablation

    base = yaml.safe_load(sr_ablation.BASE_OPTION.read_text())
    opt = sr_ablation.ablation_option(base, "relu", 1000)
    assert opt["network_g"]["kernel"] == "relu" and opt["train"]["total_iter"] == 1000
    assert opt["train"]["scheduler"]["milestones"] == [500, 750, 917]  # 1/2, 3/4, 11/12 of the budget
    assert opt["train"]["ema_decay"] == 0
    assert opt["name"] == "ablation_x4_relu_1000it_seed0" and opt["manual_seed"] == 0
    assert sr_ablation.ablation_option(base, "relu", 1000, seed=2)["manual_seed"] == 2
    # Everything that defines the comparison is untouched: data, optimiser, loss, model width.
    for key in ("datasets", "scale"):
        assert opt[key] == base[key]
    for key in ("optim_g", "pixel_opt"):
        assert opt["train"][key] == base["train"][key]
    assert {k: v for k, v in opt["network_g"].items() if k != "kernel"} == {
        k: v for k, v in base["network_g"].items() if k != "kernel"
    }
    assert base["network_g"]["kernel"] == "nala" and base["name"] != opt["name"]  # the base was not mutated
    # ESRT's EMHA is ESRT itself, the same layout and width; a block part or kernel option is one more field.
    esrt = sr_ablation.ablation_option(base, "emha", 1000)["network_g"]
    assert esrt["type"] == "ESRT" and esrt["num_feat"] == base["network_g"]["num_feat"]
    no_lepe = sr_ablation.ablation_option(base, "no_lepe", 1000)["network_g"]
    assert no_lepe == {**base["network_g"], "lepe": False}
    # SwinIR validates through BasicSR's own model, which pads the inputs to its window (SRModel would crash on
    # the validation photos' sizes); every other variant keeps the base's model.
    assert sr_ablation.ablation_option(base, "swinir", 1000)["model_type"] == "SwinIRModel"
    assert opt["model_type"] == base["model_type"]


def test_upscale_throughput_bench_writes_consistent_rows(tmp_path):
    pytest.importorskip("matplotlib")
    from nala_gen.bench import upscale_throughput

    argv = [
        "--models",
        "nalasr-light-x4",
        "--sides",
        "40",
        "--tiles",
        "auto",
        "32",
        "--repeats",
        "1",
        "--engines",
        "torch",
    ]
    assert upscale_throughput.main([*argv, "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "upscale_throughput.json").read_text())["rows"]
    assert [(r["tile"], r["status"]) for r in rows] == [("auto", "ok"), ("32", "ok")]
    for row in rows:
        assert row["output_megapixels"] == 160 * 160 / 1e6
        assert row["megapixels_per_s"] == pytest.approx(row["output_megapixels"] / row["latency_s"])
    assert rows[0]["tiles"] == 1 and rows[0]["tokens_per_pass"] == 40 * 40  # a 4 GiB budget fits one pass
    assert rows[1]["tiles"] == 4 and rows[1]["tokens_per_pass"] == 32 * 32
    assert (tmp_path / "upscale_throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_upscale_throughput_keeps_the_rows_it_does_not_rerun():
    from nala_gen.bench.upscale_throughput import merged_rows

    def r(model, engine, side, run):
        return {"model": model, "engine": engine, "tile": "auto", "lr_side": side, "run": run}

    previous = [r("nalasr-light-x4", "torch", 1, "old"), r("nalasr-light-x4", "onnxruntime", 1, "old")]
    previous += [{k: v for k, v in r("esrt-x4", "torch", 1, "").items() if k != "run"}]
    new = [r("nalasr-light-x4", "torch", 1, "new"), r("nalasr-light-x4", "torch", 2, "new")]
    merged = merged_rows(previous, new)
    assert [(m["model"], m["engine"], m["lr_side"], m["run"]) for m in merged] == [
        ("nalasr-light-x4", "torch", 1, "new"),
        ("nalasr-light-x4", "torch", 2, "new"),
        ("nalasr-light-x4", "onnxruntime", 1, "old"),
        ("esrt-x4", "torch", 1, "earlier run"),
    ]


def test_upscale_overhead_bench_splits_a_one_image_run(tmp_path):
    pytest.importorskip("matplotlib")
    from nala_gen.bench import upscale_overhead
    from nala_gen.bench.upscale_overhead import PHASES

    assert upscale_overhead.main(["--side", "24", "--repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "upscale_overhead.json").read_text())
    for run in (result["cli_first"], result["cli_cached"]):
        assert 0 < run["compute_s"] < run["wall_s"]
        assert run["beyond_s"] == pytest.approx(run["wall_s"] - run["compute_s"])
        # ours: from the end of torch's import (in the command's process) to its exit, beyond compute
        assert 0 < run["ours_s"] < run["beyond_s"]
    phases = result["phases"]
    assert list(phases["phases_s"]) == list(PHASES) and all(v >= 0 for v in phases["phases_s"].values())
    assert phases["phases_s"]["import torch"] > 0.05  # the worker imports torch itself, after its clock starts
    assert result["engine_over_bare"] == pytest.approx(phases["warm_job_s"] / phases["bare_graph_s"])
    assert result["engine_over_bare_trimmed"] == pytest.approx(phases["warm_job_s"] / phases["bare_graph_trimmed_s"])
    assert (tmp_path / "upscale_overhead.png").read_bytes()[:4] == b"\x89PNG"


def test_sr_ablation_peers_are_basicsr_networks_at_their_published_sizes():
    import torch
    import yaml

    from nala_gen.bench import sr_ablation
    from nala_gen.sr.loading import build_arch

    base = yaml.safe_load(sr_ablation.BASE_OPTION.read_text())
    from nala_gen.bench.peers import peer_network

    # 1.21 M, 1.52 M, 0.93 M, 16.7 M as published
    expected = {"srvgg": 1_213_296, "edsr": 1_517_571, "swinir": 929_628, "rrdb": 16_697_987}
    for variant, params in expected.items():
        if variant == "rrdb":  # on the board for speed only: too slow to train here
            network = peer_network("rrdb")
        else:
            network = dict(sr_ablation.ablation_option(base, variant, 1000)["network_g"])
            assert network == peer_network(variant)  # the whole network_g replaced, nothing of NaLaSR's
        net = build_arch(network.pop("type"), network).eval()
        assert sum(p.numel() for p in net.parameters()) == params
        with torch.no_grad():
            assert net(torch.rand(1, 3, 32, 32)).shape == (1, 3, 128, 128)


def test_srvgg_zero_init_starts_as_its_nearest_neighbour_base_with_a_signal_through_the_stack():
    import torch
    import torch.nn.functional as F
    import yaml

    from nala_gen.bench import sr_ablation
    from nala_gen.sr.loading import build_arch

    base = yaml.safe_load(sr_ablation.BASE_OPTION.read_text())
    network = dict(sr_ablation.ablation_option(base, "srvgg_zero_init", 1000)["network_g"])
    torch.manual_seed(0)
    ours = build_arch(network.pop("type"), network).eval()
    default = build_arch("SRVGGNetCompact", network).eval()  # BasicSR's own init
    assert sum(p.numel() for p in ours.parameters()) == 1_213_296  # the same network
    x = torch.rand(1, 3, 24, 24)
    base = F.interpolate(x, scale_factor=4, mode="nearest")
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(o.std())) for m in ours.body[:-1]]
    with torch.no_grad():
        y, y_default = ours(x), default(x)
    for h in hooks:
        h.remove()
    torch.testing.assert_close(y, base, rtol=0, atol=0)  # it starts as its base: no noise to remove
    assert (y_default - base).abs().max() > 1e-3  # BasicSR's init starts by adding some
    assert 0.3 < seen[-1] / seen[1] < 3  # before the last conv, the signal has the size it had after the first


def test_sr_ablation_summary_gives_means_spreads_and_two_standard_errors():
    from nala_gen.bench.sr_ablation import summarise

    def row(variant, seed, psnr):
        return {"variant": variant, "network_g": {}, "iters": 10, "seed": seed, "psnr": psnr, "ssim": psnr / 100}

    rows = [row("nala", s, p) for s, p in enumerate((27.0, 27.2, 27.1))]
    rows += [row("relu", s, p) for s, p in enumerate((26.5, 26.6, 26.4))]  # far below: beyond two SE
    rows += [row("elu1", s, p) for s, p in enumerate((27.3, 26.9, 27.2))]  # within the noise
    stats = {e["variant"]: e for e in summarise(rows)}
    assert list(stats) == ["nala", "relu", "elu1"]  # the registry's order
    assert stats["nala"]["psnr"] == pytest.approx(27.1) and stats["nala"]["psnr_std"] == pytest.approx(0.1)
    se = (0.1**2 / 3 + 0.1**2 / 3) ** 0.5
    assert stats["relu"]["psnr_vs_reference"] == pytest.approx(-0.6)
    assert stats["relu"]["psnr_vs_reference_se"] == pytest.approx(se) and stats["relu"]["psnr_beyond_two_se"]
    assert not stats["elu1"]["psnr_beyond_two_se"] and "psnr_vs_reference" not in stats["nala"]
    single = summarise([row("nala", 0, 27.0)])[0]
    assert single["psnr_std"] is None  # one seed has no spread, and none is made up


@pytest.mark.slow
def test_sr_ablation_runs_trains_resumes_and_reports_on_a_tiny_budget(tmp_path, monkeypatch):
    import shutil

    from nala_gen.bench import sr_ablation
    from nala_gen.sr.data import prepare_mini

    prepare_mini(tmp_path / "datasets" / "mini", [4], limit=2)
    (tmp_path / sr_ablation.BASE_OPTION).parent.mkdir(parents=True)
    shutil.copy(REPO / sr_ablation.BASE_OPTION, tmp_path / sr_ablation.BASE_OPTION)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results"
    argv = ["--iters", "2", "--seeds", "0", "1", "--variants", "nala", "relu", "--out", str(out)]
    assert sr_ablation.main(argv) == 0
    summary = json.loads((out / "sr_ablation_2it.json").read_text())  # a budget other than the default: named
    assert {(r["variant"], r["seed"]) for r in summary["runs"]} == {("nala", 0), ("nala", 1), ("relu", 0), ("relu", 1)}
    relu = next(e for e in summary["variants"] if e["variant"] == "relu")
    assert relu["seeds"] == [0, 1] and relu["psnr_std"] is not None and "psnr_beyond_two_se" in relu
    results = sorted((tmp_path / sr_ablation.LEDGER).glob("*.json"))
    assert len(results) == 4
    stamps = [p.stat().st_mtime_ns for p in results]
    assert sr_ablation.main([*argv, "--report-only"]) == 0  # nothing is trained again
    assert [p.stat().st_mtime_ns for p in results] == stamps
    # The ledger is the record: a checkout without experiments/ trains nothing that the ledger holds.
    shutil.rmtree(tmp_path / "experiments")
    assert sr_ablation.main(argv) == 0
    assert [p.stat().st_mtime_ns for p in results] == stamps
    assert not (tmp_path / "experiments").exists()
    assert (out / "sr_ablation_2it.png").read_bytes()[:4] == b"\x89PNG"
    assert "photos" not in summary and all("photos_psnr" not in r for r in summary["runs"])

    # Once a held-out photo split exists: --photos scores the finished run (retrained, its checkpoint being gone)
    # and a new run is scored there as it finishes. The split is the mini one here, so its figures are known.
    shutil.copytree(tmp_path / "datasets" / "mini" / "val", tmp_path / sr_ablation.PHOTO_VAL)
    assert (
        sr_ablation.main(["--iters", "2", "--seeds", "0", "2", "--variants", "nala", "--photos", "--out", str(out)])
        == 0
    )
    old, new = (
        json.loads((tmp_path / sr_ablation.LEDGER / f"ablation_x4_nala_2it_seed{s}.json").read_text()) for s in (0, 2)
    )
    assert old["photos_psnr"] == old["psnr_rerun"]  # the retrained weights, scored on the same pictures
    assert old["psnr_rerun"] == old["psnr"]  # a seeded run reproduces itself
    assert "psnr_rerun" not in new and new["photos_psnr"] == new["psnr"]
    photos = json.loads((out / "sr_ablation_2it.json").read_text())["photos"]
    assert photos["val_data"] == str(sr_ablation.PHOTO_VAL)
    assert [(e["variant"], e["seeds"]) for e in photos["variants"]] == [("nala", [0, 2])]  # relu has no photo runs


def test_trained_entropy_scores_nala_with_the_models_own_norm_scale():
    import numpy as np
    import torch

    from nala_gen.attention import NaLaAttention, record_queries_keys

    torch.manual_seed(0)
    attn = NaLaAttention(16, num_heads=2, norm_scale=5.0).eval()
    with torch.no_grad(), record_queries_keys() as records:
        attn(3 * torch.randn(1, 35, 16), (5, 7))
    assert records[0].kernel == "nala" and records[0].options["norm_scale"] == 5.0
    own = trained_entropy._entropies(records)
    plain = trained_entropy._entropies([records[0]._replace(options={})])  # as if it were the paper's NaLa
    assert not np.allclose(own["nala"], plain["nala"])
    np.testing.assert_allclose(own["relu"], plain["relu"])  # the other kernels do not take the model's options


def test_trained_entropy_scores_a_pipeline_folder_and_a_tracked_norm_scale_reacts_to_the_norm(tmp_path):
    pytest.importorskip("matplotlib")
    import torch
    from test_diffusion import tiny_pipeline

    pipe = tiny_pipeline(attention_norm_scale="tracked")
    pipe.transformer.train()  # one training-mode call starts the tracked gamma from the query norms
    with torch.no_grad():
        pipe.transformer(torch.randn(4, 3, 8, 8), torch.tensor([10.0, 200.0, 500.0, 900.0]), torch.tensor([0, 1, 2, 3]))
    pipe.transformer.eval()
    pipe.save_pretrained(tmp_path / "pipe")
    argv = ["--models", "esrt-x4", "--diffusion-runs", str(tmp_path / "pipe"), "--out", str(tmp_path)]
    assert trained_entropy.main(argv) == 0
    row = json.loads((tmp_path / "trained_entropy.json").read_text())[str(tmp_path / "pipe")]
    assert row["task"] == "diffusion" and row["own_kernel"] == "nala"
    # gamma sits at twice the median query norm, so doubling a query (direction kept) still sharpens its attention
    # (about -0.03 nats for this random model; with the paper's gamma = 1 its queries, of norm ~6, change 1e-5)
    assert row["kernels"]["nala"]["entropy_change_at_2x_norm"] < -0.005


def test_peers_profile_names_the_operators_and_layers_that_take_the_time(tmp_path):
    from nala_gen.bench import sr_scaling

    assert (
        sr_scaling.peers_main(["--profile", "nalasr", "--sides", "16", "--repeats", "1", "--out", str(tmp_path)]) == 0
    )
    result = json.loads((tmp_path / "sr_profile.json").read_text())["models"]["nalasr"]
    ops = {r["op"]: r for r in result["ops"]}
    # every operator is recorded (the tables show the top ones), so this asks what ran, not how each ranked
    assert "aten::mkldnn_convolution" in ops and "_FusedNaLa" in ops  # the convolutions and the fused NaLa op
    assert len(ops) == len(result["ops"]) and sum(r["share"] for r in result["ops"]) == pytest.approx(1.0)
    shares = [r["share"] for r in result["ops"]]
    assert shares == sorted(shares, reverse=True)
    layers = {r["layer"]: r for r in result["layers"]}
    # the layers of the network as the board runs it: its fast inference form (nala_gen.sr.archs.fast)
    assert layers["body"]["type"] == "FoldedBody" and layers["body.hpbs.0"]["type"] == "FoldedHPB"
    assert layers["body.transformer"]["ms"] < layers["body"]["ms"]  # a layer's time includes its children's
    # the graph's convolutions by shape, its fold (a 3x3 convolution of the attention's 144-wide output) and the
    # ARFBs' 1x1s among them, by the project's kernels where the CPU runs them
    from nala_gen.ops import winograd

    kernels = winograd.unavailable_reason() is None
    kinds = {(r["kind"], r["in_channels"], r["out_channels"]) for r in result["convolutions"]}
    assert ("winograd" if kernels else "conv", 144, 32) in kinds
    assert ("1x1 kernel" if kernels else "conv", 32, 32) in kinds


def test_profile_times_each_convolution_shape_with_its_flops():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from nala_gen.bench.sr_profile import _convolution_times

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=4),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=4),
        torch.nn.ConvTranspose2d(8, 6, 3, padding=1, groups=2),
    )
    x = torch.rand(2, 3, 10, 12)
    with torch.inference_mode():
        rows = _convolution_times(net, x, repeats=2)
        with FlopCounterMode(display=False) as counter:
            net(x)
    shapes = {(r["kind"], r["in_channels"], r["out_channels"], r["kernel"], r["groups"]): r for r in rows}
    assert set(shapes) == {("conv", 3, 8, "3x3", 1), ("conv", 8, 8, "3x3", 4), ("transposed", 8, 6, "3x3", 2)}
    assert shapes["conv", 8, 8, "3x3", 4]["calls"] == 2  # two layers of one shape, per forward
    assert shapes["conv", 3, 8, "3x3", 1]["gflop"] * 1e9 == 2 * 2 * 8 * 120 * 27  # 2 FLOP x out elements x taps
    # every shape's FLOPs per forward as torch's own counter has them (grouped and transposed ones included)
    assert sum(r["gflop"] for r in rows) * 1e9 == counter.get_total_flops()
    assert all(r["ms"] > 0 and r["gflops"] > 0 for r in rows)


def test_profile_counts_winograd_convolutions_at_the_direct_convolutions_flops():
    import pytest
    import torch

    from nala_gen.bench.sr_profile import _convolution_times
    from nala_gen.ops import winograd

    if winograd.unavailable_reason():
        pytest.skip(winograd.unavailable_reason())
    layer = winograd.winograd_layer(torch.nn.Conv2d(32, 64, 3, padding=1))
    with torch.inference_mode():
        (row,) = _convolution_times(layer, torch.rand(1, 32, 9, 11), repeats=3)
    assert (row["kind"], row["in_channels"], row["out_channels"], row["kernel"], row["calls"]) == (
        "winograd",
        32,
        64,
        "3x3",
        1,
    )
    assert row["gflop"] * 1e9 == 2 * 64 * 99 * 32 * 9


def test_winograd_benchmark_writes_shapes_and_networks(tmp_path):
    import pytest

    from nala_gen.bench import winograd_speed
    from nala_gen.ops import winograd

    if winograd.unavailable_reason():
        pytest.skip(winograd.unavailable_reason())
    argv = ["--sides", "12", "--rounds", "2", "--repeats", "2", "--out", str(tmp_path)]
    assert winograd_speed.main(argv) == 0
    result = json.loads((tmp_path / "winograd.json").read_text())
    assert [(r["in_channels"], r["out_channels"], r["side"]) for r in result["shapes"]] == list(winograd_speed.SHAPES)
    assert all(r["speedup"] == r["direct_s"] / r["winograd_s"] for r in result["shapes"])
    (net,) = result["networks"]
    assert net["model"] == "nalasr" and len(net["runs_winograd_s"]) == len(net["runs_direct_s"]) == 2
    assert net["max_abs_difference"] < 1e-5  # the two paths give the same image
    assert (tmp_path / "winograd.png").stat().st_size > 0


def test_flop_count_matches_a_hand_count_for_one_conv_layer():
    import torch

    from nala_gen.bench.sr_scaling import flops_of

    conv = torch.nn.Conv2d(3, 64, 3, padding=1)
    x = torch.rand(1, 3, 8, 8)
    _, flops = flops_of(lambda: conv(x))
    assert flops == 2 * (64 * 8 * 8) * (3 * 3 * 3)  # 2 x (outputs x multiply-adds per output)


@pytest.mark.slow
def test_peer_board_builds_runs_and_reports_every_network_on_a_tiny_size(tmp_path):
    from nala_gen.bench.sr_scaling import BOARD, peers_main

    assert peers_main(["--sides", "8", "--repeats", "1", "--skip", "esrt:8", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "sr_peers.json").read_text())
    assert [r["model"] for r in result["rows"]] == list(BOARD)
    skipped = [r for r in result["rows"] if r["model"] == "esrt"]
    assert [r["status"] for r in skipped] == ["skipped"]
    for r in result["rows"]:
        if r["model"] == "esrt":
            continue
        assert r["status"] == "ok" and not r["tiled"], r
        assert r["output_megapixels"] == 32**2 / 1e6 and r["gflop_per_mp"] > 0 and r["process_peak_bytes"] > 0
        assert 0 < r["loaded_rss_bytes"] and r["loaded_rss_bytes"] + r["pass_peak_bytes"] == r["process_peak_bytes"]
    params = {m: c["params"] for m, c in result["costs"].items()}
    assert params["rrdb"] > 10 * params["nalasr"] and 1.2e6 < params["srvgg"] < 1.22e6
    assert (tmp_path / "sr_peers.png").read_bytes()[:4] == b"\x89PNG"
    assert result["ablation_psnr"] == {}  # no equal-budget runs yet

    # Trainings finish later: --replot takes their PSNR without timing anything again.
    variant = {"psnr": 27.4, "psnr_std": 0.05, "seeds": [0, 1, 2]}
    (tmp_path / "sr_ablation.json").write_text(json.dumps({"variants": [{"variant": "nala", **variant}]}))
    assert peers_main(["--replot", "--out", str(tmp_path)]) == 0
    replotted = json.loads((tmp_path / "sr_peers.json").read_text())
    assert replotted["ablation_psnr"] == {"nalasr": [27.4, 0.05, 3]}
    assert replotted["rows"] == result["rows"]
    assert peers_main(["--replot", "--out", str(tmp_path / "none")]) == 1


@pytest.mark.slow
def test_peer_rounds_alternate_fresh_processes_and_keep_the_median_one(tmp_path):
    from nala_gen.bench.sr_scaling import peers_main

    args = ["--models", "nalasr", "srvgg", "--sides", "8", "--repeats", "1", "--rounds", "3", "--out", str(tmp_path)]
    assert peers_main(args) == 0
    result = json.loads((tmp_path / "sr_peers.json").read_text())
    assert result["rounds"] == 3 and [r["model"] for r in result["rows"]] == ["nalasr", "srvgg"]
    for r in result["rows"]:
        rounds = r["rounds_latency_s"]
        assert len(rounds) == 3 and len(set(rounds)) == 3  # three processes, three timings
        assert r["latency_s"] == sorted(rounds)[1] and r["status"] == "ok"


def test_the_per_cpu_board_is_a_file_per_cpu_whose_rows_name_the_cpu_and_its_caps(tmp_path, monkeypatch):
    from nala_gen.bench import sr_scaling_tables, tables
    from nala_gen.bench.sr_scaling import cpu_slug, peers_main
    from nala_gen.devices import cpu_model

    args = ["--models", "nalasr", "srvgg", "--sides", "8", "--repeats", "1", "--rounds", "2", "--per-cpu"]
    assert peers_main([*args, "--out", str(tmp_path)]) == 0
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the stand-in for a CPU without AVX-512: a file of its own
    assert peers_main([*args, "--out", str(tmp_path)]) == 0
    files = sorted(p.name for p in (tmp_path / "peers_by_cpu").glob("*.json"))
    native = cpu_slug({"cpu": cpu_model()})
    assert (
        files == sorted([f"{native}.json", f"{native}-onednn-avx2.json"]) and not (tmp_path / "sr_peers.json").exists()
    )
    stand_in = json.loads((tmp_path / "peers_by_cpu" / f"{native}-onednn-avx2.json").read_text())
    assert stand_in["machine"]["isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    for r in stand_in["rows"]:
        assert r["cpu"] == cpu_model() and isinstance(r["cpu_flags"], list) and len(r["rounds_latency_s"]) == 2
    # rendered one table per file, each ratio from its own rounds, the lowest named for the README
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    monkeypatch.setattr(sr_scaling_tables, "PER_CPU", tuple(f"peers_by_cpu/{name}" for name in files))
    rendered = sr_scaling_tables.peers_by_cpu_table()
    assert rendered.count("| LR side → MP out |") == 2 and "target" in rendered
    ratios = sr_scaling_tables.per_cpu_ratios(f"peers_by_cpu/{native}-onednn-avx2.json")[8]
    by = {r["model"]: r["rounds_latency_s"] for r in stand_in["rows"]}
    assert ratios == sorted(s / n for n, s in zip(by["nalasr"], by["srvgg"]))
    lowest, where = sr_scaling_tables.lowest_per_cpu_ratio(side=8)
    assert where.startswith(cpu_model()) and f"{lowest:.2f}×" in rendered


def test_cpu_slugs_name_the_model_and_the_stand_in():
    from nala_gen.bench.sr_scaling import cpu_slug

    assert cpu_slug({"cpu": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"}) == "intel-xeon-platinum-8481c-2-70ghz"
    assert cpu_slug({"cpu": "AMD EPYC", "isa_caps": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}) == "amd-epyc-onednn-avx2"


@pytest.mark.slow
def test_dit_ablation_trains_scores_adopts_and_reports_on_a_tiny_budget(tmp_path, monkeypatch):
    import shutil

    from nala_gen.bench import dit_ablation

    for config in {v.config for v in dit_ablation.VARIANTS.values()}:
        (tmp_path / config).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / config, tmp_path / config)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results"
    tiny = ["--steps", "2", "--per-class", "2", "--sample-steps", "2", "--out", str(out)]
    assert dit_ablation.main([*tiny, "--seeds", "0", "1", "--variants", "preblock", "nala_no_gate"]) == 0
    summary = json.loads((out / "dit_ablation_2st.json").read_text())
    runs = {(r["variant"], r["seed"]) for r in summary["runs"]}
    assert runs == {(v, s) for v in ("preblock", "nala_no_gate") for s in (0, 1)}
    no_gate = next(e for e in summary["variants"] if e["variant"] == "nala_no_gate")
    # against the pre-block model: the block's other parts on, today's kernel options, neutral start
    assert no_gate["change"] == {"kernel_options": None, "rope": True, "lepe": True}
    assert no_gate["seeds"] == [0, 1] and "svc_accuracy_vs_reference_se" in no_gate
    assert "accuracy_vs_reference_se" in no_gate and "frechet_distance_beyond_two_se" in no_gate
    for run in summary["runs"]:
        assert 0 <= run["accuracy"] <= 1 and 0 <= run["svc_accuracy"] <= 1 and run["frechet_distance"] > 0
        assert run["quality"]["per_class"] == 2
        info = tmp_path / "experiments" / dit_ablation.run_name(run["variant"], 2, run["seed"]) / "training_info.json"
        trained = json.loads(info.read_text())
        assert trained["steps"] == 2 and trained["config"]["seed"] == run["seed"]
        assert trained["config"]["model"]["gate"] is False  # the variant's override reached the training
    # the parts variants at one seed, and the reference the block's first run is read against
    assert dit_ablation.main([*tiny, "--seeds", "0", "--variants", "nala"]) == 0

    # Adoption: a pipeline trained as seed 0 of a variant is scored, not retrained; any other is refused.
    seed0 = tmp_path / "experiments" / dit_ablation.run_name("nala_no_gate", 2, 0) / "pipeline"
    seed1 = tmp_path / "experiments" / dit_ablation.run_name("nala_no_gate", 2, 1) / "pipeline"
    ledger = tmp_path / dit_ablation.LEDGER / f"{dit_ablation.run_name('nala_no_gate', 2, 0)}.json"
    ledger.unlink()
    adopt = ["--seeds", "0", "--variants", "nala_no_gate", "--adopt"]
    assert dit_ablation.main([*tiny, *adopt, f"nala_no_gate={seed1}"]) == 1
    assert not ledger.exists()
    assert dit_ablation.main([*tiny, *adopt, f"nala_no_rope={seed0}"]) == 1  # a run of another variant: refused
    assert dit_ablation.main([*tiny, *adopt, f"nala_no_gate={seed0}"]) == 0
    assert json.loads(ledger.read_text())["adopted_from"] == str(seed0)

    # A row scored before the second judge: --rescore adds it from the run's pipeline; the report reads it.
    row = json.loads(ledger.read_text())
    del row["svc_accuracy"]
    ledger.write_text(json.dumps(row))
    assert dit_ablation.main([*tiny, "--rescore", "--report-only"]) == 0  # the ledger alone, no training
    assert 0 <= json.loads(ledger.read_text())["svc_accuracy"] <= 1


def test_every_network_on_the_board_has_a_published_entry_with_its_source():
    from nala_gen.bench.peers import PEERS, PUBLISHED_X4

    assert set(PUBLISHED_X4) == {*PEERS, "nalasr", "esrt"}
    for entry in PUBLISHED_X4.values():
        assert "arXiv" in entry["source"]
        for figure in (entry["set5"], entry["urban100"]):
            assert figure is None or (20 < figure[0] < 40 and 0.5 < figure[1] < 1)


def test_peer_board_keeps_the_rows_it_does_not_rerun_and_says_from_which_run():
    from nala_gen.bench.sr_scaling import kept_rows

    def board_row(model, side, s, run=None):
        return {"model": model, "lr_side": side, "latency_s": s, **({"run": run} if run else {})}

    previous = {
        "rows": [board_row(m, side, 1.0) for side in (125, 250) for m in ("nalasr", "srvgg", "swinir")],
        "costs": {m: {"params": 1} for m in ("nalasr", "srvgg", "swinir")},
    }
    new = [board_row("nalasr", side, 0.5, "now") for side in (125, 250)]
    rows, costs = kept_rows(previous, new, {"nalasr": {"params": 2}})
    assert [(r["model"], r["lr_side"]) for r in rows] == [
        (m, side) for side in (125, 250) for m in ("nalasr", "srvgg", "swinir")
    ]
    assert all(r["latency_s"] == 0.5 and r["run"] == "now" for r in rows if r["model"] == "nalasr")
    assert all(r["run"] == "earlier run" and r["latency_s"] == 1.0 for r in rows if r["model"] != "nalasr")
    assert costs["nalasr"] == {"params": 2} and costs["swinir"] == {"params": 1}
    # one side rerun (--sides 250): the network's row at the other side is kept, not dropped
    rows, _ = kept_rows(previous, new[1:], {"nalasr": {"params": 2}})
    assert [(r["model"], r["lr_side"], r["run"]) for r in rows if r["model"] == "nalasr"] == [
        ("nalasr", 125, "earlier run"),
        ("nalasr", 250, "now"),
    ]


def test_peer_board_at_two_precisions_pairs_each_network_with_its_bf16_run(tmp_path):
    from nala_gen.bench.sr_scaling import peers_main
    from nala_gen.devices import cpu_native_bf16

    args = ["--models", "nalasr", "srvgg", "--precisions", "fp32", "bf16", "--sides", "8"]
    code = peers_main([*args, "--repeats", "1", "--rounds", "2", "--out", str(tmp_path)])
    if not cpu_native_bf16():
        assert code == 1 and not (tmp_path / "sr_peers_precision.json").exists()
        return
    assert code == 0 and (tmp_path / "sr_peers_precision.png").is_file()
    assert not (tmp_path / "sr_peers.json").exists()  # the fp32 board is not replaced
    result = json.loads((tmp_path / "sr_peers_precision.json").read_text())
    rows = {r["model"]: r for r in result["rows"]}
    assert list(rows) == ["nalasr", "nalasr@bf16", "srvgg", "srvgg@bf16"]
    assert [rows[m]["precision"] for m in rows] == ["fp32", "bf16", "fp32", "bf16"]
    assert all(r["status"] == "ok" and len(r["rounds_latency_s"]) == 2 for r in rows.values())
    assert rows["nalasr@bf16"]["params"] == rows["nalasr"]["params"]


def test_dit_sizes_times_both_models_at_each_side_with_paired_rounds(tmp_path):
    from nala_gen.bench.dit_sizes import main

    args = ["--sides", "8", "16", "--rounds", "2", "--repeats", "1", "--batch", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    result = json.loads((tmp_path / "dit_sizes.json").read_text())
    rows = {(r["model"], r["side"]): r for r in result["rows"]}
    assert set(rows) == {(m, s) for m in ("naladit-digits-block", "naladit-digits-softmax-block") for s in (8, 16)}
    assert rows[("naladit-digits-block", 16)]["tokens"] == 64 and rows[("naladit-digits-block", 8)]["tokens"] == 16
    assert {rows[("naladit-digits-block", 8)]["kernel"], rows[("naladit-digits-softmax-block", 8)]["kernel"]} == {
        "nala",
        "softmax",
    }
    assert all(len(r["rounds_s"]) == 2 for r in rows.values())
    assert [len(v) for v in result["ratio_rounds"].values()] == [2, 2]
    assert (tmp_path / "dit_sizes.png").is_file()


def test_train_speed_times_each_variant_in_fresh_processes(tmp_path):
    """``nala-bench train-speed``: every variant a row per round with its batch and patch, ratios to the baseline
    taken round by round, the CPU model and flags recorded; structure only, never which variant is faster."""
    import yaml

    from nala_gen.bench import train_speed

    option = tmp_path / "tiny.yml"
    option.write_text(
        yaml.safe_dump(
            {
                "scale": 4,
                "network_g": {"type": "NaLaSR", "upscale": 4, "num_block": 1, "num_feat": 16, "num_heads": 4},
                "datasets": {"train": {"batch_size_per_gpu": 2, "gt_size": 48}},
                "train": {"optim_g": {"type": "Adam", "lr": 2e-4, "betas": [0.9, 0.99]}},
            }
        )
    )
    variants = ["baseline", "channels_last+batch3", "patch8"]
    args = ["--opt", str(option), "--variants", *variants, "--rounds", "2", "--steps", "1", "--warmup", "1"]
    assert train_speed.main([*args, "--threads", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "train_speed.json").read_text())
    assert result["machine"]["cpu"] and isinstance(result["machine"]["cpu_flags"], list)
    assert [(r["variant"], r["round"]) for r in result["rows"]] == [
        *((v, 0) for v in variants),
        *((v, 1) for v in reversed(variants)),
    ]
    sizes = {v: (result["variants"][v]["batch"], result["variants"][v]["patch"]) for v in variants}
    assert sizes == {"baseline": (2, 12), "channels_last+batch3": (3, 12), "patch8": (2, 8)}
    for v in variants:
        row = result["variants"][v]
        assert row["samples_per_s"] == pytest.approx(row["batch"] / row["step_s"])
        assert len(row["rounds_samples_per_s"]) == 2 and row["over_baseline"] > 0
    assert result["variants"]["baseline"]["over_baseline"] == 1.0


def test_train_speed_refuses_an_unknown_variant_before_any_process(tmp_path):
    from nala_gen.bench import train_speed

    with pytest.raises(ValueError, match="unknown part 'fp8'"):
        train_speed.main(["--variants", "channels_last+fp8", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="'batch' needs a number"):
        train_speed.parse_variant("batch")
    assert not list(tmp_path.iterdir())
