"""The docs' tables of ``nala-bench attention``'s results (attention_scaling[_TAG].json, attention_contention.json).

Declared apart from :mod:`nala_gen.bench.attention_scaling`, which imports torch, so that rendering the tables
imports none.
"""

from __future__ import annotations

import json

from nala_gen.bench.tables import RESULTS, Table, cores, load, row


def attention_table(file: str = "attention_scaling.json") -> str:
    data = load(file)
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
    """Issues 16's and 39's targets for the default (fused) NaLa path, each with the figure measured for it."""
    data = load("attention_scaling.json")
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
        row("issue 39: forward ≤ 25 ms", f"{nala['latency_s'] * 1e3:.1f} ms"),
        row(
            "issue 39: forward ≤ 0.5× plain ReLU linear attention, same run",
            f"{nala['latency_s'] / relu['latency_s']:.2f}×",
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


def attention_d18_table() -> str:
    """NaLaSR-light's attention call at 1 MP out (8 heads of 18): the fused op (AVX-512, then AVX2 kernels) against
    plain ReLU linear attention timed in the same run (issue 39: at most 0.5x)."""
    lines = [
        "| file | kernels | CPU | tokens | heads × head dim | NaLa (fused op) | ReLU, same run | NaLa / ReLU "
        "| peak extra memory |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for file in ("attention_scaling_d18.json", "attention_scaling_d18_avx2.json"):
        data = load(file)
        by_method = {r["method"]: r for r in data["rows"] if r["status"] == "ok"}
        nala, relu = by_method["nala"], by_method.get("relu")
        lines.append(
            row(
                f"`{file}`",
                data["machine"].get("fused_op"),
                cores(data["machine"]),
                f"{nala['tokens']:,}",
                f"{nala['heads']} × {nala['head_dim']}",
                f"{nala['latency_s'] * 1e3:.1f} ms (median of {data['repeats']})",
                f"{relu['latency_s'] * 1e3:.1f} ms" if relu else "not run",
                f"{nala['latency_s'] / relu['latency_s']:.2f}×" if relu else "",
                f"{nala['peak_extra_bytes'] / 2**20:.0f} MiB",
            )
        )
    return "\n".join(lines)


TABLES = (
    Table("attention", ("attention_scaling.json",), attention_table),
    Table("fused-targets", ("attention_scaling.json", "attention_contention.json"), fused_targets_table),
    Table("attention-d18", ("attention_scaling_d18.json", "attention_scaling_d18_avx2.json"), attention_d18_table),
)
