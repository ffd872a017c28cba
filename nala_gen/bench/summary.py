"""The docs' tables that no one bench declares: results written outside the benches, and the README's headline.

``nala-sr evaluate --json`` writes sr_quality*.json and ``nala-gen quality --json`` digits_quality.json (both run
by ``make bench``); ``benchmarks/gpu_check.sh`` writes the CUDA runs on a GPU machine; the headline puts one figure
of several benches beside each other. Declared here, under nala_gen.bench, so that the SR and diffusion packages
import nothing of the benches.
"""

from __future__ import annotations

import json
from functools import partial

from nala_gen.bench.attention_scaling_tables import attention_table
from nala_gen.bench.sr_scaling_tables import PER_CPU, lowest_per_cpu_ratio, sr_cost_table
from nala_gen.bench.tables import RESULTS, ROOT, Table, cores, load, row

SR_QUALITY = ("sr_quality.json", "sr_quality_photos.json", "sr_quality_bf16.json", "sr_quality_photos_bf16.json")
HEADLINE_READS = (
    "attention_scaling.json",
    "sr_peers.json",
    "sr_scaling.json",
    "sr_sets.json",
    "dit_ablation.json",
    *PER_CPU,
)


def sr_quality_table(file: str = "sr_quality.json") -> str:
    data = load(file)
    first = next(iter(data.values()))
    pictures = len(first["bicubic"]["per_image"])
    lines = [
        f"`nala-sr evaluate --data {first['data']}` ({pictures} pictures); PSNR/SSIM on the {first['metric']}.",
        "",
        "| scale | model | PSNR (Y) | SSIM (Y) | vs bicubic |",
        "|---|---|---|---|---|",
    ]
    precisions = []  # (scale, spec, its weights' row without a precision): NAME@PRECISION against NAME
    for scale, block in data.items():
        bicubic = block["bicubic"]["psnr"]
        for name, r in block.items():
            if isinstance(r, dict) and "psnr" in r:
                gain = "" if name == "bicubic" else f"{r['psnr'] - bicubic:+.2f} dB"
                lines.append(row(scale, f"`{name}`", f"{r['psnr']:.2f}", f"{r['ssim']:.4f}", gain))
                if "@" in name and name.rpartition("@")[0] in block:
                    precisions.append((scale, name, name.rpartition("@")[0]))
    for scale, spec, plain in precisions:
        block = data[scale]
        gaps = [abs(a[0] - b[0]) for a, b in zip(block[spec]["per_image"].values(), block[plain]["per_image"].values())]
        lines += [
            "",
            f"{scale} `{spec}` (the same weights, `nala-sr evaluate --models {spec}`) against `{plain}`: mean PSNR "
            f"{block[spec]['psnr'] - block[plain]['psnr']:+.3f} dB, largest per-picture difference {max(gaps):.3f} dB.",
        ]
    return "\n".join(lines)


def attention_summary(attention: dict | None) -> str:
    """A quality row's attention: the kernel, the NaLa block's parts that were on, kernel options not the default."""
    if attention is None:
        return "not recorded"
    parts = [part for part in ("rope", "lepe", "gate") if attention.get(part)]
    text = f"{attention['kernel']}, " + ("block: " + " + ".join(parts) if parts else "block parts off")
    options = attention.get("kernel_options") or {}
    return text + "".join(f", {key} {value}" for key, value in sorted(options.items()))


def digits_quality_table() -> str:
    data = load("digits_quality.json")
    lines = [
        "| model | attention | samples | steps, guidance | accuracy (CNN) | lowest class (CNN) | accuracy (SVC) "
        "| lowest class (SVC) | Fréchet distance |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def lowest(per_class):
        if per_class is None:
            return "not scored"
        worst = min(range(10), key=lambda c: per_class[c])
        return f"{worst}: {per_class[worst]:.0%}"

    for name, r in data.items():
        svc = f"{r['svc_accuracy']:.1%}" if r.get("svc_accuracy") is not None else "not scored"
        lines.append(
            row(f"`{name}`", attention_summary(r.get("attention")), f"{r['samples']:,}",
                f"{r['steps']}, {r['guidance_scale']:g}", f"{r['accuracy']:.1%}", lowest(r["per_class_accuracy"]),
                svc, lowest(r.get("svc_per_class_accuracy")), f"{r['frechet_distance']:.2f}")
        )  # fmt: skip
    first = next(iter(data.values()))
    second = next((r for r in data.values() if r.get("svc_held_out_accuracy") is not None), None)
    lines += [
        "",
        "The first judge (a seeded CNN trained on 80 % of the digits) scores "
        f"{first['classifier_held_out_accuracy']:.1%} on the held-out 20 %; those real held-out digits are at "
        f"Fréchet distance {first['frechet_distance_real_held_out']:.2f} from all real digits (the floor at that "
        "set size).",
    ]
    if second:
        lines[-1] += (
            f" The second judge (scikit-learn's RBF SVC on the 8×8 digits, first half) scores "
            f"{second['svc_held_out_accuracy']:.1%} on the second half, read back from 16×16 as the samples are."
        )
    return "\n".join(lines)


GPU_FILES = ("sr_scaling_cuda.json", "attention_scaling_cuda.json")


def gpu_table() -> str:
    """The CUDA runs of `benchmarks/gpu_check.sh`, once they are committed."""
    present = [f for f in GPU_FILES if (RESULTS / f).is_file()]
    if not present:
        return (
            "No GPU results are committed: `benchmarks/results/` holds neither "
            + " nor ".join(f"`{f}`" for f in GPU_FILES)
            + ". `bash benchmarks/gpu_check.sh` on a CUDA machine writes them; this page then shows them."
        )
    parts = []
    for file in present:
        render = sr_cost_table if file.startswith("sr_") else attention_table
        parts.append(f"From `{file}`:\n\n{render(file)}")
    return "\n\n".join(parts)


def x4_pair_budget() -> str:
    """How the shipped x4 pair's training compares, from their cards: the same stages, or ESRT behind."""
    infos = {
        name: json.loads((ROOT / "weights" / f"{name}.json").read_text())["info"]
        for name in ("nalasr-light-x4", "esrt-x4")
    }
    behind = infos["nalasr-light-x4"]["iterations"] - infos["esrt-x4"]["iterations"]
    if behind == 0:
        return "trained the same way"
    if (
        PHOTOGRAPHS_490 in infos["nalasr-light-x4"]["trained_on"]
        and PHOTOGRAPHS_490 not in infos["esrt-x4"]["trained_on"]
    ):
        return f"the same stages, then NaLaSR's {behind:,} iterations on the 490 photographs, which ESRT has not had"
    return f"trained the same way, {behind:,} fewer iterations: its next stage was still training"


PHOTOGRAPHS_490 = "490 training photographs"  # how a card names the training set of issue 56


def x4_training_photos() -> str:
    """What the shipped x4 NaLaSR was trained on, in a few words, from its card."""
    info = json.loads((ROOT / "weights" / "nalasr-light-x4.json").read_text())["info"]
    if PHOTOGRAPHS_490 in info["trained_on"]:
        return "44 photographs, then the 490 of the classic SR training sets"
    return "44 photographs"


def headline_table(link: str = "") -> str:
    """The README's small table: one figure per claim, each with its data, hardware and page (``link`` prefix)."""
    attention = load("attention_scaling.json")
    ok = [r for r in attention["rows"] if r["status"] == "ok"]
    big = max(r["tokens"] for r in ok)
    at = {r["method"]: r for r in attention["rows"] if r["tokens"] == big}
    nala, sdpa, explicit = at["nala"], at["softmax_sdpa"], at.get("softmax_explicit", {})

    peers = load("sr_peers.json")
    mp1 = {r["model"]: r for r in peers["rows"] if r["lr_side"] == 250 and r["status"] == "ok"}

    scaling = load("sr_scaling.json")
    by_size = {(r["model"], r["size"]): r for r in scaling["rows"]}
    fits = [r for r in scaling["rows"] if r["model"] == "esrt" and r["status"] == "ok"]
    largest = max(fits, key=lambda r: r["tokens"])  # the largest input ESRT fits under the cap
    beyond = [r for r in scaling["rows"] if r["model"] == "esrt" and r["status"] != "ok"]

    sets = load("sr_sets.json")
    x4 = sets["scales"]["x4"]
    published_esrt = sets["published"]["ESRT"]["x4"]
    dit = load("dit_ablation.json")
    variants = {e["variant"]: e for e in dit["variants"]}
    dit_cpus = ", ".join(sorted({r["cpu"] for r in dit["runs"] if r.get("cpu")})) or "not recorded"

    def ms(r):
        return f"{r['latency_s'] * 1e3:,.1f} ms"

    def mib(r, key="peak_extra_bytes"):
        return f"{r[key] / 2**20:,.0f} MiB"

    def gib(r):
        return f"{r['peak_extra_bytes'] / 2**30:.2f} GiB"

    def secs(model):
        return f"{mp1[model]['latency_s']:.2f} s"

    explicit_cell = (
        f"; explicit softmax needs ~{explicit['needs_bytes'] / 1e9:,.0f} GB" if "needs_bytes" in explicit else ""
    )
    out_of_memory = ""
    if beyond:
        first = min(beyond, key=lambda r: r["tokens"])
        nalasr_there = by_size[("nalasr", first["size"])]
        out_of_memory = (
            f"; at {first['size']} ({first['tokens']:,} tokens) ESRT runs out of memory under a "
            f"{first['limit_bytes'] / 2**30:.0f} GiB cap, NaLaSR-light needs {gib(nalasr_there)}"
        )
    # Only times of the run that timed NaLaSR (this VM's speed changes from day to day); the rest are named.
    peer_names = {"srvgg": "SRVGGNetCompact", "edsr": "EDSR", "swinir": "SwinIR-light", "esrt": "ESRT"}
    same_run = [m for m in peer_names if m in mp1 and mp1[m].get("run") == mp1["nalasr"].get("run")]
    other_runs = [peer_names[m] for m in peer_names if m in mp1 and m not in same_run]
    peer_times = ", ".join(f"{peer_names[m]} {secs(m)}" for m in same_run)
    if other_runs:
        peer_times += f"; {', '.join(other_runs)}: timed in another run (see peers)"
    # What a user on another CPU can expect: the lowest of the per-CPU boards, not this machine's best.
    lowest = lowest_per_cpu_ratio()
    lowest_cell = (
        f"; NaLaSR over SRVGG at 1 MP on every CPU measured: at least {lowest[0]:.2f}× ({lowest[1]})" if lowest else ""
    )
    # The block's pair once it has its three seeds; until then the pair trained before the block.
    block = all(len(variants.get(v, {}).get("seeds", ())) >= 3 for v in ("nala", "softmax"))
    nala_dit, softmax_dit = (variants[v] for v in (("nala", "softmax") if block else ("preblock", "softmax_preblock")))
    dit_parts = "" if block else " (without the NaLa block's parts)"
    lines = [
        "| measured | NaLa | baseline | data, hardware | details |",
        "|---|---|---|---|---|",
        row(
            f"attention op alone, {big:,} tokens ({nala['heads']} heads × {nala['head_dim']}, fp32): forward, "
            "peak extra memory",
            f"{ms(nala)}, {mib(nala)}",
            f"fused softmax (SDPA) {ms(sdpa)}, {mib(sdpa)}{explicit_cell}",
            f"random q, k, v; {cores(attention['machine'])}, torch {attention['machine']['torch']}",
            f"[attention]({link}attention.md)",
        ),
        row(
            f"x4 upscale to {mp1['nalasr']['output_megapixels']:.0f} MP ({mp1['nalasr']['lr_side']}² LR), "
            "whole image: time",
            f"NaLaSR-light {secs('nalasr')}",
            peer_times + lowest_cell,
            f"random weights, fp32; {cores(peers['machine'])}, torch {peers['machine']['torch']}",
            f"[peers]({link}peers.md)",
        ),
        row(
            f"one x4 pass at {largest['size']} LR ({largest['tokens']:,} tokens): peak extra memory",
            f"NaLaSR-light {gib(by_size[('nalasr', largest['size'])])}",
            f"ESRT {gib(largest)}{out_of_memory}",
            f"shipped x4 weights, fp32; {cores(scaling['machine'])}, torch {scaling['machine']['torch']}",
            f"[SR models]({link}sr-models.md)",
        ),
        row(
            "shipped x4 weights: PSNR (Y, crop 4) on Set5 / Urban100",
            f"`nalasr-light-x4` {x4['Set5']['nalasr-light-x4']['psnr']:.2f} / "
            f"{x4['Urban100']['nalasr-light-x4']['psnr']:.2f} dB",
            f"bicubic {x4['Set5']['bicubic']['psnr']:.2f} / {x4['Urban100']['bicubic']['psnr']:.2f} dB; `esrt-x4` "
            f"{x4['Set5']['esrt-x4']['psnr']:.2f} / {x4['Urban100']['esrt-x4']['psnr']:.2f} dB ({x4_pair_budget()}); "
            f"published ESRT {published_esrt['Set5'][0]:.2f} / {published_esrt['Urban100'][0]:.2f} dB (DIV2K-trained)",
            f"the standard test sets; ours trained on CPUs on {x4_training_photos()} (see their cards), ESRT's paper "
            "on DIV2K",
            f"[standard test sets]({link}benchmarks.md)",
        ),
        row(
            f"class-conditional digits, {len(nala_dit['seeds'])} seeds × {dit['budget']['steps']:,} training steps: "
            "samples classified correctly",
            f"NaLaDiT{dit_parts} {nala_dit['accuracy']:.1%} ± {nala_dit['accuracy_std']:.1%}",
            f"softmax twin {softmax_dit['accuracy']:.1%} ± {softmax_dit['accuracy_std']:.1%}",
            f"scikit-learn's digits at 16×16; trained on CPU ({dit_cpus})",
            f"[ablations]({link}ablations.md)",
        ),
    ]
    return "\n".join(lines)


TABLES = (
    Table("headline", (), headline_table, reads=HEADLINE_READS),
    *(
        Table(file.removesuffix(".json").replace("_", "-"), (file,), partial(sr_quality_table, file))
        for file in SR_QUALITY
    ),
    Table("digits-quality", ("digits_quality.json",), digits_quality_table),
    Table("gpu", GPU_FILES, gpu_table, optional=True),
)
