"""The docs' tables of ``nala-bench sr``'s and ``nala-bench peers``'s results (sr_scaling[_TAG].json,
sr_peers.json, sr_peers_precision.json, sr_profile.json).

Declared apart from :mod:`nala_gen.bench.sr_scaling`, which imports torch, so that rendering the tables imports
none.
"""

from __future__ import annotations

import statistics

from nala_gen.bench.tables import RESULTS, Table, cores, load, row


def sr_cost_table(file: str = "sr_scaling.json") -> str:
    data = load(file)
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


def sr_peers_table() -> str:
    data = load("sr_peers.json")
    machine = data["machine"]
    psnr = data.get("ablation_psnr", {})
    lines = [
        f"x4, fp32, batch 1, channels-last, random weights (speed and memory do not depend on them), whole-image "
        f"forward, the module's own `net(x)` in eval mode under `torch.inference_mode()` (NaLaSR and ESRT then run "
        f"their inference graph; every network with the engine's reused temporaries) unless marked tiled (the "
        f"engine's auto tiles, 4 GiB budget); median of {data['repeats']} runs "
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


def sr_peers_precision_table() -> str:
    """NaLaSR and SRVGG at fp32 and bf16 (autocast) side by side, alternated round by round."""
    data = load("sr_peers_precision.json")
    lines = [
        f"`nala-bench peers --models {' '.join(dict.fromkeys(r['model'].partition('@')[0] for r in data['rows']))} "
        f"--precisions {' '.join(data['precisions'])}`: x4, batch 1, channels-last, random weights, the module's own "
        f"`net(x)` under `torch.inference_mode()`, bf16 as the engine runs it (autocast); median of "
        f"{data['repeats']} runs per process, the median of {data['rounds']} processes per point, every entry "
        f"alternated round by round; {cores(data['machine'])}, torch {data['machine']['torch']} ({data['run']}).",
        "",
        "| network | precision | LR in → MP out | s | MP/s | GFLOP/s | process peak | pass peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        model, _, precision = r["model"].partition("@")
        if r["status"] != "ok":
            lines.append(
                row(model, precision or "fp32", f"{r['lr_side']}²", r.get("note", r["status"]), "", "", "", "")
            )
            continue
        lines.append(
            row(
                model,
                precision or "fp32",
                f"{r['lr_side']}² → {r['output_megapixels']:.2f}",
                f"{r['latency_s']:.2f}",
                f"{r['megapixels_per_s']:.3f}",
                f"{r['gflops_achieved']:.0f}",
                f"{r['process_peak_bytes'] / 2**20:,.0f} MiB",
                f"{r['pass_peak_bytes'] / 2**20:,.0f} MiB",
            )
        )
    for model, peer in (
        ("nalasr@bf16", "nalasr"),
        ("srvgg@bf16", "srvgg"),
        ("nalasr", "srvgg"),
        ("nalasr@bf16", "srvgg@bf16"),
    ):
        lines += _paired_rounds(data["rows"], model, peer)
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


def sr_profile_table(top: int = 5) -> str:
    """Where one whole-image forward spends its time, per operator (torch.profiler self time)."""
    data = load("sr_profile.json")
    lines = [
        f"One whole-image forward at {data['lr_side']}² LR (x4) as the peer board runs it, {cores(data['machine'])}, "
        f"torch {data['machine']['torch']}; the {top} operators with the most self time (`torch.profiler`).",
        "",
        "| network | forward | operator | calls | ms | share |",
        "|---|---|---|---|---|---|",
    ]
    for model, res in data["models"].items():
        for i, op in enumerate(res["ops"][:top]):
            first = (model, f"{res['seconds']:.3f} s") if i == 0 else ("", "")
            lines.append(row(*first, f"`{op['op']}`", op["calls"], f"{op['ms']:.1f}", f"{op['share']:.1%}"))
    return "\n".join(lines)


def sr_profile_convolutions_table(top: int = 6) -> str:
    """The same forward's convolutions by shape (wall time around each call), and what the first network's
    convolutions would take at the last network's convolution rate."""
    data = load("sr_profile.json")
    lines = [
        f"The same forwards' 2-D convolutions (plain and transposed) by shape, {cores(data['machine'])}: the {top} "
        "shapes with the most time, then all convolutions together (wall time around each call, mean per forward).",
        "",
        "| network | convolution (in → out, kernel, groups) | calls | ms | GFLOP | GFLOP/s |",
        "|---|---|---|---|---|---|",
    ]
    totals = {}
    for model, res in data["models"].items():
        convs = res["convolutions"]
        for i, c in enumerate(convs[:top]):
            shape = f"{c['kind']} {c['in_channels']} → {c['out_channels']}, {c['kernel']}, g{c['groups']}"
            lines.append(row(model if i == 0 else "", shape, c["calls"], f"{c['ms']:.1f}", f"{c['gflop']:.2f}",
                             f"{c['gflops']:.0f}"))  # fmt: skip
        ms, gflop = sum(c["ms"] for c in convs), sum(c["gflop"] for c in convs)
        totals[model] = (ms, gflop, res["seconds"])
        lines.append(row("", f"all {len(convs)} shapes", sum(c["calls"] for c in convs), f"{ms:.1f}", f"{gflop:.2f}",
                         f"{gflop / ms * 1e3:.0f}"))  # fmt: skip
    if len(totals) >= 2:
        (first, (_, gflop, _)), (last, (ms, last_gflop, seconds)) = list(totals.items())[0], list(totals.items())[-1]
        at_rate = gflop / (last_gflop / ms * 1e3)
        lines += [
            "",
            f"At {last}'s convolution rate ({last_gflop / ms * 1e3:.0f} GFLOP/s) {first}'s convolutions alone would "
            f"take {at_rate:.3f} s: {seconds / at_rate:.2f}× {last}'s whole forward ({seconds:.3f} s), with "
            "everything else at no cost.",
        ]
    return "\n".join(lines)


PER_CPU = tuple(sorted(f"peers_by_cpu/{p.name}" for p in (RESULTS / "peers_by_cpu").glob("*.json")))
# Issue 58's targets for NaLaSR over SRVGGNetCompact, by LR side (1 and 4 MP out): with the AVX-512 kernels, and
# on a CPU without AVX-512 (its stand-in: ONEDNN_MAX_CPU_ISA=AVX2 with the project's AVX-512 paths off)
TARGETS = {"avx512": {250: 1.5, 500: 1.3}, "avx2": {250: 1.0, 500: 1.0}}


def board_isa(machine: dict) -> str:
    """``avx512`` where the board ran the AVX-512 paths, ``avx2`` where a cap or the CPU kept them off."""
    caps = machine.get("isa_caps", {})
    capped = caps.get("ONEDNN_MAX_CPU_ISA", "").upper().startswith("AVX2") or caps.get("NALA_GEN_WINOGRAD_ISA") in (
        "avx2",
        "baseline",
    )
    return "avx2" if capped or "avx512f" not in machine.get("cpu_flags", ["avx512f"]) else "avx512"


def per_cpu_ratios(file: str) -> dict[int, list[float]]:
    """SRVGG's time over NaLaSR's in each round (same round, alternated processes), by LR side, sorted."""
    rows = load(file)["rows"]
    rounds = {
        (r["model"], r["lr_side"]): r.get("rounds_latency_s", [r["latency_s"]]) for r in rows if r["status"] == "ok"
    }
    return {
        side: sorted(p / m for m, p in zip(rounds[("nalasr", side)], rounds[("srvgg", side)]))
        for side in sorted({s for _, s in rounds})
        if ("nalasr", side) in rounds and ("srvgg", side) in rounds
    }


def lowest_per_cpu_ratio(side: int = 250) -> tuple[float, str] | None:
    """The lowest median ratio at ``side`` among the CPUs' boards, and where: what the README quotes."""
    found = []
    for file in PER_CPU:
        ratios = per_cpu_ratios(file).get(side)
        if ratios:
            machine = load(file)["machine"]
            cap = machine.get("isa_caps", {}).get("ONEDNN_MAX_CPU_ISA")
            found.append((statistics.median(ratios), machine["cpu"] + (f" (oneDNN capped at {cap})" if cap else "")))
    return min(found) if found else None


def peers_by_cpu_table() -> str:
    """NaLaSR against SRVGGNetCompact, one table per CPU model (and per stand-in) measured, with the targets."""
    if not PER_CPU:
        return "No per-CPU board has been run yet (`nala-bench peers --models nalasr srvgg --rounds 5 --per-cpu`)."
    lines = []
    for file in PER_CPU:
        data = load(file)
        machine = data["machine"]
        isa = board_isa(machine)
        caps = ", ".join(f"`{k}={v}`" for k, v in machine.get("isa_caps", {}).items()) or "none"
        by = {(r["model"], r["lr_side"]): r for r in data["rows"]}
        ratios = per_cpu_ratios(file)
        lines += [
            f"**{machine['cpu']}**, {machine['cpu_count']} cores, torch {machine['torch']}; flags "
            f"{', '.join(machine.get('cpu_flags', [])) or 'not recorded'}; caps {caps}; {data['run']}. Median of "
            f"{data['repeats']} passes per process, {data['rounds']} processes per point, the two networks alternated "
            "round by round; the ratio is SRVGG's time over NaLaSR's in the same round (median, lowest–highest).",
            "",
            "| LR side → MP out | NaLaSR-light | SRVGGNetCompact | NaLaSR's speed over SRVGG's | target | "
            "process peak NaLaSR / SRVGG |",
            "|---|---|---|---|---|---|",
        ]
        for side, side_ratios in ratios.items():
            nala, srvgg = by[("nalasr", side)], by[("srvgg", side)]
            target = TARGETS[isa].get(side)
            median = statistics.median(side_ratios)
            verdict = "" if target is None else f"≥ {target:.1f}×: {'met' if median >= target else 'not met'}"
            lines.append(
                row(
                    f"{side}² → {nala['output_megapixels']:.2f}",
                    f"{nala['latency_s']:.3f} s",
                    f"{srvgg['latency_s']:.3f} s",
                    f"{median:.2f}× ({side_ratios[0]:.2f}–{side_ratios[-1]:.2f})",
                    verdict,
                    f"{nala['process_peak_bytes'] / 2**20:,.0f} / {srvgg['process_peak_bytes'] / 2**20:,.0f} MiB",
                )
            )
        lines.append("")
    lowest = lowest_per_cpu_ratio()
    if lowest:
        lines.append(f"Lowest median ratio at 1 MP among the boards above: {lowest[0]:.2f}× ({lowest[1]}).")
    return "\n".join(lines).rstrip()


TABLES = (
    Table("peers-by-cpu", PER_CPU, peers_by_cpu_table),
    Table("sr-cost", ("sr_scaling.json",), sr_cost_table),
    Table("sr-peers", ("sr_peers.json",), sr_peers_table),
    Table("sr-peers-precision", ("sr_peers_precision.json",), sr_peers_precision_table),
    Table("sr-profile", ("sr_profile.json",), sr_profile_table),
    Table("sr-profile-convolutions", ("sr_profile.json",), sr_profile_convolutions_table),
)
