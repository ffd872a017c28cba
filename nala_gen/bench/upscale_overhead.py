"""What a one-image ``nala-sr upscale`` costs beyond its compute, and the engine's compute against a bare forward.

Two kinds of fresh process, ``--repeats`` of each (medians reported):

* the real command, ``nala-sr upscale in.png -o out.png --json``, timed from outside (interpreter start to exit):
  once with an empty probe cache (a first run on this machine) and once with the cache that run left (every
  later run); its JSON gives the job's compute (the readout's latency: the pass, blending, encoding and
  writing). Beyond compute = wall - compute. The command runs after an ``import torch`` that stamps the time it
  ends, so the process also gives the project's own overhead: from then to its exit, beyond compute (``ours_s``).
* a phase worker that walks the command's own steps with a clock between them: importing torch, importing the
  engine, loading the weights, building the engine (its inference graph), decoding, planning the first job (the
  memory probes; cache off), the first job and warm jobs; then the bare forward of the same input through the
  inference graph and through the plain network (median of warm runs). Engine / bare = warm job / graph forward.

The input is the bundled sample (a held-out photo's x4 LR) resized to ``--side`` px; fp32 on the CPU.

    nala-bench upscale-overhead [--model nalasr-light-x4] [--side 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nala_gen.bench.common import machine_info
from nala_gen.bench.tables import Table, cores, load, row
from nala_gen.bench.worker import run_fresh

PHASES = ("import torch", "import nala_gen", "load weights", "build engine (graph)", "decode", "plan (probes)")


def phase_worker(model: str, path: str, repeats: int) -> dict:
    """The command's steps in this process, each timed (seconds)."""
    clock = time.perf_counter
    marks = [clock()]
    import torch

    marks.append(clock())
    from nala_gen.sr.loading import load_sr_model
    from nala_gen.sr.upscale.engine import Upscaler
    from nala_gen.sr.upscale.imageio import read_image

    marks.append(clock())
    net, info = load_sr_model(model, None)
    marks.append(clock())
    engine = Upscaler(net, info["scale"], "cpu")
    marks.append(clock())
    img = read_image(path)
    marks.append(clock())
    engine.plan(*img.shape[:2])
    marks.append(clock())
    phases = dict(zip(PHASES, (b - a for a, b in zip(marks, marks[1:]))))
    first = engine.upscale(img)[1].latency_s
    warm = [engine.upscale(img)[1].latency_s for _ in range(repeats)]
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float().div(255).contiguous(memory_format=torch.channels_last)
    from nala_gen.profiling import reused_large_temporaries

    bare = {}
    # As the engine runs its passes: inside reused_large_temporaries (without it every temporary is page-faulted)
    with torch.no_grad(), reused_large_temporaries():
        # "plain": the layers one by one (what net(x) ran in inference before it ran the graph)
        layers = getattr(engine.network, "forward_layers", engine.network)
        for name, network in (("graph", engine.network), ("plain", layers)):
            network(x)  # warm-up: oneDNN primitives for this shape
            runs = []
            for _ in range(repeats):
                start = clock()
                network(x)
                runs.append(clock() - start)
            bare[name] = statistics.median(runs)
    # The engine hands its pass's memory back to the OS after each pass (so that its resident memory between jobs is
    # what it holds), and every pass page-faults its temporaries in again; the same forward run that way, each run
    # in its own block after the previous one's trim, is the like-for-like figure for a job.
    runs = []
    with torch.no_grad():
        for _ in range(repeats):
            with reused_large_temporaries():
                start = clock()
                engine.network(x)
                runs.append(clock() - start)
    bare["graph_trimmed"] = statistics.median(runs)
    return {
        "status": "ok",
        "phases_s": phases,
        "first_job_s": first,
        "warm_job_s": statistics.median(warm),
        "bare_graph_s": bare["graph"],
        "bare_plain_s": bare["plain"],
        "bare_graph_trimmed_s": bare["graph_trimmed"],
        "threads": torch.get_num_threads(),
    }


# ``nala-sr``'s entry point, preceded by torch's import and a timestamp of its end: what the command does after it
# (ours: importing nala_gen, loading, planning, the job, exiting) is timed in the same process as the job.
LAUNCH = (
    "import sys, time\nimport torch\nsys.stderr.write(f'torch imported at {time.time()!r}\\n')\n"
    "from nala_gen.sr.cli import console\nsys.exit(console())"
)


def cli_run(model: str, src: Path, dst: Path, cache: Path) -> dict:
    """One ``nala-sr upscale`` in a fresh process: wall seconds, the compute its JSON reports, and the seconds from
    the end of torch's import to the process's exit beyond that compute (``ours_s``, the project's overhead)."""
    cmd = [sys.executable, "-c", LAUNCH, "upscale", str(src), "-o", str(dst), "--model", model]
    env = {**os.environ, "NALA_GEN_PROBE_CACHE": str(cache)}
    start = time.perf_counter()
    proc = subprocess.run([*cmd, "--json", "-q"], capture_output=True, text=True, env=env)
    wall, ended = time.perf_counter() - start, time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"nala-sr upscale failed: {proc.stderr.strip().splitlines()[-1:]}")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    torch_imported = float(proc.stderr.split("torch imported at ", 1)[1].split()[0])
    compute = record["latency_s"]
    ours = ended - torch_imported - compute
    return {"wall_s": wall, "compute_s": compute, "beyond_s": wall - compute, "ours_s": ours}


def interpreter_s() -> float:
    """Wall seconds of ``python -c pass`` (the interpreter's own start and exit)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def medians(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = result["phases"]["phases_s"]
    fig, ax = plt.subplots(figsize=(9, 3.2), dpi=110)
    rows = [("first run (no probe cache)", result["cli_first"]), ("later runs (probe cache)", result["cli_cached"])]
    names = ["interpreter", *phases, "compute (job)", "rest (CLI, exit)"]
    colours = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}  # one colour per part in both rows
    for y, (_, run) in enumerate(rows):
        left = 0.0
        parts = [("interpreter", result["interpreter_s"])]
        parts += [(name, seconds) for name, seconds in phases.items() if y == 0 or name != "plan (probes)"]
        parts.append(("compute (job)", run["compute_s"]))
        known = sum(seconds for _, seconds in parts)
        parts.append(("rest (CLI, exit)", max(run["wall_s"] - known, 0.0)))
        for name, seconds in parts:
            ax.barh(y, seconds, left=left, color=colours[name], label=name if y == 0 else None)
            left += seconds
        ax.text(left + 0.05, y, f"{run['wall_s']:.2f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_xlabel("seconds (phases from the phase worker, walls and compute from the command)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    ax.set_title(f"one-image nala-sr upscale, {result['model']}, {result['side']} px in, this CPU", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench upscale-overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="nalasr-light-x4")
    parser.add_argument("--side", type=int, default=256, help="square LR input side (256: 1 MP out at x4)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)

    from PIL import Image

    from nala_gen.bench.upscale_throughput import sample_input

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = folder / "in.png"
        Image.fromarray(sample_input(args.side)).save(src)
        interpreter = statistics.median(interpreter_s() for _ in range(args.repeats))
        first, cached, workers = [], [], []
        for i in range(args.repeats):
            cache = folder / f"probes{i}.json"  # empty: a first run
            first.append(cli_run(args.model, src, folder / "out.png", cache))
            cached.append(cli_run(args.model, src, folder / "out.png", cache))
            env = {"NALA_GEN_PROBE_CACHE": "off"}
            kwargs = {"model": args.model, "path": str(src), "repeats": args.repeats}
            worker = run_fresh("nala_gen.bench.upscale_overhead:phase_worker", kwargs, env)
            if worker["status"] != "ok":
                raise RuntimeError(f"phase worker: {worker}")
            workers.append(worker)
    phase_runs = [w["phases_s"] for w in workers]
    phases = {name: statistics.median(p[name] for p in phase_runs) for name in PHASES}
    summary = medians([{k: v for k, v in w.items() if k.endswith("_s") and k != "phases_s"} for w in workers])
    result = {
        "machine": machine_info("cpu"),
        "model": args.model,
        "side": args.side,
        "input": "assets/chelsea_lr_x4.png resized (Pillow bicubic) to the side, PNG",
        "repeats": args.repeats,
        "interpreter_s": interpreter,
        "cli_first": medians(first),
        "cli_cached": medians(cached),
        "cli_first_runs": first,
        "cli_cached_runs": cached,
        "phases": {"phases_s": phases, **summary},
        "engine_over_bare": summary["warm_job_s"] / summary["bare_graph_s"],
        "first_job_over_bare": summary["first_job_s"] / summary["bare_graph_s"],
        "engine_over_bare_trimmed": summary["warm_job_s"] / summary["bare_graph_trimmed_s"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "upscale_overhead"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(result, stem.with_suffix(".png"))
    for label, run in (("first run", result["cli_first"]), ("cached", result["cli_cached"])):
        wall, compute, beyond = run["wall_s"], run["compute_s"], run["beyond_s"]
        print(
            f"{label:<10} wall {wall:.2f} s = compute {compute:.2f} s + beyond {beyond:.2f} s "
            f"(ours, after torch's import: {run['ours_s']:.2f} s)"
        )
    print("phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()) + f"; interpreter {interpreter:.2f} s")
    print(
        f"engine warm job {summary['warm_job_s']:.2f} s (first {summary['first_job_s']:.2f} s) vs bare graph "
        f"{summary['bare_graph_s']:.2f} s (plain network {summary['bare_plain_s']:.2f} s): "
        f"x{result['engine_over_bare']:.2f}; bare graph from a trimmed heap {summary['bare_graph_trimmed_s']:.2f} s: "
        f"x{result['engine_over_bare_trimmed']:.2f}"
    )
    print(f"wrote {stem}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def upscale_overhead_table() -> str:
    data = load("upscale_overhead.json")
    phases = data["phases"]
    lines = [
        f"{data['model']}, {data['side']}² PNG in, x4, fp32, {cores(data['machine'])}, "
        f"torch {data['machine']['torch']}; median of {data['repeats']} fresh processes each.",
        "",
        "| one-image `nala-sr upscale` | wall | compute (job) | beyond compute "
        "| ours: after torch's import, beyond compute |",
        "|---|---|---|---|---|",
    ]
    for label, key in (("first run on this machine (no probe cache)", "cli_first"), ("later runs", "cli_cached")):
        run = data[key]
        ours = f"{run['ours_s']:.2f} s" if "ours_s" in run else "not measured"  # older files lack it
        lines.append(
            row(label, f"{run['wall_s']:.2f} s", f"{run['compute_s']:.2f} s", f"{run['beyond_s']:.2f} s", ours)
        )
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


TABLES = (Table("upscale-overhead", ("upscale_overhead.json",), upscale_overhead_table),)
