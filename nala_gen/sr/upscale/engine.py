"""The upscaling engine shared by ``nala-sr upscale`` and the app.

What it does that the usual scripts do not:

* overlapping tiles blended with linear feathers (weights sum to one), so tile borders leave no seams;
* a memory budget for the whole job, not just the network pass: the tiles run a row at a time and the output
  is made top to bottom, one band of rows at a time (blending, alpha, ``outscale`` resize and 8/16-bit
  rounding per band), so no image-sized float canvas ever exists; a PNG is written from those bands as they
  come, and any other output holds only its final pixels. The tile size is the largest whose job fits the
  budget, from probes of the network at three small sizes (``tile="auto"``), the whole image in one pass when
  it fits; a job that cannot fit is refused before any work, with the estimate;
* alpha kept, upscaled by the model or by bicubic (``alpha="model" | "bicubic"``), grayscale kept as
  grayscale, 16-bit kept as 16-bit;
* any output scale (``outscale``): the model's scale, then Lanczos (or area when shrinking);
* fp32 on CPU by default, bf16/fp16 autocast on GPUs; bf16 autocast on a CPU that computes it natively
  (AVX512_BF16 or AMX: the convolutions run about twice as fast; refused elsewhere, where it is emulated), fp16
  on CPU refused (there are no half kernels there);
* channels-last convolutions (the bulk of an SR network's time);
* batched passes (``batch=N | "auto"``): tiles of one size in a row of tiles, and whole images of one size
  (:meth:`Upscaler.upscale_group`), go through the network together, within the same memory budget; the tile
  chosen is the one an unbatched job would choose, so only the convolutions' summation order differs;
* a readout: latency, peak memory of the job and of the process, the estimate, attention tokens per pass, tiles.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from nala_gen.devices import cpu_model, cpu_native_bf16, pick_device
from nala_gen.profiling import PeakMemory, return_large_frees_promptly, reused_large_temporaries

from . import probe_cache
from .imageio import has_alpha, write_image_atomic, write_png_rows
from .resample import RowResizer, resize_rows

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ALPHA_MODES = ("model", "bicubic")
MIN_TILE = 32
# Input sides probed for tile="auto"; 128 is where quadratic attention shows. Not below 64: a 48 px probe of ESRT
# read up to +70 MiB high in one run of three (about double its cost), which made its quadratic curve look linear
# and let a 130 px tile take 1.18 GiB of a 1 GiB budget; eight 64 px readings spread over 91-99 MiB.
PROBE_SIDES = (64, 96, 128)
SUPERLINEAR = 1.25  # growth of the cost per token between the two largest probes that reads as quadratic
MAX_AUTO_BATCH = 8  # batch="auto" tries up to this many passes at once
CHUNK_ROWS = 64  # output rows finished per step: bounds the per-band temporaries
ENCODER_COPIES = 2  # an in-memory encode holds the pixels again (channel order) plus the encoded bytes
# The probed cost of a pass belongs to a network on a device at a precision, not to one Upscaler: measured once per
# network (the app builds an Upscaler per request around its cached networks); the budget is read at each call.
_PROBED: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()
_JOBS_RUN = False  # whether this process has run a job (then its probe readings are not kept for others)


class MemoryBudgetError(ValueError):
    """A job whose estimated memory exceeds the budget at every tile size (raised before any work)."""


@dataclass
class JobPlan:
    """How one upscale will run and what it will hold, in bytes (``pass_bytes`` is 0 for a fixed tile: the
    network is probed only for ``tile="auto"``)."""

    tile: int  # input pixels per tile side; 0 = the whole image in one pass
    streamed: bool  # PNG rows written as they are made: no output image in memory
    input_bytes: int  # the decoded input, held for the whole job
    pass_bytes: int  # one network pass (activations of a tile), predicted from the probes
    band_bytes: int  # the blending band (one row of tiles at the model's scale), resize window, temporaries
    output_bytes: int  # the output image, and the encoder's copies of it, when not streamed
    budget: int
    batch: int = 1  # passes run as one network call (tiles of a row; see Upscaler.plan_group for images)

    @property
    def total_bytes(self) -> int:
        return self.input_bytes + self.pass_bytes + self.band_bytes + self.output_bytes

    def describe(self) -> str:
        parts = {"input": self.input_bytes, "network pass": self.pass_bytes, "bands": self.band_bytes}
        parts["output in memory"] = self.output_bytes
        listed = ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in parts.items() if v)
        return f"about {self.total_bytes / 2**20:,.0f} MiB ({listed})"


@dataclass
class Readout:
    """What one upscale cost. ``tokens`` is the LR pixels of the largest pass (the attention's N).

    ``peak_mem_bytes`` is the job's memory above the level at its start; ``process_peak_bytes`` the process's own
    high-water mark during the job (host RSS, model and libraries included); ``estimate_bytes`` the plan's
    estimate of the job, input included."""

    latency_s: float
    peak_mem_bytes: int
    tokens: int
    tiles: int
    tile_size: int
    input_size: tuple[int, int]
    output_size: tuple[int, int]
    device: str
    precision: str
    process_peak_bytes: int = 0
    estimate_bytes: int = 0
    streamed: bool = False
    batch: int = 1  # passes per network call; for a group of images, its latency is its share of the group's

    @property
    def megapixels_per_s(self) -> float:
        return self.output_size[0] * self.output_size[1] / 1e6 / max(self.latency_s, 1e-9)

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "peak_mem_mib": round(self.peak_mem_bytes / 2**20, 1),
            "process_peak_mib": round(self.process_peak_bytes / 2**20, 1),
            "estimate_mib": round(self.estimate_bytes / 2**20, 1),
            "megapixels_per_s": round(self.megapixels_per_s, 4),
        }


def pick_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose auto, fp32, bf16 or fp16")
    if precision == "fp16" and device.type == "cpu":
        raise ValueError("fp16 is not supported on CPU (no half-precision kernels); use fp32")
    if precision == "bf16" and device.type == "cpu" and not cpu_native_bf16():
        raise ValueError(
            f"bf16 needs a CPU with AVX512_BF16 or AMX, which this one ({cpu_model()}) lacks (it would be emulated, "
            "slower than fp32); use fp32"
        )
    return precision


def budget_bytes(megabytes: float | None) -> int | None:
    """A memory budget given in MiB (an option or a ``--memory-budget-mb``) in bytes; None (unset) stays None."""
    return int(float(megabytes) * 2**20) if megabytes else None


def available_memory(device: torch.device) -> int:
    """Bytes free for one upscale: most of the GPU's free memory, or half of the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.7)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 // 2
    except (OSError, KeyError):
        return 4 * 2**30


def _quadratic(tokens: list[int], peaks: list[int]) -> tuple[float, float, float] | None:
    """(a, b, c) of a + b·n + c·n² when the probes read as quadratic (the cost per token grows by more than
    SUPERLINEAR between the two largest), else None. Three probes: a least-squares fit; two: a + c·n² through
    both (steeper than the true curve where b > 0, so the prediction errs high)."""
    t, m = np.asarray(tokens, dtype=np.float64), np.asarray(peaks, dtype=np.float64)
    if len(m) < 2 or m[-1] / t[-1] <= SUPERLINEAR * m[-2] / t[-2]:
        return None
    if len(m) == 3:
        c, b, a = np.polyfit(t, m, 2)
        return (a, b, c) if c > 0 else None
    c = (m[1] - m[0]) / (t[1] ** 2 - t[0] ** 2)
    return m[0] - c * t[0] ** 2, 0.0, c


def predicted_peak(n: int, tokens: list[int], peaks: list[int]) -> float:
    """Predicted peak bytes of a pass over ``n`` tokens from measured (tokens, peak) pairs (see tokens_within)."""
    quadratic = _quadratic(tokens, peaks)
    if quadratic:
        a, b, c = quadratic
        return a + b * n + c * n * n
    # Linear: the larger cost per token of the two largest probes (small RSS probes are noisy; a prediction that
    # errs is better high than low).
    return max(p / t for p, t in zip(peaks[-2:], tokens[-2:])) * n


def tokens_within(budget: int, tokens: list[int], peaks: list[int]) -> int:
    """Largest token count whose predicted peak memory fits ``budget``, from measured (tokens, peak) pairs.

    A pass costs a + b·n + c·n² bytes for n tokens: convolutions and linear attention are linear in n, softmax
    attention (ESRT's split softmax) quadratic. When the cost per token clearly grows between the two largest
    probes (ESRT: x1.7 from 96 to 128 px), fit that quadratic through the probes and solve it (a power law
    through small probes misses the quadratic term, which dominates only at larger n). Otherwise take the cost
    per token at the largest probe as constant: an upper bound on b when a >= 0, and steady where a quadratic
    fit would chase the noise of small RSS probes (+-20 MiB here; NaLaSR: x0.8-1.05 per token).
    """
    smallest = MIN_TILE * MIN_TILE
    if peaks[0] >= budget:
        return smallest
    quadratic = _quadratic(tokens, peaks)
    if quadratic:
        a, b, c = quadratic
        return max(smallest, int((-b + math.sqrt(b * b + 4 * c * (budget - a))) / (2 * c)))
    return max(smallest, int(budget / (peaks[-1] / tokens[-1])))


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Window starts every ``tile - overlap`` pixels; the last window is flush with the end."""
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, tile - overlap))
    return [*starts, length - tile]


def feather(length: int, start: int, stop: int, total: int, overlap: int) -> np.ndarray:
    """1-D blending weights (float32) of a window [start, stop) of ``total`` pixels.

    On a side that borders another window (``overlap`` pixels shared), the outer quarter of the overlap gets
    almost no weight (those pixels saw the least context), the next half ramps linearly up to 1, so two
    neighbours cross-fade over the middle of their overlap with weights summing to one.
    """
    w = np.ones(length, np.float32)
    margin, ramp = overlap // 4, overlap // 2
    if ramp > 0 and 2 * (margin + ramp) <= length:
        edge = np.concatenate((np.full(margin, 1e-3), (np.arange(ramp) + 0.5) / ramp)).astype(np.float32)
        if start > 0:
            w[: margin + ramp] = edge
        if stop < total:
            w[length - margin - ramp :] = edge[::-1]
    return w


@dataclass
class _Axis:
    """The windows along one side: starts and stops in input pixels, their feathers and the feathers' sum, both
    at the model's scale. A 2-D window's weights are the outer product of its two feathers, so the sum over all
    windows is the outer product of the two sums: no image-sized weight canvas is needed."""

    starts: list[int]
    stops: list[int]
    feathers: list[np.ndarray]
    total: np.ndarray

    @classmethod
    def of(cls, length: int, tile: int, overlap: int, scale: int) -> _Axis:
        starts = tile_starts(length, tile, overlap)
        stops = [min(a + tile, length) for a in starts]
        feathers = [feather((b - a) * scale, a, b, length, overlap * scale) for a, b in zip(starts, stops)]
        total = np.zeros(length * scale, np.float32)
        for a, f in zip(starts, feathers):
            total[a * scale : a * scale + len(f)] += f
        return cls(starts, stops, feathers, total)


class Upscaler:
    """Upscale images with a super-resolution network.

    Args:
        model: maps (B, 3, h, w) in [0, 1] to (B, 3, h * scale, w * scale).
        scale: the model's scale.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:1``...
        precision: ``auto`` (fp32 on CPU, bf16 or fp16 on GPUs), ``fp32``, ``bf16``, ``fp16``.
        tile: ``auto`` (from the memory budget), 0 (whole image), or a tile side in input pixels.
        tile_pad: overlap between neighbouring tiles on each side, in input pixels (blended).
        alpha: ``model`` or ``bicubic``: how an alpha channel is upscaled.
        memory_budget: bytes for the whole job (default: see :func:`available_memory`). On a GPU it bounds the
            network pass, and the host's part of the job is checked against the host's available memory.
        batch: passes per network call: 1, N, or ``auto`` (the most, up to MAX_AUTO_BATCH, that keep the job
            within the budget); a batch never changes the tile a job uses.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        scale: int,
        device: str = "auto",
        precision: str = "auto",
        tile: int | str = "auto",
        tile_pad: int = 16,
        alpha: str = "model",
        memory_budget: int | None = None,
        batch: int | str = 1,
    ) -> None:
        if alpha not in ALPHA_MODES:
            raise ValueError(f"unknown alpha mode {alpha!r}; choose {' or '.join(ALPHA_MODES)}")
        if tile != "auto" and (not isinstance(tile, int) or tile < 0 or 0 < tile < MIN_TILE):
            raise ValueError(f"tile must be 'auto', 0 or at least {MIN_TILE}, got {tile!r}")
        if batch != "auto" and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1):
            raise ValueError(f"batch must be 'auto' or a whole number of at least 1, got {batch!r}")
        self.device = pick_device(device)
        self.precision = pick_precision(precision, self.device)
        # Channels-last (NHWC) lets oneDNN and cuDNN run the convolutions, which dominate SR, without layout
        # conversions: 15-30 % faster on this CPU at 48-250 px inputs, same output to 2e-6.
        self.network = model.to(self.device, memory_format=torch.channels_last).eval()
        # NaLaSR and ESRT build their fast inference form on first use: here, where no job's latency or memory
        # reading counts it
        build_form = getattr(self.network, "inference_form", None)
        if build_form is not None:
            build_form()
        self.size_multiple = size_multiple(self.network)
        self.scale = scale
        self.tile = tile
        self.tile_pad = tile_pad
        self.alpha = alpha
        self.memory_budget = memory_budget
        self.batch = batch

    # -- memory model -------------------------------------------------------------------------------------------
    def _probe(self, side: int) -> int:
        x = torch.rand(1, 3, side, side, device=self.device)
        with PeakMemory(self.device) as memory:
            self._forward(x)
        return max(memory.peak_bytes, 1)

    def _probes(self, budget: int) -> tuple[list[int], list[int]]:
        """(tokens, peak bytes) of passes at PROBE_SIDES, measured once per network, device and precision, and kept
        across processes (:mod:`nala_gen.sr.upscale.probe_cache`). A side whose pass could overrun the budget (twice the
        cost per token so far) is not probed, so probing keeps within small budgets too; a later, larger budget
        probes the rest."""
        sides, peaks = _PROBED.setdefault(self.network, {}).setdefault((str(self.device), self.precision), ([], []))
        if len(sides) == len(PROBE_SIDES):
            return [side * side for side in sides], list(peaks)
        key = None
        try:
            if probe_cache.cache_path() is not None:  # no key (repr, code digest) to make when the cache is off
                key = probe_cache.network_key(self.network, self.device, self.precision, PROBE_SIDES)
        except Exception:  # noqa: BLE001  (a cache must never cost a job: probe as without it)
            key = None
        if not sides:
            stored = probe_cache.load(key, len(PROBE_SIDES)) if key else None
            if stored:  # measured by an earlier process for a network of this structure, here
                sides.extend(PROBE_SIDES)
                peaks.extend(stored)
                return [side * side for side in sides], list(peaks)
            self._probe(32)  # warm-up: thread pools and allocator arenas are not the model's memory
        for side in PROBE_SIDES[len(sides) :]:
            if peaks and 2 * peaks[-1] / sides[-1] ** 2 * side * side > budget:
                break
            peaks.append(self._probe(side))
            sides.append(side)
        # Only a full set (a budget-cut one would cut later jobs short), and only from a process that has not run
        # a job yet: later, its allocator holds freed memory and the probes read low for a fresh process.
        if key and len(sides) == len(PROBE_SIDES) and not _JOBS_RUN:
            probe_cache.store(key, list(peaks))
        return [side * side for side in sides], list(peaks)

    @property
    def max_batch(self) -> int:
        """The most passes (tiles or images) one network call may take: 1, ``batch``, or MAX_AUTO_BATCH for auto."""
        return MAX_AUTO_BATCH if self.batch == "auto" else self.batch

    def budget(self) -> int:
        """The job's memory budget in bytes: ``memory_budget``, else what the device has available now."""
        return self.memory_budget or available_memory(self.device)

    def max_tokens(self) -> int:
        """Largest input (in pixels) whose pass alone fits the budget, from the probes (see tokens_within)."""
        budget = self.budget()
        return tokens_within(budget, *self._probes(budget))

    def plan(
        self,
        height: int,
        width: int,
        channels: int = 3,
        itemsize: int = 1,
        outscale: float | None = None,
        can_stream: bool = False,
        output_copies: int = 1,
        images: int = 1,
    ) -> JobPlan:
        """Choose the tile (and streaming) for an input so that the whole job fits the budget.

        ``output_copies`` counts the output image and what the encoder holds besides (1 when the caller takes
        the array; 1 + ENCODER_COPIES when it is encoded in memory); ``can_stream`` allows writing PNG rows as
        they come instead. The largest tile that fits wins (fewest seams and passes), keeping the output in
        memory when it fits (a smaller, faster PNG; any format); then the batch of tiles, as large as
        ``batch`` allows and the budget keeps. ``images`` > 1 plans that many images of this size held and run
        whole as one batch (no tiles, not streamed; see :meth:`plan_group`). Raises :class:`MemoryBudgetError`
        with the estimate when nothing fits.
        """
        budget = self.budget()
        host_budget = budget if self.device.type == "cpu" else available_memory(torch.device("cpu"))
        s = self.scale
        target_w, target_h = output_size(width, height, s, outscale)
        out_channels = channels
        planes = 3 + (1 if channels in (2, 4) and self.alpha == "model" else 0)
        resize_taps = 0 if (target_w, target_h) == (width * s, height * s) else 8 + math.ceil(height * s / target_h)

        def job(tile: int, streamed: bool, batch: int = 1) -> JobPlan:
            rows = min(tile or height, height) * s
            side_h, side_w = min(tile or height, height), min(tile or width, width)
            band = rows * width * s * planes * 4  # the blending band
            band += 3 * CHUNK_ROWS * width * s * max(planes, out_channels) * 4  # a finished chunk and its forms
            band += batch * 2 * (side_h * s) * (side_w * s) * 4 * 2  # a batch of tile results, weights
            if resize_taps:  # the resize window: source rows resized across, and output rows being made
                band += (resize_taps + 3 * CHUNK_ROWS) * target_w * out_channels * 4
            if self.tile == "auto" or batch > 1 or images > 1:
                # Convolutions and linear attention cost memory per token, so a batch of b passes of n tokens is
                # predicted as one pass of b * n (for softmax attention that overestimates: safe).
                pass_bytes = int(predicted_peak(images * batch * side_h * side_w, *self._probes(budget)))
            else:
                pass_bytes = 0
            output = 0 if streamed else target_w * target_h * out_channels * itemsize * output_copies
            held = height * width * channels * itemsize
            return JobPlan(
                tile, streamed, held * images, pass_bytes, band * images, output * images, budget, batch * images
            )

        def fits(p: JobPlan) -> bool:
            if self.device.type == "cpu":
                return p.total_bytes <= budget
            return p.pass_bytes <= budget and p.total_bytes - p.pass_bytes <= host_budget

        if images > 1:  # see plan_group: one image of this size alone runs whole and in memory
            grouped = job(0, False)
            if fits(grouped):
                return grouped
            raise MemoryBudgetError(f"{images} images of {width}x{height} need {grouped.describe()}")
        if self.tile != "auto":
            fixed = 0 if self.tile == 0 or (height <= self.tile and width <= self.tile) else self.tile
            tiles = [fixed]
        else:
            side = max(MIN_TILE, math.isqrt(self.max_tokens()))
            tiles = [0] if height * width <= side * side else []
            while side > MIN_TILE:
                tiles.append(side)
                side = max(MIN_TILE, int(side * 0.85))
            tiles.append(MIN_TILE)
        last = None
        for streamed in (False, True) if can_stream else (False,):
            for tile in tiles:
                last = job(tile, streamed)
                if fits(last):
                    return self._batched(last, job, fits, height, width)
        hint = "; a .png output is written as it is made and needs less" if output_copies > 1 and not can_stream else ""
        raise MemoryBudgetError(
            f"upscaling {width}x{height} to {target_w}x{target_h} needs {last.describe()} at its smallest, over "
            f"the memory budget of {budget / 2**20:,.0f} MiB: raise --memory-budget-mb{hint}"
        )

    def _batched(self, plan: JobPlan, job, fits, height: int, width: int) -> JobPlan:
        """The plan with the largest batch of tiles that ``batch`` allows and the budget keeps (same tile)."""
        if not plan.tile or self.batch == 1:
            return plan
        overlap = min(2 * self.tile_pad, plan.tile // 2)
        per_row = len(tile_starts(width, plan.tile, overlap))
        most = min(per_row, self.max_batch)
        for batch in range(most, 1, -1):
            batched = job(plan.tile, plan.streamed, batch)
            if fits(batched):
                return batched
        return plan

    def plan_group(
        self, height: int, width: int, channels: int, itemsize: int, outscale: float | None, count: int
    ) -> JobPlan | None:
        """The plan for up to ``count`` images of one size run whole as one batch, encoded in memory, or None
        when batching does not apply: ``batch`` is 1, an image alone would be tiled or streamed, or not even
        two fit the budget together. ``plan.batch`` says how many of them to take."""
        if self.batch == 1 or count < 2:
            return None
        alone = self.plan(height, width, channels, itemsize, outscale, output_copies=1 + ENCODER_COPIES)
        if alone.tile or alone.streamed:
            return None
        most = min(count, self.max_batch)
        for images in range(most, 1, -1):
            try:
                return self.plan(
                    height, width, channels, itemsize, outscale, output_copies=1 + ENCODER_COPIES, images=images
                )
            except MemoryBudgetError:
                continue
        return None

    def tile_size(self, height: int, width: int) -> int:
        """Tile side for an RGB 8-bit input at the model's scale, 0 meaning the whole image in one pass."""
        return self.plan(height, width).tile

    # -- inference ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """One pass under autocast: (B, 3, h, w) -> (B, 3, sh, sw) float32 on the model's device."""
        x = x.to(self.device).contiguous(memory_format=torch.channels_last)
        h, w = x.shape[-2:]
        pad_h, pad_w = -h % self.size_multiple, -w % self.size_multiple
        if pad_h or pad_w:  # SwinIR's windows: reflect-padded to a multiple and cropped back, as its own tests do
            mode = "reflect" if pad_h < h and pad_w < w else "replicate"
            x = torch.nn.functional.pad(x, (0, pad_w, 0, pad_h), mode=mode)
        dtype = PRECISIONS[self.precision]
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32):
            out = self.network(x)  # NaLaSR's and ESRT's own forward picks their fast form here
        if pad_h or pad_w:
            out = out[..., : h * self.scale, : w * self.scale]
        return out.float()

    def _pass(self, pixels: np.ndarray) -> np.ndarray:
        """(h, w, 3) float32 -> (sh, sw, 3) float32 on the host."""
        return self._passes([pixels])[0]

    def _passes(self, batch: list[np.ndarray]) -> list[np.ndarray]:
        """Several (h, w, 3) float32 of one size in one network call -> their (sh, sw, 3) float32 on the host."""
        x = torch.from_numpy(np.stack(batch)).permute(0, 3, 1, 2)
        with reused_large_temporaries():  # no page faults for each temporary of the pass
            out = self._forward(x).permute(0, 2, 3, 1).cpu().numpy()
        return list(out)

    def _model_rows(
        self, img: np.ndarray, tile: int, model_alpha: bool, progress: bool, batch: int = 1, pred=None
    ) -> Iterator[np.ndarray]:
        """The blended network output, top to bottom: chunks of (n, sW, 3 or 4) float32 (4th: the alpha pass).

        Tiles run a row of tiles at a time into a band as tall as one tile (tiles of one size in batches of up
        to ``batch``); the rows that no later tile touches are normalised by the feathers' sum and handed on,
        and the rest of the band moves up. ``pred``: the whole image's output, already made (by a group pass).
        """
        h, w = img.shape[:2]
        s = self.scale
        side = tile or max(h, w)
        overlap = min(2 * self.tile_pad, side // 2) if tile else 0
        ys, xs = _Axis.of(h, side, overlap, s), _Axis.of(w, side, overlap, s)
        max_value = float(np.iinfo(img.dtype).max)
        if pred is None and len(ys.starts) == len(xs.starts) == 1 and not model_alpha:
            # One window: its feathers divide out (weight / sum of weights = 1), so the output is the pass itself,
            # without the band's weighting, accumulation and normalisation (four passes over the output).
            pred = self._pass(color_of(img.astype(np.float32) / max_value))
        if pred is not None:
            for a in range(0, len(pred), CHUNK_ROWS):
                yield pred[a : a + CHUNK_ROWS]
            return
        planes = 4 if model_alpha else 3
        band = np.zeros((min(side, h) * s, w * s, planes), np.float32)
        base = 0  # output row of band[0]
        tiles = len(ys.starts) * len(xs.starts)
        with tqdm(total=tiles, desc="tiles", leave=False, disable=not progress or tiles == 1) as bar:
            for k, (y, y1, fy) in enumerate(zip(ys.starts, ys.stops, ys.feathers)):
                row = [(x, x1, fx) for x, x1, fx in zip(xs.starts, xs.stops, xs.feathers)]
                for group in _same_width_runs(row, batch):
                    pixels = [img[y:y1, x:x1].astype(np.float32) / max_value for x, x1, _ in group]
                    preds = self._passes([color_of(p) for p in pixels])
                    if model_alpha:
                        alphas = self._passes([np.repeat(p[..., -1:], 3, axis=2) for p in pixels])
                    for i, (x, x1, fx) in enumerate(group):
                        weight = (fy[:, None] * fx[None, :])[..., None]
                        rows = slice(y * s - base, y1 * s - base)
                        cols = slice(x * s, x1 * s)
                        preds[i] *= weight
                        band[rows, cols, :3] += preds[i]
                        if model_alpha:
                            a = alphas[i].mean(axis=2, keepdims=True)
                            a *= weight
                            band[rows, cols, 3:] += a
                        bar.update()
                done = (ys.starts[k + 1] if k + 1 < len(ys.starts) else h) * s - base
                for a in range(0, done, CHUNK_ROWS):
                    b = min(a + CHUNK_ROWS, done)
                    norm = ys.total[base + a : base + b, None] * xs.total[None, :]
                    yield band[a:b] / norm[..., None]
                kept = y1 * s - base - done  # rows the next row of tiles adds to
                band[:kept] = band[done : done + kept]
                band[kept:] = 0
                base += done

    def _output_rows(
        self, img: np.ndarray, target: tuple[int, int], plan: JobPlan, progress: bool, pred=None
    ) -> Iterator[np.ndarray]:
        """The final image, top to bottom, in chunks of rows with the input's channels and dtype."""
        h, w = img.shape[:2]
        s = self.scale
        max_value = float(np.iinfo(img.dtype).max)
        gray = img.ndim == 2 or img.shape[2] == 2
        alpha = has_alpha(img)
        model_alpha = alpha and self.alpha == "model" and int(img[..., -1].min()) < max_value
        resizer = None
        if target != (w * s, h * s):
            shrink = target[0] < w * s
            resizer = RowResizer((h * s, w * s), target[::-1], "area" if shrink else "lanczos4")
        made = 0  # model-scale rows made so far
        for chunk in self._model_rows(img, plan.tile, model_alpha, progress, plan.batch, pred):
            n = chunk.shape[0]
            np.clip(chunk, 0, 1, out=chunk)
            out = chunk[..., :3].mean(axis=2) if gray else chunk[..., :3]
            if alpha:
                if model_alpha:
                    up_alpha = chunk[..., 3]
                else:  # bicubic, or an opaque alpha (no pass needed): the rows of a whole-image bicubic resize
                    up_alpha = resize_rows(img[..., -1], (h * s, w * s), "cubic", made, made + n)
                    up_alpha = np.clip(up_alpha / max_value, 0, 1)
                out = np.dstack((out, up_alpha))  # (n, W) gray -> (n, W, 2); RGB -> (n, W, 4)
            made += n
            if resizer is not None:
                out = np.clip(resizer.push(out), 0, 1)
                if not len(out):
                    continue
            yield np.round(out * max_value).astype(img.dtype)

    def _check(self, img: np.ndarray) -> None:
        if img.dtype not in (np.uint8, np.uint16):
            raise ValueError(f"images must be uint8 or uint16, got {img.dtype}")
        if img.ndim == 3 and img.shape[2] not in (2, 3, 4) or img.ndim not in (2, 3):
            raise ValueError(f"images must be (H, W) or (H, W, 2|3|4), got {img.shape}")
        if min(img.shape[:2]) < 2:
            raise ValueError(f"image of {img.shape[1]}x{img.shape[0]} pixels is too small to upscale")

    def _job(
        self, img: np.ndarray, outscale: float | None, progress: bool, sink, plan=None, pred=None, **plan_options
    ) -> Readout:
        self._check(img)
        return_large_frees_promptly()  # so that the resident memory, not just the live memory, keeps the budget
        h, w = img.shape[:2]
        channels = 1 if img.ndim == 2 else img.shape[2]
        target = output_size(w, h, self.scale, outscale)
        plan = plan or self.plan(h, w, channels, img.dtype.itemsize, outscale, **plan_options)
        global _JOBS_RUN
        _JOBS_RUN = True
        start = time.perf_counter()
        with PeakMemory(self.device) as memory:
            sink(self._output_rows(img, target, plan, progress, pred), target, plan)
        latency = time.perf_counter() - start
        side_h, side_w = min(plan.tile or h, h), min(plan.tile or w, w)
        tiles = 1
        if plan.tile:
            overlap = min(2 * self.tile_pad, plan.tile // 2)
            tiles = len(tile_starts(h, plan.tile, overlap)) * len(tile_starts(w, plan.tile, overlap))
        return Readout(
            latency_s=latency,
            peak_mem_bytes=memory.peak_bytes,
            tokens=side_h * side_w,
            tiles=tiles,
            tile_size=plan.tile,
            input_size=(w, h),
            output_size=target,
            device=str(self.device),
            precision=self.precision,
            process_peak_bytes=memory.process_peak_bytes,
            estimate_bytes=plan.total_bytes,
            streamed=plan.streamed,
            batch=plan.batch,
        )

    def upscale(
        self, img: np.ndarray, outscale: float | None = None, progress: bool = False, plan: JobPlan | None = None
    ) -> tuple[np.ndarray, Readout]:
        """Upscale an (H, W) gray, (H, W, 2) gray+alpha, (H, W, 3) RGB or (H, W, 4) RGBA image, uint8 or uint16.

        Returns the image at ``outscale`` (default: the model's scale) with the same channels and dtype.
        ``plan``: one made for this image by :meth:`plan_file` (to encode the array later, as the file job would
        have), instead of the plan for returning an array; it must not be streamed.
        """
        if plan is not None and plan.streamed:
            raise ValueError("a streamed plan writes a file: use upscale_to_file")
        return self._to_array(img, outscale, progress, plan)

    def _to_array(self, img, outscale, progress, plan, pred=None) -> tuple[np.ndarray, Readout]:
        result: list[np.ndarray] = []

        def keep(rows, target, plan):
            result.append(assemble(rows, (*target[::-1], *img.shape[2:]), img.dtype))

        readout = self._job(img, outscale, progress, keep, plan=plan, pred=pred)
        return result[0], readout

    def plan_file(self, img: np.ndarray, path: str | Path, outscale: float | None = None) -> JobPlan:
        """The plan :meth:`upscale_to_file` would make for ``img`` into ``path``."""
        channels = 1 if img.ndim == 2 else img.shape[2]
        h, w = img.shape[:2]
        can_stream = Path(path).suffix.lower() == ".png"
        return self.plan(h, w, channels, img.dtype.itemsize, outscale, can_stream, 1 + ENCODER_COPIES)

    def upscale_to_file(
        self, img: np.ndarray, path: str | Path, outscale: float | None = None, progress: bool = False
    ) -> Readout:
        """Upscale ``img`` (as :meth:`upscale`) into an image file, atomically. The encode is part of the job and
        of its memory budget; a PNG too large to encode in memory within the budget is written as it is made."""
        path = Path(path)

        def write(rows, target, plan):
            if plan.streamed:
                channels = 1 if img.ndim == 2 else img.shape[2]
                write_png_rows(path, rows, target[0], target[1], channels, img.dtype)
            else:
                write_image_atomic(assemble(rows, (*target[::-1], *img.shape[2:]), img.dtype), path)

        return self._job(img, outscale, progress, write, plan=self.plan_file(img, path, outscale))

    def groupable(self, img: np.ndarray) -> tuple | None:
        """The key under which ``img`` may share a batch with others (size, channels, dtype), or None: batching
        is off, or the image has an alpha channel (its alpha pass runs on its own)."""
        if self.batch == 1 or has_alpha(img):
            return None
        return (img.shape, img.dtype.str)

    def upscale_group(
        self, imgs: list[np.ndarray], outscale: float | None = None, plan: JobPlan | None = None
    ) -> list[tuple[np.ndarray, Readout]]:
        """Upscale images of one size (one :meth:`groupable` key) through the network as one batch.

        ``plan``: from :meth:`plan_group` for them (made here when not given); ``plan.batch`` must equal
        ``len(imgs)``. Each result equals :meth:`upscale`'s for that image up to the convolutions' summation
        order (within 1e-5 before rounding; an 8- or 16-bit value can move by one step). Each readout's latency
        is the image's share of the batched pass plus its own finishing.
        """
        keys = {self.groupable(img) for img in imgs}
        if len(keys) != 1 or None in keys:
            raise ValueError("upscale_group takes images of one size, without alpha, with batching on")
        h, w = imgs[0].shape[:2]
        channels = 1 if imgs[0].ndim == 2 else imgs[0].shape[2]
        plan = plan or self.plan_group(h, w, channels, imgs[0].dtype.itemsize, outscale, len(imgs))
        if plan is None or plan.batch != len(imgs):
            raise ValueError(f"{len(imgs)} images of {w}x{h} do not run as one batch here")
        for img in imgs:
            self._check(img)
        max_value = float(np.iinfo(imgs[0].dtype).max)
        start = time.perf_counter()
        with PeakMemory(self.device) as memory:
            preds = self._passes([color_of(img.astype(np.float32) / max_value) for img in imgs])
        n = len(imgs)
        share = (time.perf_counter() - start) / n
        # Each image is finished (clip, alpha, resize, rounding) as a whole-image job of its own.
        per_image = (plan.input_bytes // n, plan.pass_bytes, plan.band_bytes // n, plan.output_bytes // n)
        each = JobPlan(0, False, *per_image, plan.budget, n)
        results = []
        for img, pred in zip(imgs, preds):
            out, readout = self._to_array(img, outscale, False, each, pred)
            readout.latency_s += share
            readout.peak_mem_bytes = max(readout.peak_mem_bytes, memory.peak_bytes)
            readout.process_peak_bytes = max(readout.process_peak_bytes, memory.process_peak_bytes)
            readout.estimate_bytes = plan.total_bytes
            results.append((out, readout))
        return results


def _same_width_runs(row: list[tuple], batch: int) -> Iterator[list[tuple]]:
    """Consecutive tiles of one row with the same width, in runs of at most ``batch`` (one network call each)."""
    run: list[tuple] = []
    for tile in row:
        if run and (len(run) == batch or tile[1] - tile[0] != run[0][1] - run[0][0]):
            yield run
            run = []
        run.append(tile)
    if run:
        yield run


def assemble(rows: Iterator[np.ndarray], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Bands of rows -> one (H, W[, C]) image, filled in place as they come."""
    out = np.empty(shape, dtype)
    at = 0
    for band in rows:
        out[at : at + len(band)] = band
        at += len(band)
    return out


def output_size(width: int, height: int, scale: int, outscale: float | None) -> tuple[int, int]:
    """(width, height) of the result: the model's scale, or ``outscale`` rounded to whole pixels."""
    factor = float(outscale or scale)
    return max(1, round(width * factor)), max(1, round(height * factor))


def size_multiple(network: torch.nn.Module) -> int:
    """The multiple of the input's sides a network needs: the largest window of its window attention (BasicSR's
    SwinIR blocks each hold an integer ``window_size``; the network itself does not pad), 1 for networks that take
    any size."""
    windows = [m.window_size for m in network.modules() if type(getattr(m, "window_size", None)) is int]
    return max(windows, default=1)


def color_of(pixels: np.ndarray) -> np.ndarray:
    """The three channels the network sees: RGB as is, gray (and gray+alpha) repeated."""
    if pixels.ndim == 2:
        return np.repeat(pixels[..., None], 3, axis=2)
    if pixels.shape[2] == 2:
        return np.repeat(pixels[..., :1], 3, axis=2)
    return pixels[..., :3]
