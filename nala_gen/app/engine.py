"""What the web app computes, without any UI: upscaling and generation through the library's own code paths.

Upscaling goes through :class:`nala_gen.sr.upscale.engine.Upscaler` and :func:`nala_gen.sr.loading.load_sr_model` (the
engine of ``nala-sr upscale``); generation through ``nala-gen sample``'s loader, scheduler switch and grid. Every
problem a user can cause raises :class:`UserError` with a one-line message the UI shows as it is.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import re
import shutil
import tempfile
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nala_gen.resources import sample_image, shipped_results

SAMPLE = sample_image()
TILE_MODES = ("auto", "off", "size")
SCHEDULER_LABELS = {  # key -> label; keys are the library's scheduler names (nala_gen.diffusion.loading)
    "ddim": "DDIM",
    "ddpm": "DDPM",
    "dpm": "DPM-Solver++",
    "euler": "Flow Euler",
    "heun": "Flow Heun",
}
UNCONDITIONAL = "(unconditional)"

log = logging.getLogger("nala_app")


class UserError(ValueError):
    """Something the user can fix; its message is one line, shown in the page as it is."""


@dataclass
class AppConfig:
    """Limits and sources of the app (``nala-app --help``)."""

    max_pixels: int = 4_000_000
    max_file_size: str = "20mb"
    max_video_seconds: float = 10.0  # the Upscale tab's video box takes short clips (every frame is a network pass)
    max_video_pixels: int = 320 * 240  # per frame
    pipelines: list[str] = field(default_factory=list)
    results_dir: Path = shipped_results()
    keep_outputs: int = 16


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def devices() -> list[str]:
    import torch

    found = ["auto", "cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return found


def precisions() -> list[str]:
    """What the precision menu offers on this machine: fp16 with a GPU; bf16 with a GPU or a CPU that computes it
    natively (emulated bf16 is slower than fp32)."""
    import torch

    from nala_gen.devices import cpu_native_bf16

    if torch.cuda.is_available():
        return ["auto", "fp32", "bf16", "fp16"]
    return ["auto", "fp32", "bf16"] if cpu_native_bf16() else ["auto", "fp32"]


def to_display(img: np.ndarray) -> np.ndarray:
    """Any image the engine returns -> 8-bit for the page (16-bit is kept in the downloadable PNG)."""
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    return img


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def readout_markdown(title: str, rows: list[tuple[str, str]]) -> str:
    lines = [f"| {title} | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in rows]
    return "\n".join(lines)


class Engine:
    """Model caches and the two jobs. Calls are serialised by a lock (the UI also queues them one at a time)."""

    def __init__(self, config: AppConfig | None = None) -> None:
        self.config = config or AppConfig()
        self.lock = threading.Lock()
        self._sr: OrderedDict[str, tuple] = OrderedDict()
        self._pipes: OrderedDict[str, tuple] = OrderedDict()
        self._outdir = Path(tempfile.mkdtemp(prefix="nala-app-"))
        atexit.register(shutil.rmtree, self._outdir, ignore_errors=True)
        self._outputs: deque[Path] = deque()
        self._counter = itertools.count()

    # ------------------------------------------------------------------------------------------------ listings
    def sr_models(self) -> list[tuple[str, int, str]]:
        """(name, scale, label) of every installed super-resolution weight."""
        from nala_gen.weights import list_weights

        cards = list_weights("sr")
        return [(c.name, c.scale or 4, f"{c.name} · x{c.scale or 4}") for c in cards]

    def sr_arch(self, name: str | None) -> str | None:
        """The architecture of an installed super-resolution weight (``NaLaSR``, ``ESRT``), None if unknown."""
        from nala_gen.weights import WeightsError, resolve

        try:
            return resolve(name).arch if name else None
        except WeightsError:
            return None

    def diffusion_models(self) -> list[tuple[str, str]]:
        """(spec, label) of every named diffusion pipeline plus the folders given with ``--pipeline``."""
        from nala_gen.attention.modules import with_kernel_keys
        from nala_gen.weights import list_weights

        # NaLa models first (the tab opens on the first one; a softmax twin is there to compare against), otherwise in
        # the search order of the weight folders (a stable sort).
        def softmax(card) -> bool:
            return with_kernel_keys(card.config).get("kernel") == "softmax"

        cards = sorted(list_weights("diffusion"), key=softmax)
        found = [(c.name, f"{c.name} · {c.arch}" + (" · softmax baseline" if softmax(c) else "")) for c in cards]
        found += [(p, f"{Path(p).name}  (folder)") for p in self.config.pipelines]
        return found

    # ------------------------------------------------------------------------------------------------- outputs
    def _output_path(self, name: str) -> Path:
        """A fresh file name under the app's temporary folder; only the last few outputs are kept."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "output.png"
        folder = self._outdir / f"{next(self._counter):06d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / safe
        self._outputs.append(path)
        while len(self._outputs) > self.config.keep_outputs:
            old = self._outputs.popleft()
            old.unlink(missing_ok=True)
            if old.parent.is_dir() and not any(old.parent.iterdir()):
                old.parent.rmdir()
        return path

    # ---------------------------------------------------------------------------------------------- upscaling
    def _sr_model(self, name: str):
        from nala_gen.sr.loading import load_sr_model
        from nala_gen.weights import WeightsError

        known = {n: s for n, s, _ in self.sr_models()}
        if name not in known:
            listed = ", ".join(known) or "none installed: run `make weights-sr` or set NALA_GEN_WEIGHTS"
            raise UserError(f"unknown super-resolution model {name!r} (installed: {listed})")
        if name not in self._sr:
            try:
                self._sr[name] = load_sr_model(name, known[name])
            except WeightsError as err:
                raise UserError(one_line(err)) from None
            while len(self._sr) > 2:
                self._sr.popitem(last=False)
        self._sr.move_to_end(name)
        return self._sr[name]

    def read_input(self, path: str | Path | None) -> np.ndarray:
        """The uploaded image, with the pixel limit; messages name the upload, not the server's temp path."""
        from nala_gen.sr.upscale.imageio import ImageError, read_image

        if not path:
            raise UserError("no image: upload one (or click the example below the upload box)")
        try:
            return read_image(path, max_pixels=self.config.max_pixels)
        except ImageError as err:
            message = one_line(err).replace(str(path), f"the upload ({Path(path).name})")
            raise UserError(message) from None

    def upscale(
        self,
        path: str | Path | None,
        model: str | None,
        tile_mode: str = "auto",
        tile_size: int = 256,
        device: str = "auto",
        precision: str = "auto",
        outscale: float | None = None,
        alpha: str = "model",
        scale: int | None = None,
        tqdm_progress: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, dict, Path]:
        """Upscale one image file.

        Returns:
            (input as read, result at the output size, readout dict, path of the result as PNG)
        """
        from nala_gen.sr.upscale.engine import Upscaler
        from nala_gen.sr.upscale.imageio import write_image_atomic

        if not model:
            installed = ", ".join(f"{n} (x{s})" for n, s, _ in self.sr_models())
            if installed:
                raise UserError(f"no model chosen{f' for x{scale}' if scale else ''}; installed: {installed}")
            raise UserError("no super-resolution model installed: run `make weights-sr` or set NALA_GEN_WEIGHTS")
        if tile_mode not in TILE_MODES:
            raise UserError(f"tile mode must be one of {', '.join(TILE_MODES)}, got {tile_mode!r}")
        tile: int | str = "auto" if tile_mode == "auto" else 0 if tile_mode == "off" else int(tile_size or 0)
        if tile_mode == "size" and tile < 32:
            raise UserError(f"tile size must be at least 32 pixels, got {tile_size}")
        if outscale is not None and not (0 < outscale <= 16):
            raise UserError(f"final scale must be in (0, 16], got {outscale:g}")
        img = self.read_input(path)
        with self.lock:
            net, info = self._sr_model(model)
            if scale and scale != info["scale"]:
                raise UserError(f"{info['name']} upscales x{info['scale']}, not x{scale}; pick an x{scale} model")
            try:
                upscaler = Upscaler(net, info["scale"], device=device, precision=precision, tile=tile, alpha=alpha)
                result, readout = upscaler.upscale(img, outscale=outscale or None, progress=tqdm_progress)
            except ValueError as err:  # bad device / precision / image layout
                raise UserError(one_line(err)) from None
            except (MemoryError, RuntimeError) as err:
                if isinstance(err, MemoryError) or "out of memory" in str(err).lower():
                    raise UserError("out of memory: use tile mode 'auto' or a smaller tile size") from None
                raise
        stem = Path(path).stem
        out = write_image_atomic(result, self._output_path(f"{stem}_{info['name']}_x{outscale or info['scale']:g}.png"))
        record = {"model": info["name"], "arch": info.get("arch"), "scale": info["scale"], **readout.as_dict()}
        record["tile_mode"] = tile_mode
        return img, result, record, out

    def upscale_video(
        self, path: str | Path | None, model: str | None, device: str = "auto", tqdm_progress: bool = False
    ) -> tuple[dict, Path]:
        """Upscale a short video file (the engine's tiles auto, H.264 at CRF 18, audio kept).

        Returns (readout dict, path of the result as MP4).
        """
        from nala_gen.sr.jobs.video import VideoError, probe, upscale_video
        from nala_gen.sr.upscale.engine import Upscaler

        if not path:
            raise UserError("no video: upload one")
        if not model:
            raise UserError("no model chosen")
        name = Path(path).name
        try:
            info = probe(path)
        except VideoError as err:
            raise UserError(one_line(err).replace(str(path), f"the upload ({name})")) from None
        seconds = info.frames / float(info.rate) if info.frames else None
        if seconds is None or seconds > self.config.max_video_seconds:
            limit = self.config.max_video_seconds
            raise UserError(f"videos here are limited to {limit:g} s; use `nala-sr upscale` for longer ones")
        if info.width * info.height > self.config.max_video_pixels:
            raise UserError(
                f"frames of {info.width}x{info.height} are over the limit of {self.config.max_video_pixels:,} pixels"
            )
        with self.lock:
            net, card = self._sr_model(model)
            out = self._output_path(f"{Path(path).stem}_{card['name']}_x{card['scale']}.mp4")
            try:
                readout = upscale_video(Upscaler(net, card["scale"], device=device), path, out, progress=tqdm_progress)
            except (VideoError, ValueError) as err:
                raise UserError(one_line(err).replace(str(path), f"the upload ({name})")) from None
        return {"model": card["name"], "scale": card["scale"], **readout.as_dict()}, out

    @staticmethod
    def video_markdown(record: dict) -> str:
        (w, h), (ow, oh) = record["input_size"], record["output_size"]
        return readout_markdown(
            f"Video upscaled with {record['model']} (x{record['scale']})",
            [
                ("Frames", f"{record['frames']} at {record['rate']} fps"),
                ("Throughput", f"{record['frames_per_s']:.2f} frames/s ({record['compute_s']:.1f} s)"),
                ("Input → output", f"{w}×{h} → {ow}×{oh}"),
                ("Audio", ", ".join(record["audio"]) or "none"),
            ],
        )

    @staticmethod
    def upscale_markdown(record: dict) -> str:
        (w, h), (ow, oh) = record["input_size"], record["output_size"]
        tiles = "whole image, untiled" if record["tiles"] == 1 else f"{record['tiles']} of {record['tile_size']} px"
        return readout_markdown(
            f"Upscaled with {record['model']} (x{record['scale']})",
            [
                ("Latency", f"{record['latency_s']:.3f} s"),
                ("Peak memory", f"{fmt_bytes(record['peak_mem_bytes'])} above the start"),
                ("Attention tokens per pass", f"{record['tokens']:,}"),
                ("Tiles", tiles),
                ("Input → output", f"{w}×{h} → {ow}×{oh}"),
                ("Throughput", f"{record['megapixels_per_s']:.3f} MP/s"),
                ("Device, precision", f"{record['device']}, {record['precision']}"),
            ],
        )

    # --------------------------------------------------------------------------------------------- generation
    def pipeline(self, spec: str):
        """(pipeline, display name), loaded once (sha256 checked) and cached."""
        from nala_gen.diffusion.loading import load_pipeline
        from nala_gen.weights import WeightsError

        if not spec:
            raise UserError("no diffusion model installed: train and export one (nala-gen), or pass --pipeline")
        known = [s for s, _ in self.diffusion_models()]
        if spec not in known:
            raise UserError(f"unknown diffusion model {spec!r} (installed: {', '.join(known) or 'none'})")
        if spec not in self._pipes:
            try:
                pipe, name = load_pipeline(spec)
            except (WeightsError, OSError, ValueError) as err:
                raise UserError(one_line(err)) from None
            self._pipes[spec] = (pipe, name, pipe.scheduler)
            while len(self._pipes) > 2:
                self._pipes.popitem(last=False)
        self._pipes.move_to_end(spec)
        return self._pipes[spec]

    def pipeline_options(self, spec: str) -> dict:
        """Class choices, scheduler choices and the saved scheduler of a pipeline, for the form."""
        from nala_gen.diffusion.loading import scheduler_key, scheduler_names

        with self.lock:
            pipe, _, saved = self.pipeline(spec)
        classes = [(name, str(i)) for i, name in sorted(pipe.id2label.items())]
        num_classes = pipe.transformer.config.num_classes
        if not classes:
            classes = [(str(i), str(i)) for i in range(num_classes)]
        classes.append((UNCONDITIONAL, str(num_classes)))
        flow = pipe.is_flow
        keys = scheduler_names(pipe)
        saved_key = scheduler_key(saved)
        return {
            "classes": classes,
            "schedulers": [(SCHEDULER_LABELS[k], k) for k in keys],
            "scheduler": saved_key if saved_key in keys else keys[0],
            "mode": "SiT (flow matching)" if flow else "DiT (epsilon)",
            "sample_size": pipe.transformer.config.sample_size * pipe.vae_scale_factor,
        }

    def generate(
        self,
        spec: str | None,
        class_id: str | int | None,
        steps: int = 25,
        guidance: float = 1.0,
        scheduler: str | None = None,
        seed: int = 0,
        num_images: int = 4,
        device: str = "auto",
    ):
        """Sample ``num_images`` images of one class.

        Returns:
            (grid PIL image enlarged for display, readout dict, path of the native-size grid PNG)
        """
        import torch
        from PIL import Image

        from nala_gen.devices import pick_device
        from nala_gen.diffusion.images import make_grid, save_atomic
        from nala_gen.diffusion.loading import new_scheduler

        steps, num_images, seed = int(steps or 0), int(num_images or 0), int(seed or 0)
        if not 1 <= steps <= 1000:
            raise UserError(f"steps must be between 1 and 1000, got {steps}")
        if not 1 <= num_images <= 64:
            raise UserError(f"number of images must be between 1 and 64, got {num_images}")
        if guidance is None or not 0 <= guidance <= 50:
            raise UserError(f"guidance must be between 0 and 50, got {guidance}")
        with self.lock:
            pipe, name, saved = self.pipeline(spec)
            try:
                label = int(class_id) if str(class_id).strip().lstrip("-").isdigit() else class_id
                ids = pipe.get_label_ids(label if label is not None else 0)
                # Under the lock, every request sets its own: the saved scheduler, or a new one built from its config.
                pipe.scheduler = new_scheduler(pipe, scheduler, saved) if scheduler else saved
                used = type(pipe.scheduler).__name__
                pipe.to(pick_device(device))
                pipe.set_progress_bar_config(desc="denoising", leave=False)
                images = pipe(
                    ids * num_images,
                    num_inference_steps=steps,
                    guidance_scale=float(guidance),
                    generator=torch.Generator().manual_seed(seed),
                    output_type="pil",
                ).images
            except ValueError as err:
                raise UserError(one_line(err)) from None
            readout = dict(pipe.last_readout)
            class_name = pipe.id2label.get(
                ids[0], UNCONDITIONAL if ids[0] == pipe.transformer.config.num_classes else ""
            )
        cols = math.ceil(math.sqrt(num_images))
        rows = math.ceil(num_images / cols)
        grid = make_grid(images, rows, cols)
        out = save_atomic(grid, self._output_path(f"{Path(name).name}_{class_name or ids[0]}_seed{seed}.png"))
        zoom = max(1, min(16, 384 // max(grid.size)))
        shown = grid.resize((grid.width * zoom, grid.height * zoom), Image.Resampling.NEAREST) if zoom > 1 else grid
        record = {
            "model": name,
            "class_id": ids[0],
            "class_name": class_name,
            "num_images": num_images,
            "scheduler": used,
            "guidance": float(guidance),
            "seed": seed,
            "image_size": [images[0].height, images[0].width],
            "grid_size": [grid.height, grid.width],
            **readout,
        }
        return shown, record, out

    @staticmethod
    def generate_markdown(record: dict) -> str:
        h, w = record["image_size"]
        return readout_markdown(
            f"{record['num_images']} × {record['class_name'] or record['class_id']} from {record['model']}",
            [
                ("Latency", f"{record['latency_s']:.3f} s ({record['model_evals']} model evaluations)"),
                ("Peak memory", f"{fmt_bytes(record['peak_mem_bytes'])} above the start"),
                ("Attention tokens per image", f"{record['tokens']:,} ({w}×{h} px)"),
                ("Scheduler, steps", f"{record['scheduler']}, {record['steps']}"),
                ("Guidance, batch", f"{record['guidance']:g}, {record['batch']}"),
                ("Mode, attention", f"{record['mode']}, {record['kernel']}"),
                ("Device, seed", f"{record['device']}, {record['seed']}"),
            ],
        )
