"""Shared by the command-line tools: argument types that check numbers (finite, in range) before any work, one
way to end on Ctrl-C or SIGTERM or on a bad path or value (one line, never a traceback), and a quick exit for
commands that are done."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from nala_gen.fileio import path_problem


def bounded(kind: type, low: float, high: float = math.inf, low_inclusive: bool = True) -> Callable[[str], float]:
    """An argparse ``type``: a finite ``kind`` (int or float) in [low, high], or (low, high] without
    ``low_inclusive``; anything else is a one-line usage error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        above = value >= low if low_inclusive else value > low
        if not (math.isfinite(value) and above and value <= high):
            bounds = f"{'at least' if low_inclusive else 'above'} {low:g}"
            if high < math.inf:
                bounds += f" and at most {high:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bounds}, got {text}")
        return value

    return parse


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that ``finally`` blocks (temporary files) run as for Ctrl-C."""


def tile_setting(text: str) -> int | str:
    """An upscaler's ``--tile``: ``auto``, 0 (whole image) or a tile side in input pixels."""
    if text == "auto":
        return text
    try:
        tile = int(text)
    except ValueError:
        tile = -1
    if tile < 0:  # the engine checks the smallest useful size
        raise argparse.ArgumentTypeError("tile must be 'auto', 0 (whole image) or a size in pixels")
    return tile


def _raise_terminated(signum, frame):
    raise Terminated


def interruptible(prog: str, main: Callable[[], int]) -> int:
    """Run a command's ``main`` so that Ctrl-C and SIGTERM end it with one line on stderr and exit 130 / 143,
    after the writes in progress have removed their temporary files."""
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        return main()
    except KeyboardInterrupt as err:
        terminated = isinstance(err, Terminated)
        print(
            f"{prog}: {'terminated' if terminated else 'interrupted'}; nothing half-written was left", file=sys.stderr
        )
        return 143 if terminated else 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def error_line(err: BaseException) -> str | None:
    """The one line a command prints for ``err``: for a path, the path and its problem (symlink loop, dangling
    link, permission, read-only file system, a file where a folder is expected or the other way round); for
    other OSErrors and ValueErrors their message. None for any other error, which is a bug and keeps its
    traceback."""
    problem = path_problem(err)
    if problem is not None:
        return problem
    if isinstance(err, (OSError, ValueError)):
        return str(err) or type(err).__name__
    return None


def run_command(prog: str, main: Callable[[], int]) -> int:
    """Run a command's ``main`` as :func:`interruptible` does; an OSError or ValueError (a missing, unreadable or
    unwritable path, a bad value), or pathlib's symlink-loop RuntimeError, ends it with ``PROG: error: ...`` on
    one line and exit 1."""

    def guarded() -> int:
        try:
            return main()
        except (OSError, ValueError, RuntimeError) as err:
            line = error_line(err)
            if line is None:
                raise
            print(f"{prog}: error: {line}", file=sys.stderr)
            return 1

    return interruptible(prog, guarded)


def leave(code: int) -> NoReturn:
    """End the process with ``code`` once a command has finished, skipping the interpreter's teardown.

    With torch imported, Python's finalisation (clearing thousands of modules and their objects) takes about half
    a second on a 2-core CPU, after the output is already written, and a one-image ``nala-sr upscale`` pays it on
    every call. The commands that end this way close their files before returning (atomic writes, joined I/O
    threads), so all that is left to do is to flush the standard streams and the logging handlers.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)
