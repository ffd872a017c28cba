"""Where the fused NaLa op shows: a NaLaSR training step and a NaLaDiT sampling step, with the op on and off.

Each (step, path) is a fresh process; ``path`` is ``fused`` (the default) or ``eager`` (``NALA_GEN_FUSED=0``, the
PyTorch path, i.e. before the op). Steps:

* ``nalasr_train``: the shipped NaLaSR-light x4 network in train mode, the mini options' batch (8 LR patches of
  32 x 32, 128 x 128 HR), L1 loss against a random target, one Adam step; forward + backward + update;
* ``nalasr_upscale``: the same network's whole-image forward at 256 x 256 LR (1 MP out), inference mode;
* ``naladit_sample``: one denoiser call of the shipped naladit-digits-block transformer (the NaLa block with
  RoPE, LePE and the gate, all of which the fused path covers) on a classifier-free-guidance batch (2 x 4 latents
  at its sample size), inference mode.

Reports the median of ``--repeats`` timed runs after one warm-up, and the eager/fused ratio per step.

    nala-bench steps [--steps nalasr_train nalasr_upscale naladit_sample] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from nala_gen.bench.common import machine_info
from nala_gen.bench.tables import Table, load, row
from nala_gen.bench.worker import run_fresh

# The measurement (each call a fresh process) and its points: STEPS × PATHS.
MEASURE = "nala_gen.bench.step_timing:worker"
STEPS = ("nalasr_train", "nalasr_upscale", "naladit_sample")
PATHS = ("fused", "eager")


def _step_fn(step: str):
    """A zero-argument callable running one step, built (weights loaded, inputs made) outside the timing."""
    import torch

    torch.manual_seed(0)
    if step.startswith("nalasr"):
        from nala_gen.sr.loading import load_sr_model

        net, _ = load_sr_model("nalasr-light-x4", 4)
        if step == "nalasr_upscale":
            net.eval()
            lr = torch.rand(1, 3, 256, 256)

            def upscale():
                with torch.inference_mode():
                    net(lr)

            return upscale
        net.train()
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
        lr, hr = torch.rand(8, 3, 32, 32), torch.rand(8, 3, 128, 128)

        def train():
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.l1_loss(net(lr), hr).backward()
            optimizer.step()

        return train
    from nala_gen.diffusion.loading import load_pipeline

    pipe, _ = load_pipeline("naladit-digits-block")
    model = pipe.transformer.eval()
    config = model.config
    latents = torch.randn(8, config.in_channels, config.sample_size, config.sample_size)
    labels = torch.tensor([0, 1, 2, 3] + [config.num_classes] * 4)
    timestep = torch.full((8,), 500.0)

    def sample():
        with torch.inference_mode():
            model(latents, timestep, labels)

    return sample


def worker(step: str, repeats: int) -> dict:
    fn = _step_fn(step)
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return {"status": "ok", "latency_s": statistics.median(runs), "runs_s": runs, "first_call_s": first}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s for s in STEPS if any(r["step"] == s for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for offset, name in zip((-0.2, 0.2), PATHS):
        values = [
            next((r["latency_s"] for r in rows if r["step"] == s and r["path"] == name and r["status"] == "ok"), 0)
            for s in steps
        ]
        ax.bar([i + offset for i in range(len(steps))], values, width=0.4, label=name)
    ax.set_xticks(range(len(steps)), steps)
    ax.set_ylabel("seconds per step (median)")
    ax.set_title("NaLa steps on this CPU: fused op vs PyTorch path (fresh process each)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench steps", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)

    rows = []
    for step in args.steps:
        for path in PATHS:
            env = {"NALA_GEN_FUSED": "1" if path == "fused" else "0"}
            result = run_fresh(MEASURE, {"step": step, "repeats": args.repeats}, env)
            rows.append({"step": step, "path": path, **result})
            shown = f"{result['latency_s']:.3f} s" if result["status"] == "ok" else result.get("note", "")
            print(f"{step:<16} {path:<6} {shown}", flush=True)
    timed = {(r["step"], r["path"]): r["latency_s"] for r in rows if r["status"] == "ok"}
    speedups = {
        s: timed[(s, "eager")] / timed[(s, "fused")]
        for s in args.steps
        if (s, "eager") in timed and (s, "fused") in timed
    }
    for step, ratio in speedups.items():
        print(f"{step:<16} eager / fused = {ratio:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine_info("cpu"), "repeats": args.repeats, "rows": rows, "eager_over_fused": speedups}
    (args.out / "step_timing.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "step_timing.png")
    print(f"wrote {args.out / 'step_timing.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def step_timing_table() -> str:
    data = load("step_timing.json")
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


TABLES = (Table("step-timing", ("step_timing.json",), step_timing_table),)
