"""Print the README's result tables (markdown) from the JSON files under benchmarks/results/."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def cores(machine: dict) -> str:
    """'2 cores' and, where the result file names it, the processor (older files do not)."""
    cpu = machine.get("cpu")
    return f"{machine['cpu_count']} cores" + (f" of an {cpu}" if cpu else "")


def row(*cells) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def attention_table() -> str:
    data = json.loads((RESULTS / "attention_scaling.json").read_text())
    machine = data["machine"]
    rows = data["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    sizes = list(dict.fromkeys(r["tokens"] for r in rows))
    lines = [
        f"Median of {data['repeats']} warm runs after one cold run (which gives the memory), each configuration in a "
        f"fresh process; {cores(machine)}, "
        f"torch {machine['torch']}; `torch.mm` fp32 {machine['mm_gflops']:.0f} GFLOP/s and copy "
        f"{machine['copy_gbps']:.1f} GB/s (read + write) measured in the same run.",
        "",
        "| tokens | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for n in sizes:
        cells = []
        for m in methods:
            r = next(r for r in rows if r["tokens"] == n and r["method"] == m)
            if r["status"] == "ok":
                cells.append(f"{r['latency_s'] * 1e3:,.1f} ms / {r['peak_extra_bytes'] / 2**20:,.0f} MiB")
            elif "needs_bytes" in r:
                cells.append(f"needs ~{r['needs_bytes'] / 1e9:,.0f} GB (computed)")
            else:
                cells.append(r["status"])
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    backward = [m for m in methods if any("backward_s" in r for r in rows if r["method"] == m)]
    if backward:
        lines += [
            "",
            "Backward alone (`out.backward(grad)`, inputs requiring grad; median of the same number of runs):",
            "",
            "| tokens | " + " | ".join(f"{m} backward" for m in backward) + " |",
            "|---|" + "---|" * len(backward),
        ]
        for n in sizes:
            cells = []
            for m in backward:
                r = next(r for r in rows if r["tokens"] == n and r["method"] == m)
                cells.append(f"{r['backward_s'] * 1e3:,.1f} ms" if "backward_s" in r else r["status"])
            lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    big = max(sizes)
    by = {r["method"]: r for r in rows if r["tokens"] == big and r["status"] == "ok"}
    for method in ("nala", "nala_eager", "nala_compiled"):
        if {method, "relu", "softmax_sdpa"} <= by.keys():
            nala = by[method]
            first = f" (first call, compiling: {nala['first_call_s']:.0f} s)" if "first_call_s" in nala else ""
            lines += [
                "",
                f"At {big:,} tokens, `{method}`{first}: {by['softmax_sdpa']['latency_s'] / nala['latency_s']:.0f}x "
                f"faster than fused softmax (SDPA), {nala['latency_s'] / by['relu']['latency_s']:.2f}x the time of "
                f"plain ReLU linear attention; {nala['gflops']:.1f} GFLOP/s ({nala['share_of_mm_peak']:.0%} of mm), "
                f"{nala['latency_s'] / nala['io_floor_s']:.0f}x the floor of reading q, k, v and writing the output "
                f"at copy bandwidth ({nala['io_floor_s'] * 1e3:.1f} ms).",
            ]
    return "\n".join(lines)


def fused_targets_table() -> str:
    """Issue 16's targets for the default (fused) NaLa path, each with the figure measured for it."""
    data = json.loads((RESULTS / "attention_scaling.json").read_text())
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    big = max(r["tokens"] for r in ok)
    at = {r["method"]: r for r in ok if r["tokens"] == big}
    nala, relu = at["nala"], at["relu"]
    out_bytes = big * nala["heads"] * nala["head_dim"] * 4
    sdpa = {r["tokens"]: r["latency_s"] for r in ok if r["method"] == "softmax_sdpa"}
    fused = {r["tokens"]: r["latency_s"] for r in ok if r["method"] == "nala"}
    common = sorted(set(sdpa) & set(fused))
    lines = [
        f"At {big:,} tokens (4 heads, head dim {nala['head_dim']}, fp32, batch 1), `nala` = the fused op "
        f"({data['machine'].get('fused_op')} kernels), `nala_eager` = the PyTorch path it replaced:",
        "",
        "| target | measured |",
        "|---|---|",
        row(
            "forward ≤ 50 ms",
            f"{nala['latency_s'] * 1e3:.1f} ms (PyTorch path {at['nala_eager']['latency_s'] * 1e3:.1f} ms)"
            if "nala_eager" in at
            else f"{nala['latency_s'] * 1e3:.1f} ms",
        ),
        row(
            "forward ≤ 1.3× plain ReLU linear attention, same run",
            f"{nala['latency_s'] / relu['latency_s']:.2f}× (ReLU {relu['latency_s'] * 1e3:.1f} ms)",
        ),
        row(
            "no warm-up compile in the user's process",
            f"first (cold) call {nala['cold_s'] * 1e3:.1f} ms; nothing compiles",
        ),
    ]
    if "backward_s" in nala:
        lines.append(
            row(
                "backward ≤ 3× its forward",
                f"{nala['backward_s'] / nala['latency_s']:.2f}× "
                f"({nala['backward_s'] * 1e3:.1f} ms; ReLU's {relu.get('backward_s', float('nan')) * 1e3:.1f} ms)",
            )
        )
    lines.append(
        row(
            "peak extra memory ≤ 1.5× the output tensor",
            f"{nala['peak_extra_bytes'] / out_bytes:.2f}× ({nala['peak_extra_bytes'] / 2**20:.0f} MiB, output "
            f"{out_bytes / 2**20:.0f} MiB, the output included)",
        )
    )
    if common:
        worst = min(common, key=lambda n: sdpa[n] / fused[n])
        lines.append(
            row(
                "faster than SDPA from 1,024 tokens up",
                f"{min(sdpa[n] / fused[n] for n in common):.1f}× at the closest point ({worst:,} tokens)",
            )
        )
    contention = RESULTS / "attention_contention.json"
    if contention.is_file():
        ratios = json.loads(contention.read_text())["contention"]
        for entry in ratios:
            if entry["method"] == "nala" and entry["tokens"] == big:
                others = ", ".join(
                    f"{e['method']} {e['busy_over_idle']:.2f}×"
                    for e in ratios
                    if e["tokens"] == big and e["method"] != "nala"
                )
                lines.append(
                    row(
                        "with a second process busy on one core, median ≤ 2× idle",
                        f"{entry['busy_over_idle']:.2f}× ({others})",
                    )
                )
    return "\n".join(lines)


def step_timing_table() -> str:
    data = json.loads((RESULTS / "step_timing.json").read_text())
    rows = {(r["step"], r["path"]): r for r in data["rows"] if r["status"] == "ok"}
    lines = [
        f"Median of {data['repeats']} runs after a warm-up, fresh process each; fused = the default, eager = "
        "`NALA_GEN_FUSED=0`.",
        "",
        "| step | fused | eager (before) | eager / fused |",
        "|---|---|---|---|",
    ]
    for step, ratio in data["eager_over_fused"].items():
        lines.append(
            row(
                f"`{step}`",
                f"{rows[(step, 'fused')]['latency_s']:.3f} s",
                f"{rows[(step, 'eager')]['latency_s']:.3f} s",
                f"{ratio:.2f}×",
            )
        )
    return "\n".join(lines)


def sr_cost_table() -> str:
    data = json.loads((RESULTS / "sr_scaling.json").read_text())
    rows = data["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = [
        f"x4, fp32, batch 1, median of {data['repeats']} runs, fresh process per point, memory capped at "
        f"{data['mem_limit_bytes'] / 2**30:.0f} GiB per process.",
        "",
        "| LR size (tokens) | " + " | ".join(models) + " |",
        "|---|" + "---|" * len(models),
    ]
    for size in dict.fromkeys(r["size"] for r in rows):
        cells = []
        for m in models:
            r = next(r for r in rows if r["size"] == size and r["model"] == m)
            if r["status"] == "ok":
                cells.append(f"{r['latency_s']:.2f} s / {r['peak_extra_bytes'] / 2**30:.2f} GiB")
            else:
                cells.append(f"{r['status']} (cap {r['limit_bytes'] / 2**30:.0f} GiB)")
        tokens = next(r["tokens"] for r in rows if r["size"] == size)
        lines.append(f"| {size} ({tokens:,}) | " + " | ".join(cells) + " |")
    costs = data["costs"]
    lines += ["", "| model | params | GFLOPs at 64x64 LR |", "|---|---|---|"]
    lines += [f"| {m} | {c['params'] / 1e6:.3f} M | {c['gflops_at_64x64']:.2f} |" for m, c in costs.items()]
    return "\n".join(lines)


def upscale_table() -> str:
    data = json.loads((RESULTS / "upscale_throughput.json").read_text())
    rows = data["rows"]
    lines = [
        f"`nala-sr upscale`'s engine, x4, {rows[0].get('precision', 'fp32')}, {data['machine']['threads']} threads; "
        f"median of {data['repeats']} runs after a warm-up, fresh process per point; input: {data['input']}; "
        f"`--tile auto` with a {data['memory_budget_mb']:.0f} MiB budget.",
        "",
        "| model | runtime | tiles | LR in | MP out | latency | output MP/s | peak memory | passes (tile) | run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        size = f"{r['lr_side']}x{r['lr_side']}"
        engine, run = r.get("engine", "torch"), r.get("run", "earlier run")
        if r["status"] != "ok":
            lines.append(row(r["model"], engine, r["tile"], size, "", r["status"], "", "", "", run))
            continue
        mp, latency, rate = f"{r['output_megapixels']:.2f}", f"{r['latency_s']:.2f} s", f"{r['megapixels_per_s']:.3f}"
        peak, passes = f"{r['peak_extra_bytes'] / 2**20:,.0f} MiB", f"{r['tiles']} ({r['tile_size'] or 'whole'})"
        lines.append(row(r["model"], engine, r["tile"], size, mp, latency, rate, peak, passes, run))
    return "\n".join(lines)


def upscale_memory_table() -> str:
    data = json.loads((RESULTS / "upscale_memory.json").read_text())
    mib = 2**20
    lines = [
        f"`nala-sr upscale -m {data['model']} --memory-budget-mb {data['budget_mb']:g}`, x4, one fresh process per "
        f"job; {data['measure']}; fixed cost (libraries, model, a 32x32 job): {data['fixed_bytes'] / mib:,.0f} MiB.",
        "",
        "| LR in | out | process peak | budget + fixed | estimate | tile (tiles) | PNG | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        sides = (f"{r['lr_side']}²", f"{4 * r['lr_side']}²")
        if r.get("status") != "ok":
            lines.append(row(*sides, f"{r.get('status')}: {r.get('error', '')}", "", "", "", "", ""))
            continue
        peak, limit = (
            f"{r['process_peak_rss_bytes'] / mib:,.0f} MiB",
            f"{(r['budget_bytes'] + r['fixed_bytes']) / mib:,.0f} MiB",
        )
        plan = (
            f"{r['estimate_mib']:,.0f} MiB",
            f"{r['tile_size']} ({r['tiles']})",
            "streamed" if r["streamed"] else "in memory",
        )
        lines.append(row(*sides, peak, limit, *plan, f"{r['wall_s']:.0f} s"))
    return "\n".join(lines)


def sr_quality_table(file: str = "sr_quality.json") -> str:
    data = json.loads((RESULTS / file).read_text())
    lines = ["| scale | model | PSNR (Y) | SSIM (Y) |", "|---|---|---|---|"]
    for scale, block in data.items():
        for name, r in block.items():
            if isinstance(r, dict) and "psnr" in r:
                lines.append(f"| {scale} | {name} | {r['psnr']:.2f} | {r['ssim']:.4f} |")
    return "\n".join(lines)


def trained_entropy_table() -> str:
    data = json.loads((RESULTS / "trained_entropy.json").read_text())
    kernels = list(next(iter(data.values()))["kernels"])
    lines = [
        "Spearman correlation of per-query entropy with query norm, across the model's own queries; in brackets "
        "the mean entropy change (nats) when every query is doubled in length, direction kept. (own) marks the "
        "kernel the model was trained with.",
        "",
        "| model (queries, median norm) | " + " | ".join(kernels) + " |",
        "|---|" + "---|" * len(kernels),
    ]
    for name, res in data.items():
        cells = []
        for k in kernels:
            stats = res["kernels"][k]
            own = " (own)" if k == res["own_kernel"] else ""
            cells.append(f"{stats['spearman']:+.2f} [{stats['entropy_change_at_2x_norm']:+.3f}]{own}")
        lines.append(f"| {name} ({res['queries']:,}, {res['median_norm']:.2f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sr_ablation_table(name: str = "sr_ablation.json") -> str:
    data = json.loads((RESULTS / name).read_text())
    bic = data["bicubic"]
    variants = data.get("variants") or [{**r, "seeds": [r.get("seed", 0)], "psnr_std": None} for r in data["runs"]]
    lines = [
        f"NaLaSR-light x4, {data['budget']['iters']} iterations per run from `{data['budget']['base_option']}` "
        f"(batch 8, LR patch 32, only the variant's `network_g` fields and the seed changed; `emha` is ESRT); "
        f"PSNR/SSIM on Y, crop 4, `{data['budget']['val_data']}`; mean ± sample standard deviation over the seeds; "
        f"Δ against `{data.get('reference', 'nala')}` with its standard error (* beyond two).",
        "",
        "| variant | network_g change | seeds | PSNR (Y) | SSIM (Y) | vs bicubic | Δ PSNR vs nala |",
        "|---|---|---|---|---|---|---|",
        f"| (bicubic) | – | – | {bic['psnr']:.2f} | {bic['ssim']:.4f} | – | |",
    ]
    for e in variants:
        change = ", ".join(f"{k}: {v}" for k, v in e["network_g"].items()) if e["network_g"] else "(the default)"
        if "type" in e["network_g"]:  # a whole network: ESRT, or a peer from BasicSR
            change = e["network_g"]["type"] + ("" if e["network_g"]["type"] == "ESRT" else " (BasicSR)")
        spread = f" ± {e['psnr_std']:.2f}" if e.get("psnr_std") is not None else ""
        ssim_spread = f" ± {e['ssim_std']:.4f}" if e.get("ssim_std") is not None else ""
        delta = ""
        if "psnr_vs_reference" in e:
            star = "*" if e["psnr_beyond_two_se"] else ""
            delta = f"{e['psnr_vs_reference']:+.2f} ± {e['psnr_vs_reference_se']:.2f}{star}"
        lines.append(
            f"| {e['variant']} | {change} | {len(e['seeds'])} | {e['psnr']:.2f}{spread} | {e['ssim']:.4f}{ssim_spread} "
            f"| {e['psnr'] - bic['psnr']:+.2f} dB | {delta} |"
        )
    return "\n".join(lines)


def dit_ablation_table(name: str = "dit_ablation.json") -> str:
    data = json.loads((RESULTS / name).read_text())
    q = data["quality"]
    lines = [
        f"NaLaDiT on the embedded digits, {data['budget']['steps']} steps per run from the `naladit_digits*.yml` "
        f"configs (only `seed`, `output_dir` and the budget overridden); `nala-gen quality`: {q['per_class']} "
        f"samples per class, {q['steps']} steps, guidance {q['cfg']:g}; mean ± sample standard deviation over the "
        f"seeds; Δ against `{data['reference']}` with its standard error (* beyond two).",
        "",
        "| variant | model change | seeds | accuracy | Fréchet distance | Δ accuracy | Δ Fréchet distance |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(e, metric, digits):
        spread = f" ± {e[metric + '_std']:.{digits}f}" if e.get(metric + "_std") is not None else ""
        return f"{e[metric]:.{digits}f}{spread}"

    def delta(e, metric, digits):
        if metric + "_vs_reference" not in e:
            return ""
        star = "*" if e[metric + "_beyond_two_se"] else ""
        return f"{e[metric + '_vs_reference']:+.{digits}f} ± {e[metric + '_vs_reference_se']:.{digits}f}{star}"

    for e in data["variants"]:
        change = ", ".join(f"{k}: {v}" for k, v in e["change"].items()) or "(the paper's kernel)"
        lines.append(
            row(e["variant"], change, len(e["seeds"]), cell(e, "accuracy", 3), cell(e, "frechet_distance", 1),
                delta(e, "accuracy", 3), delta(e, "frechet_distance", 1))
        )  # fmt: skip
    return "\n".join(lines)


def upscale_folder_table() -> str:
    data = json.loads((RESULTS / "upscale_folder.json").read_text())
    machine = data["machine"]
    lines = [
        f"`{data['model']}`, x4, PNG in and out, `--tile auto` (4 GiB budget); {cores(machine)}, torch "
        f"{machine['torch']}; median of {data['repeats']} runs, fresh processes, warm-up untimed.",
        "",
        "| images | path | threads × processes | wall | images/s | vs sequential | largest batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        base = next(b for b in data["rows"] if b["set"] == r["set"] and b["path"] == "sequential")
        processes = 2 if r["path"] == "2 processes" else 1
        unit = "frames/s" if r["path"] == "video" else "images/s"
        lines.append(
            row(
                f"{r['images']} × {r['lr_side']}²",
                r["path"],
                f"{r['threads_per_process']} × {processes}",
                f"{r['wall_s']:.1f} s",
                f"{r['images_per_s']:.2f} {unit}",
                f"{r['images_per_s'] / base['images_per_s']:.2f}x",
                r["largest_batch"],
            )
        )
    return "\n".join(lines)


def sr_peers_table() -> str:
    data = json.loads((RESULTS / "sr_peers.json").read_text())
    machine = data["machine"]
    psnr = data.get("ablation_psnr", {})
    lines = [
        f"x4, fp32, batch 1, channels-last, random weights (speed and memory do not depend on them), whole-image "
        f"forward as the upscaling engine runs it (NaLaSR and ESRT through their inference graph; every network "
        f"with the engine's reused temporaries) unless marked tiled (the engine's auto tiles, 4 GiB budget); "
        f"median of {data['repeats']} runs "
        f"after an untimed warm-up pass; fresh process per point"
        + (
            f" (latest run: {data['rounds']} processes per point, the networks of a size alternated round by round; "
            f"the row is the median process)"
            if data.get("rounds", 1) > 1
            else ""
        )
        + f"; process peak = its `ru_maxrss` (libraries "
        f"included) over the warm-up and timed passes, pass peak = that minus the process's RSS once the libraries, "
        f"weights and input were loaded; FLOPs counted on one more pass after those figures were read; "
        f"{cores(machine)}, torch {machine['torch']}.",
        "",
        "| network | params | GFLOP per MP out | LR in → MP out | s | MP/s | GFLOP/s | process peak | pass peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    latest = data.get("run")
    earlier = sorted({r.get("run", "earlier run") for r in data["rows"] if latest and r.get("run") != latest})
    for r in data["rows"]:
        cost = data["costs"][r["model"]]
        name = f"{r['model']} ({cost['arch']})" + ("‡" if latest and r.get("run") != latest else "")
        if r["status"] != "ok":
            why = r.get("note", r["status"])
            lines.append(row(name, f"{cost['params'] / 1e6:.2f} M", "", f"{r['lr_side']}²", why, "", "", "", ""))
            continue
        tiled = f" (tiled, {r['tiles']})" if r["tiled"] else ""
        lines.append(
            row(
                name,
                f"{cost['params'] / 1e6:.2f} M",
                f"{r['gflop_per_mp']:,.0f}",
                f"{r['lr_side']}² → {r['output_megapixels']:.2f}",
                f"{r['latency_s']:.2f}{tiled}",
                f"{r['megapixels_per_s']:.3f}",
                f"{r['gflops_achieved']:.0f}",
                f"{r['process_peak_bytes'] / 2**20:,.0f} MiB",
                f"{r['pass_peak_bytes'] / 2**20:,.0f} MiB" if "pass_peak_bytes" in r else "–",
            )
        )
    if earlier:
        lines += ["", f"‡ not rerun in the latest run ({latest}): from {', '.join(earlier)} (`--keep-others`)."]
    lines += _paired_rounds(data["rows"], "nalasr", "srvgg")
    if psnr:
        lines += [
            "",
            "Equal-budget PSNR on the Pareto plot (from sr_ablation.json): "
            + ", ".join(
                f"{m} {p:.2f}" + (f" ± {sd:.2f}" if sd else "") + f" dB ({n} seed{'s' if n > 1 else ''})"
                for m, (p, sd, n) in psnr.items()
            ),
        ]
    return "\n".join(lines)


def _paired_rounds(rows: list[dict], model: str, peer: str) -> list[str]:
    """``model``'s speed relative to ``peer``'s round by round (the peer's time over the model's, both from the
    same round of alternated processes), per size, where both rows kept their rounds."""
    rounds = {(r["model"], r["lr_side"]): r["rounds_latency_s"] for r in rows if "rounds_latency_s" in r}
    parts = []
    for side in sorted({s for m, s in rounds if m == model}):
        if (peer, side) not in rounds:
            continue
        ratios = sorted(p / m for m, p in zip(rounds[(model, side)], rounds[(peer, side)]))
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        parts.append(f"{side}² LR: median {ratios[(len(ratios) - 1) // 2]:.2f}x ({shown})")
    if not parts:
        return []
    return ["", f"{model}'s speed over {peer}'s, round by round (their times in the same round): " + "; ".join(parts)]


def upscale_overhead_table() -> str:
    data = json.loads((RESULTS / "upscale_overhead.json").read_text())
    phases = data["phases"]
    lines = [
        f"{data['model']}, {data['side']}² PNG in, x4, fp32, {cores(data['machine'])}, "
        f"torch {data['machine']['torch']}; median of {data['repeats']} fresh processes each.",
        "",
        "| one-image `nala-sr upscale` | wall | compute (job) | beyond compute |",
        "|---|---|---|---|",
    ]
    for label, key in (("first run on this machine (no probe cache)", "cli_first"), ("later runs", "cli_cached")):
        run = data[key]
        lines.append(row(label, f"{run['wall_s']:.2f} s", f"{run['compute_s']:.2f} s", f"{run['beyond_s']:.2f} s"))
    lines += [
        "",
        "| phase (phase worker) | s |",
        "|---|---|",
        row("interpreter start and exit", f"{data['interpreter_s']:.2f}"),
    ]
    lines += [row(name, f"{seconds:.2f}") for name, seconds in phases["phases_s"].items()]
    lines += [
        "",
        "| compute | s |",
        "|---|---|",
        row("engine, first job (array out)", f"{phases['first_job_s']:.2f}"),
        row("engine, warm job", f"{phases['warm_job_s']:.2f}"),
        row("bare forward, inference graph", f"{phases['bare_graph_s']:.2f}"),
        row("bare forward, plain network", f"{phases['bare_plain_s']:.2f}"),
        row(
            "engine / bare graph (warm; first)", f"{data['engine_over_bare']:.2f}x; {data['first_job_over_bare']:.2f}x"
        ),
    ]
    if "bare_graph_trimmed_s" in phases:  # older files lack it
        lines[-1:-1] = [
            row(
                "bare forward, inference graph, from a trimmed heap (as a job)", f"{phases['bare_graph_trimmed_s']:.2f}"
            )
        ]
        lines.append(row("engine / bare graph from a trimmed heap (warm)", f"{data['engine_over_bare_trimmed']:.2f}x"))
    return "\n".join(lines)


def sr_peer_quality_table() -> str:
    """The peers' equal-budget quality here (sr_ablation.json: the mini val split and, for the runs scored there,
    the photo set's held-out split) beside their published figures (peers.PUBLISHED_X4)."""
    from nala_gen.sr.archs.peers import PUBLISHED_X4

    data = json.loads((RESULTS / "sr_ablation.json").read_text())
    variants = {e["variant"]: e for e in data["variants"]}
    photos = data.get("photos")
    on_photos = {e["variant"]: e for e in photos["variants"]} if photos else {}
    board = [
        ("nalasr", "nala"),
        ("esrt", "emha"),
        ("srvgg (BasicSR's init)", "srvgg"),
        ("srvgg (zero-init last conv)", "srvgg_zero_init"),
        ("edsr", "edsr"),
        ("swinir", "swinir"),
        ("rrdb", None),
    ]
    photo_note = (
        f" The held-out photos (`{photos['val_data']}`, `nala-bench sr-ablation --photos`: the same trained "
        f"weights; bicubic {photos['bicubic']['psnr']:.2f} / {photos['bicubic']['ssim']:.4f}) are pictures of "
        "another kind and size than the ten training photos."
        if photos
        else " The photo set's held-out split: not scored yet (`nala-bench sr-ablation --photos`)."
    )
    lines = [
        f"Here: {data['budget']['iters']} iterations each, trained exactly as NaLaSR (`nala-bench sr-ablation`), "
        f"PSNR/SSIM on Y of `{data['budget']['val_data']}`, mean ± sd over the seeds.{photo_note} Published: the "
        "papers' own x4 figures on Set5 and Urban100 (trained on DIV2K or DF2K for hundreds of thousands of "
        "iterations; not measured here, not comparable with the columns before them).",
        "",
        "| network | here: PSNR / SSIM (seeds) | here, held-out photos | published Set5 x4 | published Urban100 x4 "
        "| published source |",
        "|---|---|---|---|---|---|",
    ]

    def shown(pair):
        return "–" if pair is None else f"{pair[0]:.2f} / {pair[1]:.4f}"

    def measured(e, prefix=""):
        sd = f" ± {e[prefix + 'psnr_std']:.2f}" if e.get(prefix + "psnr_std") is not None else ""
        return f"{e[prefix + 'psnr']:.2f}{sd} / {e[prefix + 'ssim']:.4f} ({len(e['seeds'])})"

    for label, variant in board:
        network = label.split()[0]
        e = variants.get(variant)
        if e is None:
            here = "not trained (speed only)" if variant is None else "not trained yet"
        else:
            here = measured(e)
        there = measured(on_photos[variant], "photos_") if variant in on_photos else "–"
        published = PUBLISHED_X4[network]
        lines.append(
            row(label, here, there, shown(published["set5"]), shown(published["urban100"]), published["source"])
        )
    return "\n".join(lines)


def digits_quality_table() -> str:
    data = json.loads((RESULTS / "digits_quality.json").read_text())
    lines = [
        "| model | samples | steps, guidance | accuracy | lowest class | Fréchet distance |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in data.items():
        worst = min(range(10), key=lambda c: r["per_class_accuracy"][c])
        lines.append(
            f"| `{name}` | {r['samples']:,} | {r['steps']}, {r['guidance_scale']:g} | {r['accuracy']:.1%} | "
            f"{worst}: {r['per_class_accuracy'][worst]:.0%} | {r['frechet_distance']:.2f} |"
        )
    first = next(iter(data.values()))
    lines += [
        "",
        f"The judge (a seeded CNN trained on 80 % of the digits) scores {first['classifier_held_out_accuracy']:.1%}"
        f" on the held-out 20 %; those real held-out digits are at Fréchet distance "
        f"{first['frechet_distance_real_held_out']:.2f} from all real digits (the floor at that set size).",
    ]
    return "\n".join(lines)


TABLES = {
    "attention": attention_table,
    "fused targets": fused_targets_table,
    "step timing": step_timing_table,
    "sr cost": sr_cost_table,
    "sr quality": sr_quality_table,
    "sr quality photos": lambda: sr_quality_table("sr_quality_photos.json"),
    "upscale throughput": upscale_table,
    "upscale memory": upscale_memory_table,
    "upscale folder": upscale_folder_table,
    "upscale overhead": upscale_overhead_table,
    "sr peers": sr_peers_table,
    "sr peer quality": sr_peer_quality_table,
    "trained entropy": trained_entropy_table,
    "sr ablation": sr_ablation_table,
    "dit ablation": dit_ablation_table,
    "sr ablation, 500 iterations (key map)": lambda: sr_ablation_table("sr_ablation_500it.json"),
    "digits quality": digits_quality_table,
}

if __name__ == "__main__":
    for title, fn in TABLES.items():
        try:
            print(f"### {title}\n\n{fn()}\n")
        except FileNotFoundError as err:
            print(f"### {title}\n\n(missing: {err.filename})\n")
