"""Export the trained BasicSR checkpoints as named weights and measure them on the validation splits.

Run by ``make weights-sr`` after the trainings; reads each run's log for its wall time and writes
``weights/NAME.{safetensors,json}`` plus ``benchmarks/results/sr_quality.json`` (the embedded mini val split) and
``benchmarks/results/sr_quality_photos.json`` (the photo set's held-out split, where it has been prepared).

``python scripts/ship_sr_weights.py [NAME ...]`` ships only the named weights and scores only their scales (a
stage of one network retrained: the others' cards and scores stay as they are).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml

from nala_gen.sr.loading import export_checkpoint

# How the shipped runs actually went on this machine (kept on each card, so the times above can be read right).
ONE_THREAD = "one thread each (OMP_NUM_THREADS=1) on 2 shared vCPUs"
STAGE_2 = (
    "; stage 2 ran beside the other x4 network's stage 2, one thread each, from stage 1's final weights (restored "
    "from the card's safetensors: stage 1 had trained in another checkout)"
)
STAGE_3 = (
    "; stage 3 ran beside the other x4 network's stage 3, one thread each, from stage 2's EMA weights (restored "
    "from the card's safetensors: stage 2 had trained in another checkout), with an EDSR ablation run beside them "
    "for about 25 of its minutes"
)
STAGE_4 = (
    "; stage 4 ran beside the other x4 network's stage 4, one thread each, from stage 3's shipped weights "
    "(--force_yml path:pretrain_network_g=weights/NAME.safetensors: stage 3 had trained in another checkout), with "
    "the test suite and short evaluations beside them for about 25 of their minutes"
)
STAGE_5 = (
    "; stage 5 ran beside the other x4 network's stage 5, one thread each, from stage 4's run in this checkout, "
    "stopped (SIGSTOP) for about 20 minutes of benchmarks and beside short tests and evaluations for about 15"
)
STAGE_6 = (
    "; stage 6 (LR patch 48 px, batch 4) ran beside the other x4 network's stage 6, one thread each, from stage 5's "
    "run in this checkout, restarted once from its checkpoint (iterations 1,000 and 750) when its budget was cut "
    "from 3,000 to 2,500, stopped (SIGSTOP) for a few minutes of benchmarks and beside builds and tests of the "
    "fused op for about 30 minutes"
)
STAGE_7 = (
    "; stage 7 (stage 6's recipe) ran beside the other x4 network's stage 7, one thread each, from stage 6's run in "
    "this checkout, restarted from its checkpoints when the machine restarted (ESRT at 1,750 iterations, NaLaSR at "
    "750) and once more for NaLaSR (at 750: its fused-op library was rewritten under it by a profiling build, which "
    "ended the process); ESRT's process ended the same way in its end-of-run validation, after its iteration-2,500 "
    "save, which is what ships (the end-of-run save would hold the same weights); stopped (SIGSTOP) for about 15 "
    "minutes of timings and beside builds and tests of issue 39 throughout"
)
STAGE_8 = (
    "; stage 8 (stage 6's recipe) ran beside the other x4 network's stage 8, one thread each, from stage 7's run in "
    "this checkout, over two sessions (resumed from its checkpoints: ESRT at 1,000 iterations, NaLaSR at 1,750), "
    "stopped (SIGSTOP) for about 30 minutes of timings and beside builds and tests of issue 39 throughout; ESRT's "
    "last 1,000 iterations beside NaLaSR's stage 9 instead of NaLaSR's stage 8; ESRT's end-of-run validation was "
    "stopped to free the CPU for shipping, after its iteration-2,500 save, which is what ships (the end-of-run save "
    "would hold the same weights)"
)
STAGE_9 = (
    "; stage 9 (stage 6's recipe) ran beside the other x4 network's stage 9, one thread each, from stage 8's run in "
    "this checkout, over two sessions (resumed from its checkpoint at 2,000 iterations), stopped (SIGSTOP) for about "
    "15 minutes of timings and beside builds and tests of issue 39; it shipped before ESRT's stage 9 had finished"
)
STAGE_10 = (
    "; stage 10 (issue 56: the 490 photographs, batch 4, LR patch 48 px, channels-last with a bf16 forward where "
    "the CPU has native bf16) ran in one sitting with one thread (OMP_NUM_THREADS=1), beside a NaLaDiT ablation "
    "training (one thread) and fresh-clone test runs, from stage 9's shipped weights (--force_yml: stage 9 had "
    "trained in another checkout); it ships its EMA at the sitting's last checkpoint, scored on the four standard "
    "sets before and after (sets_psnr)"
)
ESRT_STAGE_9 = (
    "; stage 9 (stage 6's recipe) started beside the other x4 network's stage 9, one thread each, but its checkout "
    "was not handed on at 1,000 iterations; it ran again from the start in the next session, with two threads and "
    "no other training, from stage 8's shipped weights (--force_yml path:pretrain_network_g=weights/esrt-x4."
    "safetensors: stage 8's EMA, what its run in the earlier checkout held), stopped (SIGSTOP) for about 10 minutes "
    "of timings and beside builds and tests of issue 39 for its first 45 minutes; its end-of-run validation was "
    "stopped to free the CPU for shipping, after its iteration-2,500 save, which is what ships (the end-of-run save "
    "would hold the same weights)"
)
RUN_NOTES = {
    "nalasr-light-x4": "stage 1 ran beside the esrt-x4 run, " + ONE_THREAD + ", while tests and a memory benchmark "
    "ran too" + STAGE_2 + STAGE_3 + STAGE_4 + STAGE_5 + STAGE_6 + STAGE_7 + STAGE_8 + STAGE_9 + STAGE_10,
    "esrt-x4": "stage 1 ran beside the nalasr-light-x4 run, " + ONE_THREAD + ", while tests and a memory benchmark "
    "ran too" + STAGE_2 + STAGE_3 + STAGE_4 + STAGE_5 + STAGE_6 + STAGE_7 + STAGE_8 + ESRT_STAGE_9,
    "nalasr-light-x2": "stage 1 ran beside the esrt-x4 run, " + ONE_THREAD + "; stage 2 ran with two threads "
    "(OMP_NUM_THREADS=2) and no other training, beside short tests and micro-benchmarks in its first 10 minutes, "
    "from stage 1's weights (restored from the card's safetensors: stage 1 had trained in another checkout); stage 3 "
    "ran with two threads and no other training, beside the test suite for its first ~16 minutes, from stage 2's "
    "shipped weights (--force_yml path:pretrain_network_g=weights/nalasr-light-x2.safetensors: stage 2 had trained in "
    "another checkout); stage 4 (LR patch 48 px, batch 4) ran with one thread from stage 3's run in this checkout, "
    "beside the x4 pair's stage-6 ESRT run, stopped (SIGSTOP) for about 6 minutes of benchmarks; stage 5 (stage 4's "
    "recipe, 3,000 iterations) ran with one thread from stage 4's run in this checkout, beside the x4 pair's stage-7 "
    "ESRT run for its second half and beside builds, tests and benchmarks of issue 39 throughout, stopped (SIGSTOP) "
    "for a few minutes of timings",
}
# Each shipped weight's training stages, in order: a later stage starts from the one before (its
# ``pretrain_network_g``); the last one is exported.
RUNS = {
    "nalasr-light-x4": [
        "options/train/NaLaSR/train_NaLaSR_light_x4_mini.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_mini_ft.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_photos_ft.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_photos_stage4.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_photos_stage5.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_photos_stage6.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_photos_stage7.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_photos_stage8.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_photos_stage9.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x4_sets.yml",
    ],
    "esrt-x4": [
        "options/train/ESRT/train_ESRT_x4_mini.yml",
        "options/train/ESRT/train_ESRT_x4_mini_ft.yml",
        "options/train/ESRT/train_ESRT_x4_photos_ft.yml",
        "options/train/ESRT/train_ESRT_x4_photos_stage4.yml",
        "options/train/ESRT/train_ESRT_x4_photos_stage5.yml",
        "options/train/ESRT/train_ESRT_x4_photos_stage6.yml",
        "options/train/ESRT/train_ESRT_x4_photos_stage7.yml",
        "options/train/ESRT/train_ESRT_x4_photos_stage8.yml",
        "options/train/ESRT/train_ESRT_x4_photos_stage9.yml",
    ],
    "nalasr-light-x2": [
        "options/train/NaLaSR/train_NaLaSR_light_x2_mini.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x2_photos_ft.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x2_photos_stage3.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x2_photos_stage4.yml",
        "options/train/NaLaSR/train_NaLaSR_light_x2_photos_stage5.yml",
    ],
}
# What each data set of the options (their datasets' ``name``) is, for the cards.
DATA = {
    "mini": "embedded mini train split (nala-sr prepare mini: 10 scikit-image photos, 192 px HR sub-images, "
    "MATLAB-bicubic LR)",
    "photos": "photo set train split (nala-sr prepare photos: 29 photographs from Debian's wallpaper packages and "
    "scikit-image, 480 px HR sub-images, MATLAB-bicubic LR)",
    "photos_enlarged": "enlarged photo set train split (nala-sr prepare photos since issue 38: the photo set's 29 "
    "plus 15 lomiri photographs, train only, 480 px HR sub-images, MATLAB-bicubic LR)",
    "photographs_490": "the 490 training photographs of ../shared/datasets/train (T91, BSD200 and the BSDS500 test "
    "split; nala-sr prepare train: 3,327 HR sub-images of 240 px from the 439 of at least 192 px, MATLAB-bicubic "
    "LR; none of them a test picture)",
}
VALIDATION = {
    "mini_val": "embedded mini val split (2 scikit-learn + 2 scikit-image photos, held out)",
    "photos_val": "photo set val split (8 pictures held out by picture, among them the mini val photos)",
}


def validated_on(opt: dict) -> str:
    """The validation sets of a run's options (BasicSR's ``val``, or ``val_1``, ``val_2``, ...), as the card says."""
    names = [d["name"] for key, d in opt["datasets"].items() if key.startswith("val")]
    return " and ".join(VALIDATION.get(name, name) for name in names)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def training_facts(log_dir: Path, upto: int | None = None) -> tuple[float, int]:
    """(wall seconds from 'Start training' to 'End of training' or the last logged line, summed over the run's
    logs; the last iteration the run reached). With ``upto``, only up to the first line at that iteration (the time
    a periodic checkpoint took). An interrupted and resumed run has several logs; iterations redone after a resume
    count twice in the time."""
    stamp = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ INFO: "
    total, last_iter = 0.0, 0
    for log in sorted(log_dir.glob("train_*.log")):
        start = end = None
        for line in log.read_text().splitlines():
            if m := re.match(stamp + "Start training", line):
                start = datetime.fromisoformat(m.group(1))
            elif m := re.match(stamp + r".*(iter:\s+[\d,]+,|End of training)", line):
                end = datetime.fromisoformat(m.group(1))
            # BasicSR logs the iteration every print_freq and, at each validation, as "@ N iter".
            for found in re.findall(r"iter:\s+([\d,]+),|@ (\d+) iter", line):
                last_iter = max(last_iter, *(int(x.replace(",", "")) for x in found if x))
            if upto is not None and last_iter >= upto:
                break
        if start and end:
            total += (end - start).total_seconds()
        if upto is not None and last_iter >= upto:
            break
    return total, last_iter


def shipped_checkpoint(exp: Path) -> tuple[Path, int | None]:
    """(checkpoint, its iteration): the end-of-training one, else (a run still going) the latest periodic save."""
    latest = exp / "models" / "net_g_latest.pth"
    if latest.is_file():
        return latest, None
    saves = {int(p.stem.rsplit("_", 1)[1]): p for p in (exp / "models").glob("net_g_*.pth") if p.stem[6:].isdigit()}
    if not saves:
        raise SystemExit(f"no checkpoint under {exp / 'models'}: train first")
    it = max(saves)
    return saves[it], it


def command(option: str) -> str:
    return f"python -m nala_gen.sr.train -opt {option}"


def stage_facts(name: str, option: str, opt: dict, device: str) -> dict | None:
    """What one stage's run took: from its logs here, else from the card shipped before (a stage trained in
    another checkout, whose logs are gone); None when neither knows it."""
    exp = Path("experiments") / opt["name"]
    logs = sorted(exp.glob("train_*.log"))
    if logs:
        upto = shipped_checkpoint(exp)[1] if (exp / "models").is_dir() else None
        seconds, iterations = training_facts(exp, upto)
        # BasicSR logs its closing validation one or two iterations past the last one it trained.
        return {
            "command": command(option),
            "iterations": min(iterations, opt["train"]["total_iter"]),
            "train_time_s": seconds,
            "hardware": device,
        }
    card = Path("weights") / f"{name}.json"
    info = json.loads(card.read_text())["info"] if card.is_file() else {}
    for stage in info.get("stages", [info]):
        if stage.get("command") == command(option):
            return {key: stage[key] for key in ("command", "iterations", "train_time_s", "hardware")}
    return None


SETS = "benchmarks/results/sr_sets.json"
MUST_IMPROVE = ("Set5", "Urban100")


def score_on_the_sets(name: str, scale: int, card: Path, before_file: bytes | None) -> bool:
    """Score the exported weights on the four standard sets (``nala-bench sr-sets --update``), put each set's PSNR
    before (the weights shipped before) and after on the card's last stage, and say whether Set5 and Urban100
    improved."""
    subprocess.run(["nala-bench", "sr-sets", "--update", "--scales", str(scale), "--models", name], check=True)
    scores = json.loads(Path(SETS).read_text())["scales"][f"x{scale}"]
    earlier = json.loads(before_file)["scales"].get(f"x{scale}", {}) if before_file else {}
    psnr = {
        s: {"before": earlier.get(s, {}).get(name, {}).get("psnr"), "after": scores[s][name]["psnr"]} for s in scores
    }
    content = json.loads(card.read_text())
    stage = content["info"]["stages"][-1] if "stages" in content["info"] else content["info"]
    stage["sets_psnr"] = psnr
    card.write_text(json.dumps(content, indent=2) + "\n")
    for s, p in psnr.items():
        print(f"{name} x{scale} {s}: {p['before']} -> {p['after']:.3f} dB")
    return all(psnr[s]["before"] is None or psnr[s]["after"] > psnr[s]["before"] for s in MUST_IMPROVE)


def main(names: list[str]) -> int:
    import torch

    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        raise SystemExit(f"unknown weights {', '.join(unknown)}; shipped here: {', '.join(RUNS)}")
    runs = {name: options for name, options in RUNS.items() if not names or name in names}

    # The machine the runs trained on (this script runs right after them in make weights-sr).
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU: {cpu_name()}, {os.cpu_count()} vCPUs"
    for name, options in runs.items():
        option = options[-1]
        stage_opts = [yaml.safe_load(Path(o).read_text()) for o in options]
        opt = stage_opts[-1]
        exp = Path("experiments") / opt["name"]
        if not exp.is_dir():  # a run trained in another checkout: its shipped weights stay as they are
            print(f"kept weights/{name}.json: no {exp} here")
            continue
        stages = [stage_facts(name, o, stage_opt, device) for o, stage_opt in zip(options, stage_opts)]
        if None in stages:
            missing = options[stages.index(None)]
            raise SystemExit(f"{name}: no logs and no earlier card for {missing}: train it first")
        train = opt["datasets"]["train"]
        checkpoint, upto = shipped_checkpoint(exp)
        iterations = sum(s["iterations"] for s in stages)
        info = {
            "trained_on": ", then ".join(dict.fromkeys(DATA[o["datasets"]["train"]["name"]] for o in stage_opts)),
            "validated_on": validated_on(opt),
            # BasicSR 1.4.2 sizes its epoch loop with ceil(len / batch) but drops the last partial batch, so a run
            # can stop short of total_iter (7,000 -> 6,954 here): the card gives the iterations actually run.
            "iterations": iterations,
            "total_iter_option": sum(stage_opt["train"]["total_iter"] for stage_opt in stage_opts),
            "batch": train["batch_size_per_gpu"],
            "lr_patch": train["gt_size"] // opt["scale"],
            "seed": opt["manual_seed"],
            "train_time_s": sum(s["train_time_s"] for s in stages),
            "hardware": " + ".join(dict.fromkeys(s["hardware"] for s in stages)),
            "command": " && ".join(s["command"] for s in stages),
            "notes": RUN_NOTES.get(name, ""),
        }
        if len(stages) > 1:
            info["stages"] = stages
        # BasicSR's EMA starts as a copy of the network it starts from and keeps decay**iterations of it (0.999:
        # 37 % after 1,000 iterations, 5 % after 3,000; a from-scratch EMA model validated at 13.5 dB at 1,000
        # here). From a random init, until that share is below 1 %, and for a checkpoint from mid-run, the raw
        # weights ship; a stage that starts from trained weights ships its EMA.
        decay = opt["train"].get("ema_decay", 0)
        from_scratch = not opt["path"].get("pretrain_network_g")
        param_key = None
        if upto is not None:
            # a stage from trained weights has a meaningful EMA at any iteration; one from scratch ships its raw weights
            param_key = "params" if from_scratch or not decay else "params_ema"
            kind = "raw (non-EMA)" if param_key == "params" else "EMA"
            interim = f"interim: the {kind} weights at {upto:,} of {opt['train']['total_iter']:,} iterations. "
            info["notes"] = interim + info["notes"]
        elif from_scratch and decay > 0 and decay ** stages[-1]["iterations"] > 0.01:
            param_key = "params"
            info["notes"] = (
                f"the raw weights: after {iterations:,} iterations the EMA (decay {decay}) still holds "
                f"{decay ** stages[-1]['iterations']:.0%} of its random init. " + info["notes"]
            )
        info["param_key"] = param_key or "params_ema (when the run has an EMA), else params"
        for stage in info.get("stages", []):
            stage.setdefault("samples", stage["iterations"] * train["batch_size_per_gpu"])
        shipped = {p: p.read_bytes() for p in map(Path, (f"weights/{name}.json", f"weights/{name}.safetensors", SETS))
                   if p.is_file()}  # fmt: skip
        card = export_checkpoint(checkpoint, option, name, "weights", info, param_key)
        print(f"exported {card}")
        if "val_1" in opt["datasets"]:  # a stage validated on the standard test sets ships only if they improve
            improved = score_on_the_sets(name, opt["scale"], card, shipped.get(Path(SETS)))
            if not improved:
                for path, data in shipped.items():
                    path.write_bytes(data)
                raise SystemExit(f"kept weights/{name}: this stage does not improve Set5 and Urban100 (see above)")
    for scale, models in ((4, ["bicubic", "esrt-x4", "nalasr-light-x4"]), (2, ["bicubic", "nalasr-light-x2"])):
        if not set(models) & set(runs):
            continue
        cmd = ["nala-sr", "evaluate", "--scale", str(scale), "--models", *models]
        subprocess.run([*cmd, "--json", "benchmarks/results/sr_quality.json"], check=True)
        if Path("datasets/photos/val").is_dir():
            # ESRT's softmax does not fit whole on these 2 MP pictures: tiled where a job passes 4 GiB.
            photos = ["--data", "datasets/photos/val", "--tile", "auto", "--memory-budget-mb", "4096"]
            subprocess.run([*cmd, *photos, "--json", "benchmarks/results/sr_quality_photos.json"], check=True)
    print(json.dumps(json.loads(Path("benchmarks/results/sr_quality.json").read_text()), indent=1)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
