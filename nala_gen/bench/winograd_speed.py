"""What the Winograd 3x3 convolution (:mod:`nala_gen.ops.winograd`) gains: per convolution shape and per network.

Each in one fresh process, its calls alternated with the direct convolution's in the same process (the VM's speed
drifts from process to process, so a ratio is only taken within one):

* **shapes**: the 3x3 shapes NaLaSR-light runs by Winograd, ``F.conv2d`` (oneDNN) against the kernels on one
  channels-last input, fp32, minimum of ``--repeats`` calls each;
* **networks**: NaLaSR's whole forward (``net(x)``, eval, channels-last, as the peer board runs it) at each LR side,
  ``--rounds`` passes with the kernels on and as many off (``NALA_GEN_WINOGRAD``), alternated; the medians, their
  ratio, and the largest difference between the two outputs;
* **choice**: what the per-machine choice of kernels (:mod:`nala_gen.sr.archs.fast.conv_choice`) costs once and
  what it picks: NaLaSR's first forward at the largest side in a process with an empty choice cache (it times every
  shape's kernels), then a second forward, then a second process reading the cache; each shape's timings and choice.

    nala-bench winograd [--sides 125 250 500] [--rounds 8] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from nala_gen.bench.common import machine_info, run_stamp
from nala_gen.bench.tables import Table, cores, load, row
from nala_gen.bench.worker import run_fresh

# (in, out, LR side) of NaLaSR-light's Winograd convolutions at 1 MP out: its residual units' 32 -> 16 and 16 -> 32
# and the ARFBs' 32 -> 32 (at full and pooled resolution), the transformer's two 32 -> 160
SHAPES = ((32, 16, 250), (16, 32, 250), (32, 32, 250), (32, 160, 250), (32, 16, 125), (16, 32, 125), (32, 32, 125))


def _alternated(calls: dict, repeats: int) -> dict[str, list[float]]:
    """Each callable once per round, in turn (order reversed every other round), after one warm-up call each."""
    for call in calls.values():
        call()
    times = {name: [] for name in calls}
    order = list(calls)
    for round_ in range(repeats):
        for name in order if round_ % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times


def shapes_worker(repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    from nala_gen.ops import winograd
    from nala_gen.profiling import reused_large_temporaries

    if winograd.unavailable_reason():
        return {"status": "unavailable", "note": winograd.unavailable_reason()}
    torch.manual_seed(0)
    rows = []
    with torch.inference_mode(), reused_large_temporaries():
        for c_in, c_out, side in SHAPES:
            x = torch.randn(1, c_in, side, side).contiguous(memory_format=torch.channels_last)
            weight, bias = torch.randn(c_out, c_in, 3, 3) / (3 * c_in**0.5), torch.randn(c_out)
            packed = winograd.pack(weight)
            times = _alternated(
                {
                    "direct": partial(F.conv2d, x, weight, bias, padding=1),
                    "winograd": partial(winograd.winograd_conv3x3, x, packed, bias),
                },
                repeats,
            )
            best = {name: min(t) for name, t in times.items()}
            gflop = 2 * c_out * c_in * 9 * side * side / 1e9
            rows.append(
                {
                    "in_channels": c_in,
                    "out_channels": c_out,
                    "side": side,
                    "direct_s": best["direct"],
                    "winograd_s": best["winograd"],
                    "speedup": best["direct"] / best["winograd"],
                    "gflop_direct": gflop,
                }
            )
    return {"status": "ok", "rows": rows}


def network_worker(model: str, side: int, rounds: int) -> dict:
    import torch

    from nala_gen.bench.sr_scaling import build, padded_input
    from nala_gen.ops import using, winograd
    from nala_gen.profiling import reused_large_temporaries

    if winograd.unavailable_reason():
        return {"status": "unavailable", "note": winograd.unavailable_reason()}
    torch.manual_seed(0)
    net = build(model).eval().to(memory_format=torch.channels_last)
    x = padded_input(model, side, side).contiguous(memory_format=torch.channels_last)
    outputs = {}

    def run(switch: str):
        def call():
            with using(winograd=switch == "1"):
                outputs[switch] = net(x)

        return call

    with torch.inference_mode(), reused_large_temporaries():
        times = _alternated({"winograd": run("1"), "direct": run("0")}, rounds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    difference = (outputs["1"] - outputs["0"]).abs().max().item()
    return {
        "status": "ok",
        "model": model,
        "lr_side": side,
        "output_megapixels": (4 * side) ** 2 / 1e6,
        "direct_s": medians["direct"],
        "winograd_s": medians["winograd"],
        "speedup": medians["direct"] / medians["winograd"],
        "runs_direct_s": times["direct"],
        "runs_winograd_s": times["winograd"],
        "max_abs_difference": difference,
    }


def choice_worker(model: str, side: int, cache: str) -> dict:
    """One forward with the choice cache ``cache`` as it is (empty: the probe runs inside the first), then a second;
    the cache's entries for this process's key."""
    import os

    import torch

    from nala_gen.bench.sr_scaling import build, padded_input
    from nala_gen.ops import runtime_options, using, winograd
    from nala_gen.sr.archs.fast import conv_choice

    if winograd.unavailable_reason():
        return {"status": "unavailable", "note": winograd.unavailable_reason()}
    os.environ[conv_choice.CACHE_ENV] = cache
    torch.manual_seed(0)
    net = build(model).eval().to(memory_format=torch.channels_last)
    x = padded_input(model, side, side).contiguous(memory_format=torch.channels_last)
    times = []
    with torch.inference_mode(), using(conv_choice="probe") as options:
        for _ in range(2):
            start = time.perf_counter()
            net(x)
            times.append(time.perf_counter() - start)
        key, _ = conv_choice.machine(options)
    shapes = json.loads(Path(cache).read_text())[key]["shapes"]
    return {
        "status": "ok",
        "first_s": times[0],
        "second_s": times[1],
        "probe_s": sum(entry["probe_seconds"] for entry in shapes.values()),
        "shapes": shapes,
        "options": runtime_options().as_dict(),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = [f"{r['in_channels']}→{r['out_channels']}\n{r['side']}²" for r in result["shapes"]]
    nets = [f"{r['model']}\n{r['output_megapixels']:g} MP" for r in result["networks"]]
    fig, ax = plt.subplots(figsize=(7, 3.4), dpi=110)
    values = [r["speedup"] for r in result["shapes"]] + [r["speedup"] for r in result["networks"]]
    colours = ["tab:blue"] * len(shapes) + ["tab:orange"] * len(nets)
    ax.bar(range(len(values)), values, color=colours)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(values)), shapes + nets, fontsize=7)
    ax.set_ylabel("direct time / Winograd time")
    ax.set_title("Winograd F(2x2, 3x3) against oneDNN's direct convolution: shapes (blue), whole forward (orange)",
                 fontsize=8)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench winograd", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["nalasr"], choices=["nalasr", "esrt"])
    parser.add_argument("--sides", nargs="+", type=int, default=[125, 250, 500], help="square LR sides (x4)")
    parser.add_argument("--rounds", type=int, default=8, help="network passes with the kernels on, and as many off")
    parser.add_argument("--repeats", type=int, default=15, help="calls of each convolution per shape")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    shapes = run_fresh("nala_gen.bench.winograd_speed:shapes_worker", {"repeats": args.repeats})
    if shapes["status"] != "ok":
        print(f"winograd: {shapes['status']}: {shapes.get('note', '')}")
        return 1
    for r in shapes["rows"]:
        print(f"{r['in_channels']:>3} -> {r['out_channels']:<3} at {r['side']}²: direct {r['direct_s'] * 1e3:6.2f} ms, "
              f"Winograd {r['winograd_s'] * 1e3:6.2f} ms, {r['speedup']:.2f}x", flush=True)  # fmt: skip
    networks = []
    for model in args.models:
        for side in args.sides:
            kwargs = {"model": model, "side": side, "rounds": args.rounds}
            row = run_fresh("nala_gen.bench.winograd_speed:network_worker", kwargs)
            if row["status"] != "ok":
                print(f"{model} at {side}: {row['status']}: {row.get('note', '')}")
                return 1
            networks.append(row)
            print(f"{model} {row['output_megapixels']:g} MP out: direct {row['direct_s']:.3f} s, Winograd "
                  f"{row['winograd_s']:.3f} s, {row['speedup']:.3f}x (outputs within {row['max_abs_difference']:.1e})",
                  flush=True)  # fmt: skip
    choice = {}
    with tempfile.TemporaryDirectory() as folder:
        kwargs = {"model": args.models[0], "side": max(args.sides), "cache": str(Path(folder) / "conv_choice.json")}
        for run in ("probed", "cached"):  # a new machine's first process, then a later one
            choice[run] = run_fresh("nala_gen.bench.winograd_speed:choice_worker", kwargs)
            if choice[run]["status"] != "ok":
                print(f"choice: {choice[run]['status']}: {choice[run].get('note', '')}")
                return 1
            first, second = choice[run]["first_s"], choice[run]["second_s"]
            print(f"choice ({run}): first forward {first:.3f} s, second {second:.3f} s", flush=True)
    choice["model"], choice["lr_side"] = kwargs["model"], kwargs["side"]
    result = {
        "machine": machine_info("cpu"),
        "run": run_stamp(),
        "repeats": args.repeats,
        "rounds": args.rounds,
        "shapes": shapes["rows"],
        "networks": networks,
        "choice": choice,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "winograd.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "winograd.png")
    print(f"wrote {args.out / 'winograd.json'} and winograd.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def winograd_table() -> str:
    """The Winograd 3x3 convolution against oneDNN's direct one per shape, and NaLaSR's forward with the project's
    convolution kernels against without them."""
    data = load("winograd.json")
    lines = [
        f"`nala-bench winograd`, {data['run']}, {cores(data['machine'])}, fp32; each part in one fresh process, "
        f"the two paths alternated: shapes by the minimum of {data['repeats']} calls on one channels-last input, "
        f"NaLaSR's whole forward (`net(x)`, eval) by the medians of {data['rounds']} passes each, with the project's "
        "kernels (Winograd 3x3, 1x1) and without them (PyTorch's convolutions: `NALA_GEN_WINOGRAD=0`).",
        "",
        "| convolution or forward | direct (oneDNN) | Winograd (forward: the project's kernels) | speed-up |",
        "|---|---|---|---|",
    ]
    for r in data["shapes"]:
        shape = f"{r['in_channels']} → {r['out_channels']}, 3x3, at {r['side']}²"
        times = f"{r['direct_s'] * 1e3:.2f} ms", f"{r['winograd_s'] * 1e3:.2f} ms"
        lines.append(row(shape, *times, f"{r['speedup']:.2f}×"))
    for r in data["networks"]:
        lines.append(row(f"{r['model']} forward, {r['output_megapixels']:g} MP out",
                         f"{r['direct_s']:.3f} s", f"{r['winograd_s']:.3f} s", f"{r['speedup']:.2f}×"))  # fmt: skip
    worst = max(r["max_abs_difference"] for r in data["networks"])
    lines += ["", f"The two paths' outputs differ by at most {worst:.1e} (images in [0, 1])."]
    choice = data.get("choice")
    if choice:
        probed, cached = choice["probed"], choice["cached"]
        lines += [
            "",
            f"**The per-machine choice of kernels** (`NALA_GEN_CONV_CHOICE`, default `probe`): on a machine the "
            f"cache has not seen, {choice['model']}'s first forward at {choice['lr_side']}² LR took "
            f"{probed['first_s']:.2f} s, of which timing every shape's kernels {probed['probe_s']:.2f} s; its "
            f"second forward {probed['second_s']:.3f} s; a later process, reading the cache, "
            f"{cached['first_s']:.3f} s for its first (its other first-call costs included). Each shape's kernels "
            "(median of up to three calls after a warm-up, on a map of its size class) and the one chosen:",
            "",
            "| shape (kernel, in > out, size class) | chosen | each kernel's time |",
            "|---|---|---|",
        ]
        for shape, entry in sorted(probed["shapes"].items()):
            each = ", ".join(
                f"{name} {t * 1e3:.2f} ms" for name, t in sorted(entry["seconds"].items(), key=lambda i: i[1])
            )
            lines.append(row(shape, f"`{entry['choice']}`", each))
    return "\n".join(lines)


TABLES = (Table("winograd", ("winograd.json",), winograd_table),)
