"""The upscaling engine shared by ``nala-sr upscale`` and the app.

What it does that the usual scripts do not:

* overlapping tiles blended with linear feathers (weights sum to one), so tile borders leave no seams;
* the tile size chosen from a memory budget by probing the model at three small sizes (``tile="auto"``);
  the whole image in one pass when it fits;
* alpha kept, upscaled by the model or by bicubic (``alpha="model" | "bicubic"``), grayscale kept as
  grayscale, 16-bit kept as 16-bit;
* any output scale (``outscale``): the model's scale, then Lanczos (or area when shrinking);
* fp32 on CPU, bf16/fp16 autocast on GPUs (fp16 on CPU is refused: there are no half kernels there);
* channels-last convolutions (the bulk of an SR network's time);
* a readout: latency, peak memory, attention tokens per pass, tiles.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import asdict, dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from nala_gen.devices import pick_device
from nala_gen.profiling import PeakMemory

from .imageio import has_alpha

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ALPHA_MODES = ("model", "bicubic")
MIN_TILE = 32
PROBE_SIDES = (48, 96, 128)  # input sides probed for tile="auto"; 128 is where quadratic attention shows
SUPERLINEAR = 1.25  # growth of the cost per token between the two largest probes that reads as quadratic
# The probed cost of a pass belongs to a network on a device at a precision, not to one Upscaler: measured once per
# network (the app builds an Upscaler per request around its cached networks); the budget is read at each call.
_PROBED: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()


@dataclass
class Readout:
    """What one upscale cost. ``tokens`` is the LR pixels of the largest pass (the attention's N)."""

    latency_s: float
    peak_mem_bytes: int
    tokens: int
    tiles: int
    tile_size: int
    input_size: tuple[int, int]
    output_size: tuple[int, int]
    device: str
    precision: str

    @property
    def megapixels_per_s(self) -> float:
        return self.output_size[0] * self.output_size[1] / 1e6 / max(self.latency_s, 1e-9)

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "peak_mem_mib": round(self.peak_mem_bytes / 2**20, 1),
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
    return precision


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


def tokens_within(budget: int, tokens: list[int], peaks: list[int]) -> int:
    """Largest token count whose predicted peak memory fits ``budget``, from measured (tokens, peak) pairs.

    A pass costs a + b·n + c·n² bytes for n tokens: convolutions and linear attention are linear in n, softmax
    attention (ESRT's split softmax) quadratic. When the cost per token clearly grows between the two largest
    probes (ESRT: x1.7 from 96 to 128 px), fit that quadratic through the probes and solve it (a power law
    through small probes misses the quadratic term, which dominates only at larger n). Otherwise take the cost
    per token at the largest probe as constant: an upper bound on b when a >= 0, and steady where a quadratic
    fit would chase the noise of small RSS probes (+-20 MiB here; NaLaSR: x0.8-1.05 per token).
    """
    n, m = np.asarray(tokens, dtype=np.float64), np.asarray(peaks, dtype=np.float64)
    smallest = MIN_TILE * MIN_TILE
    if m[0] >= budget:
        return smallest
    per_token = m[-1] / n[-1]
    if per_token > SUPERLINEAR * m[-2] / n[-2]:
        c, b, a = np.polyfit(n, m, 2)
        if c > 0:
            return max(smallest, int((-b + math.sqrt(b * b + 4 * c * (budget - a))) / (2 * c)))
    return max(smallest, int(budget / per_token))


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Window starts every ``tile - overlap`` pixels; the last window is flush with the end."""
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, tile - overlap))
    return [*starts, length - tile]


def feather(length: int, start: int, stop: int, total: int, overlap: int) -> torch.Tensor:
    """1-D blending weights of a window [start, stop) of ``total`` pixels.

    On a side that borders another window (``overlap`` pixels shared), the outer quarter of the overlap gets
    almost no weight (those pixels saw the least context), the next half ramps linearly up to 1, so two
    neighbours cross-fade over the middle of their overlap with weights summing to one.
    """
    w = torch.ones(length)
    margin, ramp = overlap // 4, overlap // 2
    if ramp > 0 and 2 * (margin + ramp) <= length:
        edge = torch.cat((torch.full((margin,), 1e-3), (torch.arange(ramp) + 0.5) / ramp))
        if start > 0:
            w[: margin + ramp] = edge
        if stop < total:
            w[length - margin - ramp :] = edge.flip(0)
    return w


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
        memory_budget: bytes for ``tile="auto"`` (default: see :func:`available_memory`).
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
    ) -> None:
        if alpha not in ALPHA_MODES:
            raise ValueError(f"unknown alpha mode {alpha!r}; choose {' or '.join(ALPHA_MODES)}")
        if tile != "auto" and (not isinstance(tile, int) or tile < 0 or 0 < tile < MIN_TILE):
            raise ValueError(f"tile must be 'auto', 0 or at least {MIN_TILE}, got {tile!r}")
        self.device = pick_device(device)
        self.precision = pick_precision(precision, self.device)
        # Channels-last (NHWC) lets oneDNN and cuDNN run the convolutions, which dominate SR, without layout
        # conversions: 15-30 % faster on this CPU at 48-250 px inputs, same output to 2e-6.
        self.model = model.to(self.device, memory_format=torch.channels_last).eval()
        self.scale = scale
        self.tile = tile
        self.tile_pad = tile_pad
        self.alpha = alpha
        self.memory_budget = memory_budget
        self.size_multiple = getattr(model, "size_multiple", 1)

    # -- memory model -------------------------------------------------------------------------------------------
    def _probe(self, side: int) -> int:
        x = torch.rand(1, 3, side, side, device=self.device)
        with PeakMemory(self.device) as memory:
            self._forward(x)
        return max(memory.peak_bytes, 1)

    def max_tokens(self) -> int:
        """Largest input (in pixels) whose pass fits the budget, from probes at three sizes (see tokens_within)."""
        probed = _PROBED.setdefault(self.model, {})
        key = (str(self.device), self.precision)
        if key not in probed:
            self._probe(32)  # warm-up: thread pools and allocator arenas are not the model's memory
            probed[key] = [self._probe(side) for side in PROBE_SIDES]
        budget = self.memory_budget or available_memory(self.device)
        return tokens_within(budget, [side * side for side in PROBE_SIDES], probed[key])

    def tile_size(self, height: int, width: int) -> int:
        """Tile side for an input, 0 meaning the whole image in one pass."""
        if self.tile != "auto":
            return 0 if self.tile == 0 or (height <= self.tile and width <= self.tile) else self.tile
        tokens = self.max_tokens()
        if height * width <= tokens:
            return 0
        return max(MIN_TILE, math.isqrt(tokens))

    # -- inference ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """One pass: pad to the model's size multiple, run under autocast, crop. (1, 3, h, w) -> (1, 3, sh, sw)."""
        h, w = x.shape[-2:]
        m = self.size_multiple
        pad_h, pad_w = -h % m, -w % m
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h), mode="reflect")
        x = x.contiguous(memory_format=torch.channels_last)
        dtype = PRECISIONS[self.precision]
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32):
            out = self.model(x)
        return out[..., : h * self.scale, : w * self.scale].float()

    def _run(self, x: torch.Tensor, tile: int, progress: bool) -> tuple[torch.Tensor, int, int]:
        """(1, 3, H, W) -> ((1, 3, sH, sW) on CPU, tiles, largest pass in pixels)."""
        h, w = x.shape[-2:]
        x = x.to(self.device)
        if tile == 0:
            return self._forward(x).cpu(), 1, h * w
        s = self.scale
        overlap = min(2 * self.tile_pad, tile // 2)
        out = torch.zeros(1, 3, h * s, w * s)
        weight = torch.zeros(1, 1, h * s, w * s)
        windows = [(y, xx) for y in tile_starts(h, tile, overlap) for xx in tile_starts(w, tile, overlap)]
        for y, xx in tqdm(windows, desc="tiles", leave=False, disable=not progress or len(windows) == 1):
            y1, x1 = min(y + tile, h), min(xx + tile, w)
            pred = self._forward(x[..., y:y1, xx:x1]).cpu()
            wy = feather((y1 - y) * s, y, y1, h, overlap * s)
            wx = feather((x1 - xx) * s, xx, x1, w, overlap * s)
            wmap = (wy[:, None] * wx[None, :])[None, None]
            out[..., y * s : y1 * s, xx * s : x1 * s] += pred * wmap
            weight[..., y * s : y1 * s, xx * s : x1 * s] += wmap
        return out / weight, len(windows), min(tile, h) * min(tile, w)

    def upscale(
        self, img: np.ndarray, outscale: float | None = None, progress: bool = False
    ) -> tuple[np.ndarray, Readout]:
        """Upscale an (H, W) gray, (H, W, 2) gray+alpha, (H, W, 3) RGB or (H, W, 4) RGBA image, uint8 or uint16.

        Returns the image at ``outscale`` (default: the model's scale) with the same channels and dtype.
        """
        if img.dtype not in (np.uint8, np.uint16):
            raise ValueError(f"images must be uint8 or uint16, got {img.dtype}")
        if img.ndim == 3 and img.shape[2] not in (2, 3, 4) or img.ndim not in (2, 3):
            raise ValueError(f"images must be (H, W) or (H, W, 2|3|4), got {img.shape}")
        h, w = img.shape[:2]
        if min(h, w) < 2:
            raise ValueError(f"image of {w}x{h} pixels is too small to upscale")
        outscale = float(outscale or self.scale)
        target = (max(1, round(w * outscale)), max(1, round(h * outscale)))
        max_value = float(np.iinfo(img.dtype).max)
        pixels = img.astype(np.float32) / max_value
        gray = pixels.ndim == 2 or pixels.shape[2] == 2
        color = pixels if pixels.ndim == 2 else pixels[..., 0] if gray else pixels[..., :3]
        rgb = np.repeat(color[..., None], 3, axis=2) if gray else color
        alpha = pixels[..., -1] if has_alpha(pixels) else None

        tile = self.tile_size(h, w)
        start = time.perf_counter()
        with PeakMemory(self.device) as memory:
            out, tiles, tokens = self._run(to_tensor(rgb), tile, progress)
            out_alpha = None
            if alpha is not None and self.alpha == "model" and alpha.min() < 1.0:
                out_alpha = self._run(to_tensor(np.repeat(alpha[..., None], 3, axis=2)), tile, progress)[0]
        latency = time.perf_counter() - start

        result = out[0].clamp_(0, 1).permute(1, 2, 0).numpy()
        if gray:
            result = result.mean(axis=2)
        if alpha is not None:
            if out_alpha is not None:
                up_alpha = out_alpha[0].clamp_(0, 1).mean(0).numpy()
            else:
                up_alpha = np.clip(
                    cv2.resize(alpha, (w * self.scale, h * self.scale), interpolation=cv2.INTER_CUBIC), 0, 1
                )
            result = np.dstack((result, up_alpha))  # (H, W) gray -> (H, W, 2); RGB -> (H, W, 4)
        if target != (w * self.scale, h * self.scale):
            shrink = target[0] < w * self.scale
            result = cv2.resize(result, target, interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LANCZOS4)
            result = np.clip(result, 0, 1)
        result = np.round(result * max_value).astype(img.dtype)
        readout = Readout(
            latency_s=latency,
            peak_mem_bytes=memory.peak_bytes,
            tokens=tokens,
            tiles=tiles,
            tile_size=tile,
            input_size=(w, h),
            output_size=target,
            device=str(self.device),
            precision=self.precision,
        )
        return result, readout


def to_tensor(img: np.ndarray) -> torch.Tensor:
    """(H, W, 3) float32 -> (1, 3, H, W)."""
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None]
