"""``nala-sr``: upscale images, and train, test and prepare data for NaLaSR / ESRT.

    nala-sr upscale photo.png --scale 4 [-o out.png] [--outscale 3.5] [--tile auto] [--json]
    nala-sr models
    nala-sr export experiments/X/models/net_g_latest.pth --opt X.yml --name my-model [--out weights]
    nala-sr export-onnx nalasr-light-x4 -o nalasr-light-x4.onnx
    nala-sr evaluate --data datasets/mini/val --scale 4 --models bicubic nalasr-light-x4
nala-sr train -opt options/train/NaLaSR/train_NaLaSR_light_x4_mini.yml [--auto_resume] [...BasicSR flags]
nala-sr test  -opt options/test/NaLaSR/test_NaLaSR_light_x4_mini.yml
nala-sr prepare mini [datasets/mini]
nala-sr prepare div2k datasets/DIV2K [--lmdb]
nala-sr prepare benchmark HR_FOLDER datasets/Set5
nala-sr prepare benchmarks ../shared/datasets/benchmark [datasets]   (every test set found there)
nala-sr prepare train ../shared/datasets/train [datasets/train] --tests ../shared/datasets/benchmark
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from pathlib import Path

from nala_gen.cliargs import bounded, error_line, leave, run_command, tile_setting


def _scales(text: str) -> list[int]:
    scales = [int(s) for s in text.split(",")]
    if any(s not in (2, 3, 4) for s in scales):
        raise argparse.ArgumentTypeError("scales must be among 2, 3, 4")
    return scales


def prepare(argv: list[str]) -> int:
    from . import data

    parser = argparse.ArgumentParser(prog="nala-sr prepare", description="Make datasets in BasicSR's layouts.")
    sub = parser.add_subparsers(dest="what", required=True)
    mini = sub.add_parser("mini", help="the embedded set from scikit-image / scikit-learn photos")
    mini.add_argument("out", nargs="?", type=Path, default=Path("datasets/mini"))
    mini.add_argument("--limit", type=bounded(int, 1), help="only the first N images of each split")
    div2k = sub.add_parser("div2k", help="DIV2K sub-images and bicubic LR (ROOT/DIV2K_train_HR must exist)")
    div2k.add_argument("root", type=Path)
    div2k.add_argument("--crop", type=int, default=480)
    div2k.add_argument("--step", type=int, default=240)
    div2k.add_argument("--lmdb", action="store_true", help="also pack every folder as LMDB with meta_info.txt")
    photos = sub.add_parser("photos", help="DIV2K-style set from the photographs in Debian's wallpaper packages")
    photos.add_argument("out", nargs="?", type=Path, default=Path("datasets/photos"))
    photos.add_argument("--install", action="store_true", help="apt-get install the wallpaper packages (root)")
    photos.add_argument("--crop", type=bounded(int, 48), default=480)
    photos.add_argument("--step", type=bounded(int, 1), default=240)
    photos.add_argument("--no-mini", action="store_true", help="leave out the mini set's scikit-image/-learn photos")
    photos.add_argument("--lmdb", action="store_true", help="also pack the train folders as LMDB")
    bench = sub.add_parser("benchmark", help="GTmod12 + LRbicx{2,3,4} from any folder of HR images")
    bench.add_argument("hr_dir", type=Path)
    bench.add_argument("out", type=Path)
    sets = sub.add_parser(
        "benchmarks",
        help="every test set under SRC (Set5/, Set14/, B100/, Urban100/, ...: HR images, or <set>/HR/) -> "
        "OUT/<set>/GTmod12 + LRbicx{2,3,4}, as the test option files read them; a SHA256SUMS in SRC or above "
        "is checked",
    )
    sets.add_argument("src", type=Path)
    sets.add_argument("out", nargs="?", type=Path, default=Path("datasets"))
    sets.add_argument("--sets", nargs="+", metavar="NAME", help="only these sets (default: every one found)")
    train = sub.add_parser(
        "train",
        help="every picture under SRC -> HR sub-images and MATLAB-bicubic LR copies "
        "(OUT/HR_sub, OUT/LR_bicubic/X{s}_sub)",
    )
    train.add_argument("src", type=Path)
    train.add_argument("out", nargs="?", type=Path, default=Path("datasets/train"))
    train.add_argument(
        "--tests", type=Path, help="a folder of test sets none of whose pictures may be in SRC (by content)"
    )
    train.add_argument("--crop", type=bounded(int, 48), default=240, help="sub-image side (default 240)")
    train.add_argument("--step", type=bounded(int, 1), default=120, help="sub-image stride (default 120)")
    train.add_argument(
        "--min-side", type=bounded(int, 12), default=192, help="smaller pictures are left out; up to --crop kept whole"
    )
    for p in (mini, div2k, photos, bench, sets, train):
        p.add_argument("--scales", type=_scales, default=[2, 3, 4], help="comma-separated, e.g. 2,4")
    args = parser.parse_args(argv)

    if args.what == "mini":
        counts = data.prepare_mini(args.out, args.scales, limit=args.limit)
        where = args.out
    elif args.what == "photos":
        from .data import photos as photo_set

        missing = photo_set.missing_packages()
        if missing:
            if not args.install:
                print(
                    f"nala-sr prepare: error: the photo packages {', '.join(missing)} are not installed: add "
                    f"--install (as root) or run apt-get install {' '.join(missing)}",
                    file=sys.stderr,
                )
                return 1
            photo_set.install_packages()
        counts = photo_set.prepare_photos(
            args.out, scales=args.scales, crop=args.crop, step=args.step, include_mini=not args.no_mini, lmdb=args.lmdb
        )
        where = args.out
    elif args.what == "div2k":
        counts = data.prepare_div2k(args.root, args.scales, args.crop, args.step, args.lmdb)
        where = args.root
    elif args.what == "benchmarks":
        made = data.prepare_test_sets(args.src, args.out, args.scales, args.sets)
        checked = "no SHA256SUMS"
        if made["checksums"]:
            checked = f"{made['checked']} files checked against {made['checksums']}"
        listing = ", ".join(f"{name} ({n})" for name, n in made["sets"].items())
        scales = ",".join(map(str, args.scales))
        print(f"wrote {listing} under {args.out} (GTmod12, LRbicx{{{scales}}}; {checked})")
        return 0
    elif args.what == "train":
        counts = data.prepare_train_set(
            args.src, args.out, args.tests, args.scales, args.crop, args.step, args.min_side, progress=print
        )
        left = f", {counts['too_small']} under {args.min_side} px left out" if counts["too_small"] else ""
        checked = f"; {counts['checked']} files' SHA256 checked" if counts["checked"] else ""
        overlap = "; none of them is a test picture" if args.tests else ""
        print(
            f"wrote {counts['sub_images']} HR sub-images and their x{', x'.join(map(str, args.scales))} LR copies "
            f"from {counts['pictures']} pictures under {args.out}{left}{checked}{overlap}"
        )
        return 0
    else:
        counts = data.prepare_benchmark(args.hr_dir, args.out, args.scales)
        where = args.out
    if not sum(counts.values()):
        print(
            f"nala-sr prepare: error: no images were written under {where} (no readable images found)", file=sys.stderr
        )
        return 1
    print(f"wrote {', '.join(f'{v} {k}' for k, v in counts.items())} under {where}")
    return 0


def _basicsr(entry: str, argv: list[str]) -> int:
    """Run BasicSR's own pipeline; it parses sys.argv itself."""
    sys.argv = [f"nala-sr {entry}", *argv]
    if entry == "train":
        from .train import main as run
    else:
        from .test import main as run
    return run() or 0


def collect_inputs(specs: list[str]) -> list[Path]:
    """Files, folders (their images, sorted) and glob patterns (images and videos) -> paths, in order, without
    repeats."""
    from nala_gen.fileio import IMAGE_SUFFIXES, VIDEO_SUFFIXES

    paths: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            paths += sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif glob.has_magic(spec):
            media = IMAGE_SUFFIXES + VIDEO_SUFFIXES
            paths += sorted(Path(p) for p in glob.glob(spec) if Path(p).suffix.lower() in media)
        else:
            paths.append(path)  # a missing file is reported when it is read
    return list(dict.fromkeys(paths))


def names_a_file(output: str | None) -> bool:
    """Whether ``-o`` names an output file (an image or a video) rather than a folder."""
    from nala_gen.fileio import IMAGE_SUFFIXES, VIDEO_SUFFIXES

    return output is not None and Path(output).suffix.lower() in IMAGE_SUFFIXES + VIDEO_SUFFIXES


def output_path(src: Path, args: argparse.Namespace, single: bool, img_suffix: str) -> Path:
    name = f"{src.stem}{args.suffix}{img_suffix}"
    if args.output is None:
        return src.with_name(name)
    out = Path(args.output)
    if single and names_a_file(args.output):
        return out
    return out / name


def output_clash(inputs: list[Path], args: argparse.Namespace) -> str | None:
    """Why the inputs' outputs would overwrite one another (checked before any work), or None.

    Outputs are compared without their suffix (the format is only known once an image is read), so two inputs
    that would write ``out/a_x4.*`` are refused whatever their formats.
    """
    if len(inputs) > 1 and names_a_file(args.output):
        return f"-o {args.output} names one file, but {len(inputs)} inputs were given: give a folder"
    from nala_gen.fileio import real_path

    seen: dict[Path, Path] = {}
    for src in inputs:
        stem = real_path(output_path(src, args, len(inputs) == 1, ""))
        if stem in seen:
            return f"{seen[stem]} and {src} would both write {stem}.*: rename one or upscale them separately"
        seen[stem] = src
    return None


def output_suffix(src: Path, ext: str, img) -> str:
    """``auto`` keeps the input's format unless it cannot hold the result (JPEG with alpha or 16-bit)."""
    from .upscale.imageio import has_alpha

    if ext != "auto":
        return f".{ext}"
    suffix = src.suffix.lower()
    lossy_only = suffix in (".jpg", ".jpeg") and (img.dtype.itemsize > 1 or has_alpha(img))
    return ".png" if lossy_only or suffix not in (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff") else suffix


def _batch(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        batch = int(text)
    except ValueError:
        batch = 0
    if batch < 1:
        raise argparse.ArgumentTypeError("batch must be 'auto' or a whole number of at least 1")
    return batch


def upscale(argv: list[str]) -> int:
    from .jobs import MANIFEST_NAME, JobManifest

    parser = argparse.ArgumentParser(prog="nala-sr upscale", description="Upscale images with NaLaSR.")
    parser.add_argument("inputs", nargs="+", help="image files, folders or glob patterns")
    parser.add_argument("-o", "--output", help="output file (one input) or folder; default: beside each input")
    parser.add_argument("-s", "--scale", type=int, default=4, help="model scale (default 4)")
    parser.add_argument("-m", "--model", help="named weights (nala-sr models), a .safetensors/.json, or a .pth")
    parser.add_argument("--opt", help="BasicSR option file describing a .pth checkpoint's network")
    parser.add_argument(
        "--outscale", type=bounded(float, 0, 32, low_inclusive=False), help="final scale, e.g. 3.5 (up to 32)"
    )
    parser.add_argument(
        "-t", "--tile", type=tile_setting, default="auto", help="auto (memory budget), 0 (off) or pixels"
    )
    parser.add_argument(
        "--tile-pad", type=bounded(int, 0, 256), default=16, help="overlap between tiles, input pixels (blended)"
    )
    parser.add_argument(
        "--memory-budget-mb",
        type=bounded(float, 1),
        help="memory for the whole job: tiles, output, encoding (default: half of free)",
    )
    parser.add_argument(
        "--batch",
        type=_batch,
        default=1,
        help="passes per network call: tiles of one image, and images of one size (auto: as many as fit; default 1)",
    )
    parser.add_argument(
        "--io-threads",
        choices=["auto", "0", "1"],
        default="auto",
        help="1: decode the next image and encode the last one while the network runs; 0: one after another; "
        "auto (default): 1 on a GPU, 0 on the CPU, where the network already keeps every core busy",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="auto: fp32 on CPU, bf16 or fp16 on GPUs; bf16 on a CPU needs AVX512_BF16 or AMX (faster for "
        "convolution-only networks; NaLaSR and ESRT are faster at fp32 on AVX-512 CPUs: docs/upscaling.md)",
    )
    parser.add_argument("--alpha", default="model", choices=["model", "bicubic"], help="how alpha is upscaled")
    parser.add_argument("--suffix", help="added to output names (default _x<outscale>)")
    parser.add_argument("--ext", default="auto", choices=["auto", "png", "jpg", "webp"])
    parser.add_argument("--max-pixels", type=bounded(int, 4), default=50_000_000, help="refuse larger inputs (pixels)")
    parser.add_argument(
        "--skip-existing", action="store_true", help="skip images whose output exists (and whose record still fits)"
    )
    parser.add_argument(
        "--manifest", help=f"JSON-lines job record (default with --skip-existing and -o FOLDER: FOLDER/{MANIFEST_NAME})"
    )
    video = parser.add_argument_group("video (inputs ending in .mp4, .mkv, .mov, .webm, .avi, .m4v)")
    video.add_argument("--codec", default="libx264", help="video encoder: libx264 (default), libx265, libvpx-vp9, ...")
    video.add_argument("--crf", type=bounded(int, 0, 63), default=18, help="video quality, lower is better (18)")
    video.add_argument(
        "--chunk-seconds",
        type=bounded(float, 0, 3600, low_inclusive=False),
        default=4.0,
        help="video is encoded in chunks this long; a stopped job resumes from its last whole chunk",
    )
    parser.add_argument("--report", action="store_true", help="print a readout per image")
    parser.add_argument("--json", action="store_true", help="one JSON object per image on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    args.suffix = args.suffix if args.suffix is not None else f"_x{args.outscale or args.scale:g}"

    inputs = collect_inputs(args.inputs)
    if not inputs:
        print("nala-sr upscale: error: no images found in the given inputs", file=sys.stderr)
        return 1
    clash = output_clash(inputs, args)
    if clash:
        print(f"nala-sr upscale: error: {clash}", file=sys.stderr)
        return 1
    from nala_gen.fileio import check_writable, real_path

    # An output folder or file that cannot be written is refused before the model loads (one line, from main).
    if args.output is not None:
        check_writable(args.output, folder=not (len(inputs) == 1 and names_a_file(args.output)))
    if args.manifest:
        check_writable(args.manifest)

    from nala_gen.devices import pick_device
    from nala_gen.weights import WeightsError

    from .jobs.folder import FolderJob
    from .loading import load_sr_model
    from .upscale.engine import Upscaler, budget_bytes

    try:
        pick_device(args.device)  # a device this machine lacks is refused before the model loads
        model, info = load_sr_model(args.model, args.scale, args.opt)
        budget = budget_bytes(args.memory_budget_mb)
        engine = Upscaler(
            model, args.scale, args.device, args.precision, args.tile, args.tile_pad, args.alpha, budget, args.batch
        )
    except (WeightsError, ValueError, OSError) as err:
        print(f"nala-sr upscale: error: {error_line(err)}", file=sys.stderr)
        return 1

    manifest = None  # kept for resumable jobs: with --skip-existing (beside a -o folder) or --manifest
    if args.manifest:
        manifest = JobManifest(args.manifest)
    elif args.skip_existing and args.output and not names_a_file(args.output):
        manifest = JobManifest(Path(args.output) / MANIFEST_NAME)
    # What decides an output's pixels (the device does not, beyond rounding): a record with other values is redone.
    settings = {"model": info["name"], "model_sha256": info.get("sha256", info["source"]), "scale": args.scale}
    settings["outscale"] = args.outscale
    settings.update(tile=args.tile, tile_pad=args.tile_pad, alpha=args.alpha, precision=engine.precision)
    settings.update(memory_budget_mb=args.memory_budget_mb, ext=args.ext, suffix=args.suffix)
    resolved_inputs = {real_path(p) for p in inputs}
    # Under torchrun (or accelerate launch, srun) each rank takes every world-th input of the same sorted list,
    # so each output is written by exactly one rank and the outputs equal a one-process run's.
    rank, world, gathers = launcher_rank()
    total = len(inputs)
    inputs = inputs[rank::world]
    show_progress = not args.quiet and sys.stderr.isatty()
    single = len(inputs) == 1
    from nala_gen.fileio import VIDEO_SUFFIXES

    videos = [p for p in inputs if p.suffix.lower() in VIDEO_SUFFIXES]
    inputs = [p for p in inputs if p.suffix.lower() not in VIDEO_SUFFIXES]

    def skipped(item) -> None:
        if args.json:
            emit({"input": str(item.src), "output": str(item.dst), "status": "skipped"})

    def redone(item, why: str) -> None:
        print(f"nala-sr upscale: redoing {item.dst}: {why}", file=sys.stderr)

    def failed(src, reason: str) -> None:
        _report_error(args, src, reason)

    def done(item, readout) -> None:
        summary = (
            f"{readout.input_size[0]}x{readout.input_size[1]} -> "
            f"{readout.output_size[0]}x{readout.output_size[1]}, {readout.latency_s:.2f} s, "
            f"peak {readout.peak_mem_bytes / 2**20:.0f} MiB (process {readout.process_peak_bytes / 2**20:.0f} MiB, "
            f"estimate {readout.estimate_bytes / 2**20:.0f} MiB{', PNG streamed' if readout.streamed else ''}), "
            f"{readout.tokens:,} tokens/pass, {readout.tiles} tile(s), batch {readout.batch}, "
            f"{readout.device} {readout.precision}"
        )
        _report_done(args, item.src, item.dst, info["name"], readout, summary)

    job = FolderJob(
        engine,
        lambda src, img: output_path(src, args, single, output_suffix(src, args.ext, img)),
        outscale=args.outscale,
        io_threads=int(args.io_threads) if args.io_threads != "auto" else int(engine.device.type != "cpu"),
        manifest=manifest,
        settings=settings,
        skip_existing=args.skip_existing,
        protected=resolved_inputs,
        max_pixels=args.max_pixels,
        progress=show_progress,
        on_done=done,
        on_skip=skipped,
        on_redo=redone,
        on_error=failed,
    )
    failures = job.run(inputs)
    for src in videos:
        failures += _upscale_video(engine, src, output_path(src, args, single, src.suffix), args, settings)
    if world > 1 and gathers:
        failures = _gather_failures(failures, rank, world, total)
    return 1 if failures else 0


def _upscale_video(engine, src: Path, dst: Path, args: argparse.Namespace, settings: dict) -> int:
    """One video through the engine (nala_gen.sr.jobs.video); returns 1 when it failed (said in one line), else 0."""
    from .jobs.video import VideoError, upscale_video

    if args.skip_existing and dst.exists():  # a video output appears only when whole
        if args.json:
            emit({"input": str(src), "output": str(dst), "status": "skipped"})
        return 0
    show_progress = not args.quiet and sys.stderr.isatty()
    try:
        readout = upscale_video(
            engine,
            src,
            dst,
            args.outscale,
            codec=args.codec,
            crf=args.crf,
            chunk_seconds=args.chunk_seconds,
            settings=settings,
            progress=show_progress,
            max_pixels=args.max_pixels,
        )
    except (VideoError, ValueError, RuntimeError, OSError) as err:
        _report_error(args, src, (error_line(err) or str(err) or type(err).__name__).splitlines()[0])
        return 1
    summary = (
        f"{readout.frames} frames {readout.input_size[0]}x{readout.input_size[1]} -> "
        f"{readout.output_size[0]}x{readout.output_size[1]} at {readout.rate} fps, "
        f"{readout.frames_per_s:.2f} frames/s, {readout.chunks} chunk(s) ({readout.chunks_reused} reused), "
        f"audio: {', '.join(readout.audio) or 'none'}"
    )
    _report_done(args, src, dst, settings["model"], readout, summary)
    return 0


def _report_error(args: argparse.Namespace, src: Path, reason: str) -> None:
    """One failed input: a line on stderr (naming the input once), and a JSON record with --json."""
    line = reason if reason.startswith(f"{src}:") else f"{src}: {reason}"
    print(f"nala-sr upscale: error: {line}", file=sys.stderr)
    if args.json:
        emit({"input": str(src), "status": "error", "error": reason})


def _report_done(args: argparse.Namespace, src: Path, dst: Path, model: str, readout, summary: str) -> None:
    """One finished input: its JSON record (--json), its readout line (--report), or its output path."""
    if args.json:
        emit({"input": str(src), "output": str(dst), "status": "ok", "model": model, **readout.as_dict()})
    elif args.report:
        print(f"{src} -> {dst}: {summary}")
    elif not args.quiet:
        print(dst)


def emit(record: dict) -> None:
    """One JSON line on stdout in one write, so the lines of several processes sharing it never interleave."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def launcher_rank() -> tuple[int, int, bool]:
    """(rank, world size, whether the ranks can meet) from the launcher's environment: torchrun and accelerate
    set RANK and WORLD_SIZE (and a rendezvous address, so rank 0 can sum the failures); Slurm's srun sets
    SLURM_PROCID and SLURM_NTASKS (each rank then reports only its own images, unless MASTER_ADDR is set too)."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), True
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        meets = "MASTER_ADDR" in env and "MASTER_PORT" in env
        if meets:  # torch.distributed's env:// rendezvous reads these two
            env.setdefault("RANK", env["SLURM_PROCID"])
            env.setdefault("WORLD_SIZE", str(world))
        return int(env["SLURM_PROCID"]), world, meets
    return 0, 1, False


def _gather_failures(failures: int, rank: int, world: int, total: int) -> int:
    """Wait for every rank (torch.distributed, gloo), sum their failures; rank 0 prints the summary line."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        count = torch.tensor([failures])
        dist.all_reduce(count)
        if rank == 0:
            print(
                f"nala-sr upscale: {total - int(count)} of {total} images upscaled by {world} processes",
                file=sys.stderr,
            )
        return int(count)
    finally:
        dist.destroy_process_group()


def models(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="nala-sr models", description="List the named weights.").parse_args(argv)
    from nala_gen.weights import broken_cards, list_weights

    cards = list_weights("sr")
    for path, reason in broken_cards():
        print(f"warning: skipped a broken weight card {path}: {reason}", file=sys.stderr)
    if not cards:
        print("no named super-resolution weights installed (see weights/README.md)")
    for card in cards:
        trained = card.info.get("trained_on", "")
        iters = card.info.get("iterations")
        extra = f"; {iters} iterations on {trained}" if iters else ""
        print(f"{card.name:<20} x{card.scale}  {card.arch:<7} {card.payload}{extra}")
    return 0


def export(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nala-sr export", description="BasicSR checkpoint -> named weights.")
    parser.add_argument("checkpoint")
    parser.add_argument("--opt", required=True, help="the BasicSR option file it was trained with")
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", help="weights folder (default: the user's, searched by every command)")
    parser.add_argument("--info", default="{}", help="JSON object of training facts for the card")
    parser.add_argument(
        "--param-key", choices=["params", "params_ema"], help="which weights (default: params_ema when present)"
    )
    args = parser.parse_args(argv)
    from nala_gen.weights import user_weights_dir

    from .loading import export_checkpoint

    out = args.out or user_weights_dir()
    card = export_checkpoint(args.checkpoint, args.opt, args.name, out, json.loads(args.info), args.param_key)
    print(f"wrote {card} and {card.with_suffix('.safetensors')}")
    return 0


def export_onnx(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nala-sr export-onnx", description="Named weights -> ONNX (dynamic height and width), checked."
    )
    parser.add_argument("model", help="named weights (nala-sr models), a .safetensors/.json, or a .pth with --opt")
    parser.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    parser.add_argument("-s", "--scale", type=int, help="the model's scale (default: from its card)")
    parser.add_argument("--opt", help="BasicSR option file describing a .pth checkpoint's network")
    args = parser.parse_args(argv)
    from nala_gen.weights import WeightsError

    from .interop.onnx_export import CHECK_SIZES, export_onnx
    from .loading import load_sr_model

    try:
        model, info = load_sr_model(args.model, args.scale, args.opt)
    except WeightsError as err:
        print(f"nala-sr export-onnx: error: {err}", file=sys.stderr)
        return 1
    if info["arch"] != "NaLaSR":
        print(
            f"nala-sr export-onnx: error: {info['name']} is {info['arch']}; only NaLaSR exports (ESRT's split softmax "
            "has a size-dependent number of segments, which ONNX fixes at the traced size)",
            file=sys.stderr,
        )
        return 1
    error = export_onnx(model, args.output)
    sizes = ", ".join(f"{w}x{h}" for h, w in CHECK_SIZES)
    print(
        f"wrote {args.output} ({info['name']}, x{info['scale']}): onnxruntime matches PyTorch to {error:.1e} on {sizes}"
    )
    return 0


def evaluate(argv: list[str]) -> int:
    from .evaluate import main as run

    return run(argv)


COMMANDS = {
    "upscale": upscale,
    "models": models,
    "export": export,
    "export-onnx": export_onnx,
    "prepare": prepare,
    "evaluate": evaluate,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in (*COMMANDS, "train", "test"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]

    def run() -> int:
        if command in COMMANDS:
            return COMMANDS[command](rest)
        return _basicsr(command, rest)

    return run_command(f"nala-sr {command}", run)  # bad paths and values: one line


# Commands whose process may end without the interpreter's teardown (see cliargs.leave): they write through our
# own atomic writers only. Training and testing run BasicSR's loggers, which expect a normal exit.
QUICK_EXIT = ("upscale", "models", "evaluate")


def console() -> int:
    """The ``nala-sr`` entry point: :func:`main`, then a quick exit for the commands in QUICK_EXIT."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in QUICK_EXIT:
        leave(code)
    return code


if __name__ == "__main__":
    sys.exit(console())
