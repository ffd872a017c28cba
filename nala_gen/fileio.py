"""Atomic file writes: a temporary file in the target folder, then a rename, so an interrupted run never leaves a
half-written output (used by every command that writes images or result JSON). And what is wrong with a path,
in one line: symlink loops, dangling links, permissions, read-only file systems, a file where a folder is
expected and a folder where a file is (:func:`path_problem`, :func:`check_readable`, :func:`check_writable`), so
that every command names the path and the problem instead of an errno, a temporary file's name or a traceback.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# Image files every command reads (nala-sr's inputs, nala-gen's class folders), by suffix.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
# Videos nala-sr upscales frame by frame (nala_gen.sr.jobs.video), by suffix.
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")


class PathError(OSError):
    """A path that cannot be used as asked; ``str()`` is one line naming the path and the problem."""

    def __str__(self) -> str:
        return self.args[0]


# Python 3.11's Path.resolve() reports a symlink loop as a RuntimeError, not as an OSError.
_SYMLINK_LOOP = re.compile(r"Symlink loop from (.+)")


def real_path(path: str | Path) -> Path:
    """``Path(path).resolve()`` that never raises: a symlink loop stays as far as it resolved (pathlib raises
    RuntimeError for it), so the read or write that follows reports the loop through :func:`path_problem`."""
    return Path(os.path.realpath(path))


def _bad_component(path: Path, last_is_folder: bool) -> str | None:
    """'PART: problem' for the first part of ``path`` (from its root) that is a symlink loop, a dangling symlink,
    or a file where a folder is needed (the last part only when ``last_is_folder``); None when there is none."""
    parts = path.parts
    for i in range(len(parts)):
        part = Path(*parts[: i + 1])
        if os.path.islink(part):
            try:
                os.stat(part)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    return f"{part}: is a symlink loop (it leads back to itself)"
                if err.errno in (errno.ENOENT, errno.ENOTDIR):
                    return f"{part}: is a dangling symlink (to {os.readlink(part)}, which does not exist)"
        if not os.path.lexists(part):
            return None
        if (i < len(parts) - 1 or last_is_folder) and not os.path.isdir(part):
            return f"{part}: is a file, not a folder"
    return None


def _permission_problem(path: Path, code: int) -> str:
    """What a permission or read-only error on ``path`` means (for a path not made yet: on the folder that would
    hold it)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    kind = "folder" if os.path.isdir(path) else "file"
    if code == errno.EROFS or _read_only_fs(path):
        return f"{path}: is on a read-only file system"
    if not os.access(path, os.R_OK):
        return f"{path}: {kind} cannot be read (permission denied)"
    if not os.access(path, os.W_OK):
        return f"{path}: {kind} is not writable (permission denied)"
    if kind == "folder" and not os.access(path, os.X_OK):
        return f"{path}: folder cannot be entered (permission denied)"
    return f"{path}: permission denied"


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def path_problem(err: BaseException, path: str | Path | None = None) -> str | None:
    """One line, ``PATH: problem``, for an OSError about a path (or pathlib's symlink-loop RuntimeError), naming
    the part of the path at fault; None for any other error (a decoder's, or an OSError with no errno).

    ``path`` overrides the error's own file name (e.g. the output a temporary file was for).
    """
    if isinstance(err, PathError):
        return str(err)
    if isinstance(err, RuntimeError):
        match = _SYMLINK_LOOP.fullmatch(str(err))
        if match is None:
            return None
        code, name = errno.ELOOP, ast.literal_eval(match[1])
    elif isinstance(err, OSError) and err.errno is not None:
        code = err.errno
        # A rename names (source, target): the target is what is at fault when it is a folder.
        name = err.filename2 if code in (errno.EISDIR, errno.ENOTEMPTY) and err.filename2 else err.filename
    else:
        return None
    name = path if path is not None else name
    if name is None:
        return err.strerror or str(err)
    name = Path(os.fsdecode(name))
    if code in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR, errno.EEXIST):
        found = _bad_component(name, last_is_folder=code in (errno.ENOTDIR, errno.EEXIST))
        if found:
            return found
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return _permission_problem(name, code)
    problem = {
        errno.ELOOP: "is a symlink loop",
        errno.ENOENT: "does not exist",
        errno.ENOTDIR: "is not a folder",
        errno.EISDIR: "is a folder, not a file",
        errno.EEXIST: "already exists",
    }.get(code, err.strerror)
    return f"{name}: {problem}"


def check_readable(path: str | Path, folder: bool | None = None) -> Path:
    """``path``, or :class:`PathError` when it cannot be read: a file that opens, or a folder that lists
    (``folder``: which one it must be; None: either)."""
    path = Path(path)
    try:
        if folder is None:
            folder = path.is_dir()
        if folder:
            with os.scandir(path):
                pass
        else:
            with open(path, "rb"):
                pass
    except OSError as err:
        raise PathError(path_problem(err)) from None
    return path


def check_writable(path: str | Path, folder: bool = False) -> Path:
    """``path``, or :class:`PathError` when a file (or with ``folder``, a folder of outputs) cannot be written
    there: checked before any work, creating nothing. A symlink loop or dangling link on the way, a file where a
    folder is needed (or a folder where the file would go), and a folder that is read-only or not writable are
    refused; missing folders are fine (they are made when written to)."""
    path = Path(path)
    found = _bad_component(path, last_is_folder=folder)
    if found:
        raise PathError(found)
    if not folder and path.is_dir():
        raise PathError(f"{path}: is a folder, not a file")
    target = path if folder else path.parent
    while not target.exists() and target != target.parent:
        target = target.parent
    if _read_only_fs(target) or not os.access(target, os.W_OK | os.X_OK):
        raise PathError(_permission_problem(target, errno.EACCES))
    return path


def _temporary_name(path: Path) -> Path:
    """A fresh hidden name beside ``path`` for its temporary file (64 random bits)."""
    return path.parent / f".{path.name}.{secrets.token_hex(8)}.part"


@contextmanager
def temporary_beside(path: str | Path) -> Iterator[tuple[int, Path]]:
    """``with temporary_beside(path) as (fd, tmp):`` a new file ``.<name>.<random>.part`` in ``path``'s folder,
    created exclusively with the permissions a plain ``open(path, "wb")`` would give (0666 less the umask, not
    ``mkstemp``'s owner-only 0600). It is removed when the block ends unless the block renamed it away; ``fd``
    is the caller's to close (``os.fdopen`` takes it over).

    The name is chosen before the file is created and the removal covers the creation itself: a signal handler
    (Ctrl-C, SIGTERM) may raise between any two bytecodes, also between ``os.open`` returning and a ``try``
    that would follow it, and ``tempfile.mkstemp`` leaves its file behind then.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PathError(path_problem(err)) from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    tmp = _temporary_name(path)
    try:
        while True:
            try:
                fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask
                break
            except FileExistsError:  # another file by that name: not ours to remove, take another name
                tmp = _temporary_name(path)
            except OSError as err:  # named by its folder, not by the temporary file's random name
                raise PathError(path_problem(err, path.parent)) from None
        yield fd, tmp
    finally:
        tmp.unlink(missing_ok=True)  # gone already when the block renamed it into place


@contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """``with atomic_file(path) as f: f.write(...)``: the file appears at ``path`` only when the block completes.

    Written through a temporary file beside it (:func:`temporary_beside`) and ``os.replace``; on any error or
    interruption the temporary file is removed and ``path`` is left as it was. The file gets the permissions a
    plain ``open(path, "wb")`` would give (0666 less the umask).
    """
    path = Path(path)
    with temporary_beside(path) as (fd, tmp):
        with os.fdopen(fd, "wb") as f:
            yield f
        try:
            os.replace(tmp, path)
        except OSError as err:  # e.g. a folder where the file would go
            raise PathError(path_problem(err, path)) from None


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


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
