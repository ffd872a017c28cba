"""Atomic file writes: a temporary file in the target folder, then a rename, so an interrupted run never leaves a
half-written output (used by every command that writes images or result JSON)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# Image files every command reads (nala-sr's inputs, nala-gen's class folders), by suffix.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
# Videos nala-sr upscales frame by frame (nala_gen.sr.jobs.video), by suffix.
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")


def _current_umask() -> int:
    mask = os.umask(0)  # the only portable way to read it is to set it and put it back
    os.umask(mask)
    return mask


# Read once at import: flipping the umask on every write would also open a window in which another thread's new
# files get mode 0666 (the app writes from worker threads).
_UMASK = _current_umask()


@contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """``with atomic_file(path) as f: f.write(...)``: the file appears at ``path`` only when the block completes.

    Written through a temporary file beside it and ``os.replace``; on any error or interruption the temporary
    file is removed and ``path`` is left as it was. The file gets the permissions a plain ``open(path, "wb")``
    would give (0666 less the umask), not the owner-only 0600 of ``mkstemp``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)
    return Path(path)


def update_json(path: str | Path, key: str, value) -> Path:
    """Set ``key`` in the JSON object stored at ``path`` (created if missing), keeping the other keys; atomic."""
    path = Path(path)
    payload = json.loads(path.read_text()) if path.exists() else {}
    payload[key] = value
    return write_atomic(path, (json.dumps(payload, indent=2) + "\n").encode())
