"""Reading and writing images without losing what users care about.

Reads keep 16-bit depth, alpha and grayscale, and apply the EXIF orientation; damaged files (truncated, not an
image) raise :class:`ImageError` with a one-line reason. Writes are atomic: a temporary file in the target
folder, then a rename, so an interrupted run never leaves a half-written image. PNG can also be written from
rows as they are made (:func:`write_png_rows`), for outputs too large to hold in memory.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from nala_gen.fileio import IMAGE_SUFFIXES, atomic_file, path_problem, write_atomic  # noqa: F401 - IMAGE_SUFFIXES: re-exported

# EXIF orientation -> (rotations by 90 degrees counter-clockwise, then flip left-right)
_ORIENT = {2: (0, True), 3: (2, False), 4: (2, True), 5: (1, True), 6: (3, False), 7: (3, True), 8: (1, False)}


class ImageError(ValueError):
    """An input that cannot be used as an image, or an output that cannot be written."""


def has_alpha(img: np.ndarray) -> bool:
    """Gray+alpha (H, W, 2) or RGBA (H, W, 4)."""
    return img.ndim == 3 and img.shape[2] in (2, 4)


def read_image(path: str | Path, max_pixels: int | None = None) -> np.ndarray:
    """(H, W) gray, (H, W, 2) gray+alpha or (H, W, 3|4) RGB(A), uint8 or uint16, upright per EXIF."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:  # a missing or unreadable file, a symlink loop, a dangling link, a folder
        raise ImageError(path_problem(err) or f"cannot read {path}: {err}") from None
    try:
        with Image.open(io.BytesIO(data)) as probe:
            size, mode = probe.size, probe.mode
            orientation = probe.getexif().get(0x0112, 1)
            if max_pixels and size[0] * size[1] > max_pixels:
                raise ImageError(f"{path} has {size[0]}x{size[1]} pixels, over the limit of {max_pixels:,}")
            probe.load()  # decodes fully: truncated files fail here
    except UnidentifiedImageError:
        raise ImageError(f"{path} is not an image file") from None
    except Image.DecompressionBombError:
        raise ImageError(f"{path} has too many pixels to open safely (a decompression bomb?)") from None
    except (OSError, SyntaxError) as err:
        raise ImageError(f"{path} is damaged or unsupported ({err})") from None
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise ImageError(f"{path} could not be decoded")
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    # Pillow reads a 16-bit gray+alpha PNG as RGBA: its header's colour type (4) says what it is.
    gray_alpha = mode in ("LA", "La") or (data[:8] == b"\x89PNG\r\n\x1a\n" and data[25:26] == b"\x04")
    if img.ndim == 3 and img.shape[2] == 4 and gray_alpha:
        img = img[..., [0, 3]]  # OpenCV expands gray+alpha to BGRA: keep it gray
    elif img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA if img.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    if img.dtype not in (np.uint8, np.uint16):
        raise ImageError(f"{path} has {img.dtype} pixels; only 8- and 16-bit images are supported")
    turns, flip = _ORIENT.get(orientation, (0, False))
    if flip:
        img = img[:, ::-1]
    return np.ascontiguousarray(np.rot90(img, turns))


def encode_image(img: np.ndarray, suffix: str) -> bytes:
    """Encode by suffix. Gray+alpha is written as a gray+alpha PNG (8 or 16 bits), an 8-bit LA image in other
    formats, or (16-bit outside PNG) as RGBA with three equal channels."""
    if suffix in (".jpg", ".jpeg") and (img.dtype != np.uint8 or has_alpha(img)):
        raise ImageError("JPEG cannot store alpha or 16-bit pixels; use --ext png")
    if img.ndim == 3 and img.shape[2] == 2:
        if suffix == ".png" and img.dtype == np.uint16:  # neither OpenCV nor Pillow writes 16-bit gray+alpha
            buf = io.BytesIO()
            _png_writer(img.shape[1], img.shape[0], 2, img.dtype).write_packed(buf, _packed_rows([img]))
            return buf.getvalue()
        if img.dtype == np.uint8:
            buf = io.BytesIO()
            Image.fromarray(img, mode="LA").save(buf, format=Image.registered_extensions()[suffix])
            return buf.getvalue()
        img = img[..., [0, 0, 0, 1]]
    if img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_RGBA2BGRA if img.shape[2] == 4 else cv2.COLOR_RGB2BGR)
    params = [cv2.IMWRITE_JPEG_QUALITY, 95] if suffix in (".jpg", ".jpeg") else []
    ok, buf = cv2.imencode(suffix, img, params)
    if not ok:
        raise ImageError(f"cannot encode a {suffix} image")
    return buf.tobytes()


def write_image_atomic(img: np.ndarray, path: str | Path) -> Path:
    """Encode by the path's suffix, write to a temporary file beside it, then rename into place."""
    path = Path(path)
    return write_atomic(path, encode_image(img, path.suffix.lower()))


def _png_writer(width: int, height: int, channels: int, dtype: np.dtype):
    import png  # pypng: a row-by-row encoder, which OpenCV and Pillow are not

    return png.Writer(
        width,
        height,
        greyscale=channels in (1, 2),
        alpha=channels in (2, 4),
        bitdepth=8 * np.dtype(dtype).itemsize,
        compression=1,  # OpenCV's default: fast, as the bulk of a large PNG's cost is the deflate
    )


def _packed_rows(bands: Iterable[np.ndarray]) -> Iterable[bytes]:
    """Bands of (n, W[, C]) pixels -> PNG's packed rows (samples interleaved, 16-bit big-endian)."""
    for band in bands:
        packed = np.ascontiguousarray(band, dtype=band.dtype.newbyteorder(">")).reshape(band.shape[0], -1)
        yield from (row.tobytes() for row in packed)


def write_png_rows(
    path: str | Path, bands: Iterable[np.ndarray], width: int, height: int, channels: int, dtype: np.dtype
) -> Path:
    """Write a PNG from bands of rows, (n, W) or (n, W, C), top to bottom, never holding the whole image.

    Atomic like :func:`write_image_atomic`. Gray, gray+alpha, RGB and RGBA at 8 or 16 bits, as PNG stores them
    (pypng; no row filters, so the file is somewhat larger than OpenCV's for the same pixels).
    """
    with atomic_file(path) as f:
        written = _png_writer(width, height, channels, dtype).write_packed(f, _packed_rows(bands))
        if written != height:  # raised inside: the partial file is removed, not renamed into place
            raise ImageError(f"internal error: {written} of {height} rows made for {path}")
    return Path(path)


def decoded_bytes(path: str | Path) -> int:
    """Bytes the decoded image will hold, from its header alone (0 when the header cannot be read: the read
    itself then reports why)."""
    try:
        with Image.open(path) as probe:
            width, height = probe.size
            mode = probe.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return 0
    try:
        channels = Image.getmodebands(mode)
    except ValueError:  # a mode Pillow reads but does not list (e.g. I;16 variants): one 16-bit plane
        channels = 1
    itemsize = 2 if ";16" in mode or mode.startswith("I") else 1
    return width * height * channels * itemsize
