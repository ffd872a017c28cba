"""Folder jobs: images per second of ``nala-sr upscale``'s job loop on many images, path against path.

Two made folders (crops of the bundled sample at two LR sizes, PNG in, PNG out at x4) run through the job loop
that ``nala-sr upscale`` runs (:class:`nala_gen.sr.jobs.folder.FolderJob`), in four ways:

* ``sequential``: read, upscale, write in turn (``--io-threads 0``), one process with every core's threads;
* ``pipelined``: the next image decoded and the last one encoded while the network runs (the default);
* ``batched``: pipelined, and images of one size through the network together (``--batch auto``);
* ``2 processes``: the inputs split across two processes as under ``torchrun --nproc-per-node 2`` (every second
  input each, pipelined), one thread each;
* ``video``: the same pictures as the frames of one clip (H.264 in and out, :mod:`nala_gen.sr.jobs.video`), in frames
  per second: what streaming a video costs beside the image path.

Each point is fresh processes that load the shipped weights and warm up on one image before the clock starts
(``--tile auto`` as the CLI's default, with a fixed 4 GiB budget so that every run plans alike);
the figure is the images of the folder over the job loop's wall time (for two processes: from the earlier start
to the later end, the two started together), median of ``--repeats``.

    nala-bench upscale-folder [--model nalasr-light-x4] [--sets 64x64 8x256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from nala_gen.bench.common import machine_info
from nala_gen.bench.tables import Table, cores, load, row
from nala_gen.bench.worker import FreshProcess, failed

# The measurement (each call a fresh process) and its points: SETS × PATHS.
MEASURE = "nala_gen.bench.upscale_folder:worker"
PATHS = {  # name -> (io_threads, batch, processes)
    "sequential": (0, "1", 1),
    "pipelined": (1, "1", 1),
    "batched": (1, "auto", 1),
    "2 processes": (1, "1", 2),
    "video": (0, "1", 1),
}
SETS = ("64x64", "8x256")
BUDGET = 4 * 2**30  # bytes: the memory budget of every path  # COUNTxSIDE: images of SIDE x SIDE LR pixels


def make_folder(folder: Path, count: int, side: int) -> list[Path]:
    """``count`` different crops of the bundled sample, each resized to side x side, as PNG."""
    import numpy as np
    from PIL import Image

    from nala_gen.sr.demo import SAMPLE
    from nala_gen.sr.upscale.imageio import write_image_atomic

    with Image.open(SAMPLE) as img:
        photo = img.convert("RGB")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        w, h = photo.size
        crop = int(min(w, h) * rng.uniform(0.4, 0.9))
        x, y = int(rng.integers(0, w - crop + 1)), int(rng.integers(0, h - crop + 1))
        pixels = np.asarray(photo.crop((x, y, x + crop, y + crop)).resize((side, side), Image.BICUBIC))
        paths.append(write_image_atomic(pixels, folder / f"img{i:03d}.png"))
    return paths


def clip_of(pictures: list[Path], path: Path, rate: int = 24) -> Path:
    """The pictures as the frames of one H.264 clip (CRF 18, no audio)."""
    import av

    from nala_gen.sr.upscale.imageio import read_image

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=rate, options={"crf": "18"})
        first = read_image(pictures[0])
        stream.height, stream.width, stream.pix_fmt = *first.shape[:2], "yuv420p"
        for i, picture in enumerate(pictures):
            frame = av.VideoFrame.from_ndarray(read_image(picture), format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def worker(model: str, folder: str, out: str, io_threads: int, batch: str, rank: int, world: int) -> dict:
    import torch

    from nala_gen.sr.cli import collect_inputs
    from nala_gen.sr.jobs.folder import FolderJob
    from nala_gen.sr.loading import load_sr_model
    from nala_gen.sr.upscale.engine import Upscaler
    from nala_gen.sr.upscale.imageio import read_image

    net, _ = load_sr_model(model, 4)
    # The CLI's default tile ("auto"), with a fixed budget so that the plan is the same on every run.
    engine = Upscaler(net, 4, memory_budget=BUDGET, batch=batch if batch == "auto" else int(batch))
    if Path(folder).is_file():  # the video path
        from nala_gen.sr.jobs.video import upscale_video

        engine.upscale(read_image(collect_inputs([Path(folder).with_suffix("")])[0]))  # warm-up, as below
        start = time.time()
        readout = upscale_video(engine, folder, Path(out) / "clip_x4.mp4")
        end = time.time()
        row = {"start": start, "end": end, "images": readout.frames, "failures": 0, "largest_batch": 1}
        return {**row, "threads": torch.get_num_threads()}
    inputs = collect_inputs([folder])[rank::world]
    done = []
    job = FolderJob(
        engine,
        lambda src, img: Path(out) / f"{src.stem}_x4.png",
        io_threads=io_threads,
        on_done=lambda item, readout: done.append(readout.batch),
    )
    # Warm-up, not timed: oneDNN's primitives, thread pools, the network's memory probes (tile="auto").
    FolderJob(engine, lambda src, img: Path(out) / "warm-up.png").run(inputs[:1])
    start = time.time()
    failures = job.run(inputs)
    end = time.time()
    return {
        "start": start,
        "end": end,
        "images": len(done),
        "failures": failures,
        "threads": torch.get_num_threads(),
        "largest_batch": max(done, default=0),
    }


def point(model: str, folder: Path, path: str, count: int) -> dict:
    io_threads, batch, world = PATHS[path]
    if path == "video":
        folder = folder.with_suffix(".mp4")
    with tempfile.TemporaryDirectory() as out:
        kwargs = {"model": model, "folder": str(folder), "out": out, "io_threads": io_threads, "batch": batch}
        env = {"OMP_NUM_THREADS": "1"} if world > 1 else {}
        procs = [  # all started before any is waited on: side by side
            FreshProcess(MEASURE, {**kwargs, "rank": rank, "world": world}, env) for rank in range(world)
        ]
        results = [proc.result(timeout=3600) for proc in procs]
        for result in results:
            if failed(result):
                raise RuntimeError(f"worker {result['status']}: {result['note']}")
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    images = sum(r["images"] for r in results)
    if images != count or any(r["failures"] for r in results):
        raise RuntimeError(f"{path}: {images} of {count} images done")
    return {
        "wall_s": wall,
        "images_per_s": images / wall,
        "threads_per_process": results[0]["threads"],
        "largest_batch": max(r["largest_batch"] for r in results),
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r["set"] for r in rows))
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.4), dpi=110, squeeze=False)
    for ax, name in zip(axes[0], sets):
        mine = [r for r in rows if r["set"] == name]
        ax.bar([r["path"] for r in mine], [r["images_per_s"] for r in mine], color="tab:blue")
        for i, r in enumerate(mine):
            ax.text(i, r["images_per_s"], f"{r['images_per_s']:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{name} LR images, x4 (PNG in and out)", fontsize=9)
        ax.set_ylabel("images / s")
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nala-bench upscale-folder", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="nalasr-light-x4")
    parser.add_argument("--sets", nargs="+", default=list(SETS), help="COUNTxSIDE, e.g. 64x64")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.sets:
            count, side = (int(v) for v in spec.split("x"))
            folder = Path(tmp) / spec
            pictures = make_folder(folder, count, side)
            if "video" in args.paths:
                clip_of(pictures, folder.with_suffix(".mp4"))
            for path in args.paths:
                runs = [point(args.model, folder, path, count) for _ in range(args.repeats)]
                best = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]  # the median run
                row = {"set": spec, "images": count, "lr_side": side, "path": path, **best}
                row["runs_wall_s"] = [r["wall_s"] for r in runs]
                rows.append(row)
                print(
                    f"{spec:<7} {path:<12} {row['images_per_s']:6.2f} images/s  ({row['wall_s']:.1f} s, "
                    f"{row['threads_per_process']} thread(s) per process, largest batch {row['largest_batch']})",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine_info("cpu"), "model": args.model, "repeats": args.repeats, "rows": rows}
    (args.out / "upscale_folder.json").write_text(json.dumps(result, indent=1))
    plot(rows, args.out / "upscale_folder.png")
    print(f"wrote {args.out / 'upscale_folder.json'} and {args.out / 'upscale_folder.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def make_clip(path: Path, seconds: float = 1.0, rate: int = 12, size: tuple[int, int] = (48, 40), tone_hz=440.0):
    """A made video for tests and this benchmark: a moving colour pattern of ``size`` (width, height) at ``rate``
    frames per second in H.264, with a sine tone in AAC (48 kHz, mono) as long as the video."""
    import av
    import numpy as np

    w, h = size
    frames = round(seconds * rate)
    sample_rate = 48000
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=rate, options={"crf": "23"})
        video.width, video.height, video.pix_fmt = w, h, "yuv420p"
        audio = out.add_stream("aac", rate=sample_rate, layout="mono")
        yy, xx = np.mgrid[0:h, 0:w]
        for i in range(frames):
            pixels = np.stack([(xx * 5 + i * 9) % 256, (yy * 7 + i * 5) % 256, ((xx + yy) * 3) % 256], axis=2)
            frame = av.VideoFrame.from_ndarray(pixels.astype(np.uint8), format="rgb24")
            frame.pts = i
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        t = np.arange(round(seconds * sample_rate)) / sample_rate
        tone = (0.3 * np.sin(2 * np.pi * tone_hz * t)).astype(np.float32)
        for at in range(0, len(tone), 1024):
            frame = av.AudioFrame.from_ndarray(tone[None, at : at + 1024], format="flt", layout="mono")
            frame.sample_rate, frame.pts = sample_rate, at
            out.mux(audio.encode(frame))
        out.mux(audio.encode(None))
    return path


# ------------------------------------------------------------------------------------------------ tables
# The docs' tables of the JSON this module writes, declared for scripts/results_tables.py.


def upscale_folder_table() -> str:
    data = load("upscale_folder.json")
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


TABLES = (Table("upscale-folder", ("upscale_folder.json",), upscale_folder_table),)
