"""Resize an image a band of rows at a time, as ``cv2.resize`` would resize it whole.

The upscaler streams its output top to bottom, so the final resize (``--outscale``) and the bicubic alpha must
work on rows as they come, without an image-sized buffer. Resizing is separable: each row is resized across by
``cv2.resize`` itself (a row's result does not depend on its neighbours), and the rows are then combined down the
image with the same 1-D weights OpenCV uses (bicubic with A = -0.75, Lanczos over 8 rows, area for shrinking),
replicating the border rows. The result equals a whole-image ``cv2.resize`` to float rounding.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

INTERPOLATIONS = {"cubic": cv2.INTER_CUBIC, "lanczos4": cv2.INTER_LANCZOS4, "area": cv2.INTER_AREA}
_CUBIC_A = -0.75  # OpenCV's bicubic constant


def _cubic(t: np.ndarray) -> np.ndarray:
    """(n,) fractional offsets -> (n, 4) weights of rows floor-1 .. floor+2."""
    a = _CUBIC_A
    w0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a
    w1 = ((a + 2) * t - (a + 3)) * t * t + 1
    w2 = ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1
    return np.stack((w0, w1, w2, 1 - w0 - w1 - w2), axis=1)


def _lanczos4(t: np.ndarray) -> np.ndarray:
    """(n,) fractional offsets -> (n, 8) normalised weights of rows floor-3 .. floor+4."""
    u = t[:, None] + 3 - np.arange(8)[None, :]
    w = np.sinc(u) * np.sinc(u / 4)
    return w / w.sum(axis=1, keepdims=True)


def vertical_weights(src: int, dst: int, interpolation: str) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``dst`` output rows, the source rows it combines and their weights: (dst, K) int and float."""
    if interpolation == "area":
        if dst > src:
            raise ValueError("area interpolation is for shrinking")
        scale = src / dst
        taps = math.ceil(scale) + 1
        start = np.arange(dst) * scale
        first = np.floor(start).astype(np.int64)
        rows = first[:, None] + np.arange(taps)[None, :]
        # The overlap of each source row [r, r+1) with the output row's span [start, start + scale).
        lo = np.maximum(rows, start[:, None])
        hi = np.minimum(rows + 1, np.minimum(start + scale, src)[:, None])
        weights = np.clip(hi - lo, 0, None)
        weights /= weights.sum(axis=1, keepdims=True)
        return np.clip(rows, 0, src - 1), weights
    pos = (np.arange(dst) + 0.5) * (src / dst) - 0.5
    first = np.floor(pos)
    frac = pos - first
    if interpolation == "cubic":
        weights, offset = _cubic(frac), -1
    elif interpolation == "lanczos4":
        weights, offset = _lanczos4(frac), -3
    else:
        raise ValueError(f"unknown interpolation {interpolation!r}; choose {', '.join(INTERPOLATIONS)}")
    rows = first.astype(np.int64)[:, None] + offset + np.arange(weights.shape[1])[None, :]
    return np.clip(rows, 0, src - 1), weights


class RowResizer:
    """Resize an (H, W[, C]) float32 image fed top to bottom in bands to (H2, W2[, C]).

    ``push(rows)`` takes the next source rows and returns the output rows that they complete (possibly none);
    once all H source rows have been pushed, all H2 output rows have been returned. Holds only the source rows
    that later output rows still need, and makes at most ``max_rows`` output rows per step.
    """

    def __init__(self, src_hw: tuple[int, int], dst_hw: tuple[int, int], interpolation: str, max_rows: int = 64):
        self.src_h, self.src_w = src_hw
        self.dst_h, self.dst_w = dst_hw
        self.flag = INTERPOLATIONS[interpolation]
        self.rows, self.weights = vertical_weights(self.src_h, self.dst_h, interpolation)
        self.weights = self.weights.astype(np.float32)
        self.last_needed = self.rows.max(axis=1)  # an output row is ready once this source row has arrived
        self.max_rows = max_rows
        self._buf: np.ndarray | None = None  # source rows [_lo, _lo + len(_buf)), already resized across
        self._lo = 0
        self._next = 0  # next output row

    def across(self, rows: np.ndarray) -> np.ndarray:
        """Resize rows across only (height kept), exactly as the whole-image resize does across."""
        if rows.shape[1] == self.dst_w:
            return rows
        return cv2.resize(rows, (self.dst_w, rows.shape[0]), interpolation=self.flag)

    def push(self, rows: np.ndarray) -> np.ndarray:
        across = self.across(np.ascontiguousarray(rows, dtype=np.float32))
        self._buf = across if self._buf is None else np.concatenate((self._buf, across))
        arrived = self._lo + len(self._buf)
        ready = self._next + int(np.searchsorted(self.last_needed[self._next :], arrived, side="left"))
        out = [self._combine(j, min(j + self.max_rows, ready)) for j in range(self._next, ready, self.max_rows)]
        self._next = ready
        if ready < self.dst_h:  # keep the rows from the first one a later output row needs
            keep = int(self.rows[ready:, 0].min()) - self._lo
            self._buf = self._buf[keep:].copy() if keep > 0 else self._buf
            self._lo += max(keep, 0)
        else:
            self._buf = None
        if not out:
            return np.empty((0, *across.shape[1:]), np.float32)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _combine(self, start: int, stop: int) -> np.ndarray:
        rows, weights = self.rows[start:stop] - self._lo, self.weights[start:stop]
        shape = (stop - start,) + (1,) * (self._buf.ndim - 1)
        out = self._buf[rows[:, 0]] * weights[:, 0].reshape(shape)
        for k in range(1, rows.shape[1]):
            out += self._buf[rows[:, k]] * weights[:, k].reshape(shape)
        return out


def resize_rows(img: np.ndarray, dst_hw: tuple[int, int], interpolation: str, start: int, stop: int) -> np.ndarray:
    """Output rows [start, stop) of ``cv2.resize(img, dst)`` computed from an image held in memory (any dtype,
    read as float32), touching only the source rows they need."""
    resizer = RowResizer(img.shape[:2], dst_hw, interpolation, max_rows=max(stop - start, 1))
    rows = resizer.rows[start:stop]
    lo, hi = int(rows.min()), int(rows.max()) + 1
    resizer._lo, resizer._next = lo, start
    resizer._buf = resizer.across(img[lo:hi].astype(np.float32))
    return resizer._combine(start, stop)
