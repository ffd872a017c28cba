"""How fast NaLaSR trains on this CPU: LR-patch samples per second of one full training step (``nala-bench
train-speed``).

A step is what BasicSR's ``SRModel.optimize_parameters`` runs: zero the gradients, forward a batch of LR patches,
L1 loss against the HR patches, backward, one Adam step (the option file's optimiser settings). The network,
batch and patch come from a training option file (default: the shipped x4 configuration's); the weights are the
seeded initialisation (a step's cost does not depend on them). Each variant runs in a fresh process with the
threads given (2 by default), after ``--warmup`` untimed steps (oneDNN's primitive cache, autograd's buffers,
``torch.compile``'s compilation, timed apart), for ``--steps`` timed steps; rounds alternate the variants' order,
and a variant's figure is its median process. The JSON records the CPU model and flags of every run.

Variants (combined with ``+``, e.g. ``channels_last+bf16``):

* ``baseline``: today's step: contiguous (NCHW) tensors, fp32, the fused NaLa op's forward and backward;
* ``channels_last``: network and batch in channels-last (NHWC), oneDNN's native layout on the CPU;
* ``eager``: the PyTorch path of the attention (``NALA_GEN_FUSED=0``), to show what the fused op's backward buys;
* ``bf16``: ``torch.autocast("cpu", torch.bfloat16)`` around the forward (loss, weights and Adam stay fp32); only
  where the CPU has native bf16 (AVX512_BF16 or AMX), otherwise the row says it was not run;
* ``compile``: ``torch.compile`` of the network (inductor's C++ backend); its compile time is recorded;
* ``batchN`` / ``patchP``: another batch size or LR patch side than the option file's.

    nala-bench train-speed [--opt options/train/NaLaSR/train_NaLaSR_light_x4_sets.yml] \\
        [--variants baseline channels_last ...] [--rounds 3] [--steps 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from nala_gen.bench.tables import captioned, cores

DEFAULT_OPTION = Path("options/train/NaLaSR/train_NaLaSR_light_x4_sets.yml")
# The measurement (each call a fresh process) and its points: VARIANTS.
MEASURE = "nala_gen.bench.train_speed:worker"
VARIANTS = (
    "baseline",
    "channels_last",
    "eager",
    "bf16",
    "channels_last+bf16",
    "channels_last+compile",
    "channels_last+batch8",
    "channels_last+batch16",
)
PARTS = ("baseline", "channels_last", "eager", "bf16", "compile")
SIMD_FLAGS = ("avx", "amx", "fma", "f16c")  # the flags that decide which kernels run, as the JSON records them


def parse_variant(variant: str) -> dict:
    """``channels_last+batch16`` -> {"channels_last": True, "batch": 16, ...}; an unknown part is a ValueError."""
    spec = {"channels_last": False, "eager": False, "bf16": False, "compile": False, "batch": None, "patch": None}
    for part in variant.split("+"):
        if part in ("batch", "patch") or not part:
            raise ValueError(f"variant {variant!r}: {part!r} needs a number, e.g. batch16")
        if part.startswith("batch") and part[5:].isdigit():
            spec["batch"] = int(part[5:])
        elif part.startswith("patch") and part[5:].isdigit():
            spec["patch"] = int(part[5:])
        elif part in PARTS:
            if part != "baseline":
                spec[part] = True
        else:
            raise ValueError(f"variant {variant!r}: unknown part {part!r} (parts: {', '.join(PARTS)}, batchN, patchP)")
    return spec


def read_option(option: Path) -> dict:
    """What a step needs from a training option file: network, scale, batch, LR patch and the optimiser's settings."""
    import yaml

    opt = yaml.safe_load(Path(option).read_text())
    train = opt["datasets"]["train"]
    optim = dict(opt["train"]["optim_g"])
    optim.pop("type")
    return {
        "network": dict(opt["network_g"]),
        "scale": opt["scale"],
        "batch": train["batch_size_per_gpu"],
        "patch": train["gt_size"] // opt["scale"],
        "optim": optim,
    }


def worker(option: str | Path, variant: str, steps: int, warmup: int, threads: int, profile: bool = False) -> dict:
    """Time ``steps`` training steps of ``variant`` in this process (see the module docstring); with ``profile``,
    then every operator's share of ``steps`` more steps (``torch.profiler``'s self CPU time)."""
    import torch

    from nala_gen.devices import cpu_native_bf16
    from nala_gen.sr.loading import build_arch

    spec = parse_variant(variant)
    if spec["bf16"] and not cpu_native_bf16():
        return {"status": "skipped", "note": "this CPU has no native bf16 (AVX512_BF16 or AMX)"}
    torch.set_num_threads(threads)
    config = read_option(option)
    batch, patch, scale = spec["batch"] or config["batch"], spec["patch"] or config["patch"], config["scale"]
    network = dict(config["network"])
    torch.manual_seed(0)
    net = build_arch(network.pop("type"), network).train()
    layout = torch.channels_last if spec["channels_last"] else torch.contiguous_format
    net = net.to(memory_format=layout)
    optimizer = torch.optim.Adam(net.parameters(), **config["optim"])
    lq = torch.rand(batch, 3, patch, patch).contiguous(memory_format=layout)
    gt = torch.rand(batch, 3, patch * scale, patch * scale).contiguous(memory_format=layout)
    model = torch.compile(net) if spec["compile"] else net
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["bf16"])

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast:  # the forward only, as the training runs it (nala_gen.sr.basicsr.model)
            out = model(lq)
        loss = torch.nn.functional.l1_loss(out, gt)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    first = [step() for _ in range(max(1, warmup))]
    runs = [step() for _ in range(steps)]
    seconds = statistics.median(runs)
    operators = {}
    if profile:
        from nala_gen.bench.sr_profile import operator_times

        ops, total_ms = operator_times(step, steps)
        operators = {"operators": ops, "operators_total_ms": total_ms}
    return {
        **operators,
        "status": "ok",
        "batch": batch,
        "patch": patch,
        "step_s": seconds,
        "samples_per_s": batch / seconds,
        "runs_s": runs,
        "first_step_s": first[0],  # with compile: the compilation
        "threads": threads,
    }


def summarise(rows: list[dict], baseline: str = "baseline") -> dict[str, float]:
    """Each variant's samples per second over the baseline's, round by round (median of the per-round ratios)."""
    by_round: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["status"] == "ok":
            by_round.setdefault(r["round"], {})[r["variant"]] = r["samples_per_s"]
    ratios: dict[str, list[float]] = {}
    for measured in by_round.values():
        if baseline in measured:
            for variant, rate in measured.items():
                ratios.setdefault(variant, []).append(rate / measured[baseline])
    return {variant: statistics.median(values) for variant, values in ratios.items()}


def main(argv: list[str] | None = None) -> int:
    from nala_gen.bench.common import machine_info, run_stamp, write_json
    from nala_gen.bench.worker import run_fresh
    from nala_gen.devices import cpu_flags
    from nala_gen.fileio import check_readable, check_writable

    parser = argparse.ArgumentParser(prog="nala-bench train-speed", description=__doc__.split("\n")[0])
    parser.add_argument("--opt", type=Path, default=DEFAULT_OPTION, help="training option file (network, batch, patch)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per variant, order alternated")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per process (the median is kept)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tag", default="", help="suffix of the result file: train_speed[_TAG].json")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--profile", action="store_true", help="also every operator's share of each variant's step (torch.profiler)"
    )
    args = parser.parse_args(argv)
    check_readable(args.opt, folder=False)
    for variant in args.variants:
        parse_variant(variant)  # a typo is refused before the first process
    target = check_writable(args.out / f"train_speed{'_' + args.tag if args.tag else ''}.json")
    env = {"OMP_NUM_THREADS": str(args.threads)}
    rows = []
    for round_index in range(max(1, args.rounds)):
        for variant in args.variants if round_index % 2 == 0 else args.variants[::-1]:
            kwargs = {"option": str(args.opt), "variant": variant, "steps": args.steps, "warmup": args.warmup}
            kwargs.update({"threads": args.threads, "profile": args.profile})
            variant_env = {**env, **({"NALA_GEN_FUSED": "0"} if parse_variant(variant)["eager"] else {})}
            result = run_fresh(MEASURE, kwargs, env=variant_env, timeout=3600)
            rows.append({"variant": variant, "round": round_index, **result})
            shown = (
                f"{result['step_s']:.3f} s/step  {result['samples_per_s']:.2f} samples/s  (batch {result['batch']}, "
                f"patch {result['patch']}; first step {result['first_step_s']:.1f} s)"
                if result["status"] == "ok"
                else f"{result['status']}: {result.get('note', '')[:100]}"
            )
            print(f"round {round_index + 1}  {variant:<24} {shown}", flush=True)
    ratios = summarise(rows)
    variants = {}
    for variant in args.variants:
        mine = [r for r in rows if r["variant"] == variant and r["status"] == "ok"]
        if not mine:
            variants[variant] = next(r for r in rows if r["variant"] == variant)
            continue
        middle = sorted(mine, key=lambda r: r["samples_per_s"])[(len(mine) - 1) // 2]
        variants[variant] = {**middle, "rounds_samples_per_s": [r["samples_per_s"] for r in mine]}
        if variant in ratios:
            variants[variant]["over_baseline"] = ratios[variant]
    for variant, ratio in ratios.items():
        print(f"{variant:<24} {ratio:.2f}x the baseline's samples/s (median of per-round ratios)")
    result = {
        "machine": {**machine_info("cpu"), "cpu_flags": sorted(f for f in cpu_flags() if f.startswith(SIMD_FLAGS))},
        "run": run_stamp(),
        "option": str(args.opt),
        "step": "zero_grad, forward, L1 loss, backward, Adam step (BasicSR's SRModel.optimize_parameters)",
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "variants": variants,
        "rows": rows,
    }
    write_json(target, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def speed_table(result: dict) -> str:
    """Each variant's step time and samples per second (the docs' table of the JSON :func:`main` writes)."""
    lines = [
        "| variant | batch × LR patch | s / step | samples / s | × baseline | first step (s) |",
        "|---|---|---|---|---|---|",
    ]
    for variant, row in result["variants"].items():
        if row["status"] != "ok":
            lines.append(f"| `{variant}` | – | – | {row['status']}: {row.get('note', '')} | – | – |")
            continue
        ratio = f"{row['over_baseline']:.2f}" if "over_baseline" in row else "–"
        lines.append(
            f"| `{variant}` | {row['batch']} × {row['patch']}² | {row['step_s']:.3f} | {row['samples_per_s']:.2f} | "
            f"{ratio} | {row['first_step_s']:.1f} |"
        )
    return "\n".join(lines)


def profile_table(result: dict, top: int = 6) -> str:
    """Each profiled variant's ``top`` operators by self CPU time, as shares of its step."""
    lines = ["| variant | operator | ms per step | share |", "|---|---|---|---|"]
    for variant, row in result["variants"].items():
        for op in row.get("operators", [])[:top]:
            lines.append(f"| `{variant}` | `{op['op']}` | {op['ms']:.1f} | {op['share']:.0%} |")
    return "\n".join(lines)


def speed_caption(result: dict) -> str:
    machine = result["machine"]
    bf16 = "with" if {"avx512_bf16", "amx_bf16"} & set(machine["cpu_flags"]) else "without"
    return (
        f"`nala-bench train-speed` ({result['run']}; {cores(machine)} ({bf16} native bf16), torch {machine['torch']}, "
        f"{result['variants']['baseline'].get('threads', 2)} threads; `{result['option']}`): median of "
        f"{result['steps']} steps after {result['warmup']} untimed ones, each variant a fresh process, "
        f"{result['rounds']} rounds in alternated order; × baseline is the median of the rounds' ratios."
    )


def profile_caption(result: dict) -> str:
    return (
        f"`nala-bench train-speed --profile` ({result['run']}; {cores(result['machine'])}): each variant's six "
        f"slowest operators by self CPU time over {result['steps']} steps (`torch.profiler`), per step and as a "
        "share of all operators' time."
    )


# The docs' tables of the JSON main writes, declared for scripts/results_tables.py.
TABLES = (
    captioned("train-speed", "train_speed.json", speed_caption, speed_table),
    captioned("train-profile", "train_speed_profile.json", profile_caption, profile_table),
    captioned("train-speed-threads1", "train_speed_threads1.json", speed_caption, speed_table),
)
