"""Export the mini-trained BasicSR checkpoints as named weights and measure them on the validation split.

Run by ``make weights-sr`` after the three trainings; reads each run's log for its wall time and writes
``weights/NAME.{safetensors,json}`` plus ``benchmarks/results/sr_quality.json``.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml

import nala_gen.sr  # noqa: F401
from nala_gen.sr.models import export_checkpoint

# How the shipped runs actually went on this machine (kept on each card, so the times above can be read right).
SHARED = "ran concurrently with the other two runs on 2 shared vCPUs, one thread each (OMP_NUM_THREADS=1)"
RUN_NOTES = {
    "nalasr-light-x4": SHARED + "; it started with two threads, was stopped at iteration 750 and resumed from its "
    "500 checkpoint with --auto_resume",
    "esrt-x4": SHARED,
    "nalasr-light-x2": SHARED,
}
RUNS = {
    "nalasr-light-x4": "options/train/NaLaSR/train_NaLaSR_light_x4_mini.yml",
    "esrt-x4": "options/train/ESRT/train_ESRT_x4_mini.yml",
    "nalasr-light-x2": "options/train/NaLaSR/train_NaLaSR_light_x2_mini.yml",
}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def train_seconds(log_dir: Path, total_iter: int) -> float:
    """Wall time from 'Start training' to the last logged iteration <= total_iter, summed over the run's logs
    (an interrupted and resumed run has several; iterations redone after a resume count twice)."""
    stamp = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ INFO: "
    total = 0.0
    for log in sorted(log_dir.glob("train_*.log")):
        start = end = None
        for line in log.read_text().splitlines():
            if m := re.match(stamp + "Start training", line):
                start = datetime.fromisoformat(m.group(1))
            elif (m := re.match(stamp + r".*iter:\s+(\d+),", line)) and int(m.group(2)) <= total_iter:
                end = datetime.fromisoformat(m.group(1))
        if start and end:
            total += (end - start).total_seconds()
    return total


def main() -> int:
    import torch

    device = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU: {cpu_name()} ({torch.get_num_threads()} threads)"
    )
    for name, option in RUNS.items():
        opt = yaml.safe_load(Path(option).read_text())
        exp = Path("experiments") / opt["name"]
        train = opt["datasets"]["train"]
        info = {
            "trained_on": "embedded mini train split (nala-sr prepare mini: 10 scikit-image photos, "
            "192 px HR sub-images, MATLAB-bicubic LR)",
            "validated_on": "embedded mini val split (2 scikit-learn + 2 scikit-image photos, held out)",
            "iterations": opt["train"]["total_iter"],
            "batch": train["batch_size_per_gpu"],
            "lr_patch": train["gt_size"] // opt["scale"],
            "seed": opt["manual_seed"],
            "train_time_s": train_seconds(exp, opt["train"]["total_iter"]),
            "hardware": device,
            "command": f"python -m nala_gen.sr.train -opt {option}",
            "notes": RUN_NOTES.get(name, ""),
        }
        checkpoint = exp / "models" / f"net_g_{opt['train']['total_iter']}.pth"
        card = export_checkpoint(checkpoint, option, name, "weights", info)
        print(f"exported {card}")
    for scale, models in ((4, ["bicubic", "esrt-x4", "nalasr-light-x4"]), (2, ["bicubic", "nalasr-light-x2"])):
        cmd = ["nala-sr", "evaluate", "--scale", str(scale), "--models", *models]
        subprocess.run([*cmd, "--json", "benchmarks/results/sr_quality.json"], check=True)
    print(json.dumps(json.loads(Path("benchmarks/results/sr_quality.json").read_text()), indent=1)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
