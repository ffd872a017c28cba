"""Many images through one engine, with the cores kept busy: decode ahead, encode behind, and batches.

``nala-sr upscale`` hands its list of inputs to :class:`FolderJob`. With ``io_threads=1`` one thread decodes
the next input and another encodes the previous output while the network runs on the current one; with
``io_threads=0`` each image is read, upscaled and written in turn (the engine's own file job). The CLI's
``--io-threads auto`` takes 1 on a GPU, where the host's cores are free while the device computes, and 0 on the
CPU, where the network's threads already fill every core (``nala-bench upscale-folder``: no gain on 2 cores). With
an engine whose ``batch`` is above 1, consecutive inputs of one size and no alpha run through the network as one
batch (:meth:`Upscaler.upscale_group`); tiles of one image are batched by the engine itself.

Memory: the job's budget (the engine's, or half of the available memory) covers what is in flight. A network
pass starts only when its job plus the output still being encoded plus the inputs decoded ahead fit the
budget (otherwise the encode is waited for first), and the next input is decoded ahead only into room that is
left. Every image gets the tile an image alone would get, so the outputs are the sequential ones: bit-exact
without batching; with batching within 1e-5 before rounding, so a pixel can differ by one 8- or 16-bit step.

Outputs are written atomically, records and callbacks happen in input order, and an image that fails is
reported and skipped, as in the sequential path.
"""

from __future__ import annotations

import glob
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nala_gen.fileio import file_sha256, path_problem, real_path

from ..upscale.engine import ENCODER_COPIES, Readout, Upscaler
from ..upscale.imageio import ImageError, decoded_bytes, read_image, write_image_atomic
from .manifest import JobManifest


@dataclass
class Item:
    """One input on its way through the job."""

    src: Path
    img: np.ndarray | None = None
    sha256: str | None = None
    dst: Path | None = None
    estimate: int = 0  # bytes the decoded input holds (header estimate until decoded)
    error: str | None = None
    pixels: np.ndarray | None = None  # the upscaled image until it is encoded
    readout: Readout | None = None  # what its pass measured


class _Inline:
    """An executor that runs each call at once (``io_threads=0``)."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on it, like a thread pool does
            future.set_exception(err)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


class FolderJob:
    """Upscale ``inputs`` to the paths ``destination(src, img)`` gives.

    Args:
        engine: the upscaler (its ``batch`` decides image batches).
        destination: input path and decoded image -> output path.
        outscale: final scale, or None for the model's.
        io_threads: 1 to decode ahead and encode behind the network; 0 for one step after another.
        manifest, settings, skip_existing: the resumable-job record (see :mod:`nala_gen.sr.jobs`); inputs are
            hashed only when there is a manifest.
        protected: resolved paths no output may overwrite (the inputs).
        max_pixels: inputs larger than this are refused.
        on_done(item, readout), on_skip(item, reason_redone_or_None), on_error(src, reason): reports, called in
            input order from the calling thread.
    """

    def __init__(
        self,
        engine: Upscaler,
        destination: Callable[[Path, np.ndarray], Path],
        outscale: float | None = None,
        io_threads: int = 1,
        manifest: JobManifest | None = None,
        settings: dict | None = None,
        skip_existing: bool = False,
        protected: set[Path] | None = None,
        max_pixels: int | None = None,
        progress: bool = False,
        on_done: Callable[[Item, Readout], None] = lambda item, readout: None,
        on_skip: Callable[[Item], None] = lambda item: None,
        on_redo: Callable[[Item, str], None] = lambda item, why: None,
        on_error: Callable[[Path, str], None] = lambda src, reason: None,
    ) -> None:
        if io_threads not in (0, 1):
            raise ValueError(f"io_threads must be 0 or 1, got {io_threads!r}")
        self.engine = engine
        self.destination = destination
        self.outscale = outscale
        self.io_threads = io_threads
        self.manifest = manifest
        self.settings = settings or {}
        self.skip_existing = skip_existing
        self.protected = protected or set()
        self.max_pixels = max_pixels
        self.progress = progress
        self.on_done, self.on_skip, self.on_redo, self.on_error = on_done, on_skip, on_redo, on_error
        self.failures = 0

    # -- the stages ---------------------------------------------------------------------------------------------
    def _read(self, item: Item) -> Item:
        try:
            item.img = read_image(item.src, max_pixels=self.max_pixels)
            item.estimate = item.img.nbytes
            if self.manifest is not None:
                item.sha256 = file_sha256(item.src)
        except (ImageError, OSError) as err:
            item.error = _reason(err)
        return item

    def _prepare(self, item: Item) -> str:
        """Output path, overwrite and resume checks: "go" (needs a pass), "skip" or "fail" (item.error says why)."""
        if item.error is None:
            try:
                item.dst = self.destination(item.src, item.img)
                if real_path(item.dst) in self.protected:
                    raise ImageError(f"output {item.dst} would overwrite an input")
            except (ImageError, ValueError, OSError) as err:
                item.error = _reason(err)
        if item.error is not None:
            return "fail"
        if self.skip_existing:
            if self.manifest is not None:
                redo = self.manifest.why_redo(item.dst, item.sha256, self.settings)
            else:
                redo = None if item.dst.exists() else "no output yet"
            if redo is None:
                return "skip"
            if item.dst.exists():
                self.on_redo(item, redo)
        for stale in item.dst.parent.glob(f".{glob.escape(item.dst.name)}.*.part"):  # left by a killed run
            stale.unlink(missing_ok=True)
        return "go"

    def _write(self, items: list[Item]) -> list[Item]:
        for item in items:
            try:
                write_image_atomic(item.pixels, item.dst)
            except (ImageError, OSError) as err:
                item.error = _reason(err)
            item.pixels = None  # no longer needed once encoded
        return items

    def _finish(self, items: list[Item]) -> None:
        for item in items:
            if item.error is not None:
                self._fail(item.src, item.error)
                continue
            readout = item.readout
            if self.manifest is not None:
                record = {"input": str(item.src), "output": str(item.dst), "status": "ok"}
                record.update(model=self.settings.get("model"), **readout.as_dict())
                try:
                    self.manifest.append({**record, "input_sha256": item.sha256, "settings": self.settings})
                except OSError as err:
                    self.on_error(item.dst, f"cannot record it in {self.manifest.path}: {err.strerror}")
            self.on_done(item, readout)

    def _fail(self, src: Path, reason: str) -> None:
        self.failures += 1
        self.on_error(src, reason)

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self, inputs: list[Path]) -> int:
        """Upscale every input; returns the number that failed."""
        from tqdm import tqdm

        pool = ThreadPoolExecutor(2, thread_name_prefix="nala-io") if self.io_threads else _Inline()
        pending = deque(Item(src) for src in inputs)  # not yet submitted for reading
        reads: deque[tuple[Item, Future]] = deque()  # submitted, in order
        writing: tuple[Future, int] | None = None  # the encode in flight and the bytes it holds
        bar = tqdm(total=len(inputs), desc="images", unit="img", disable=not self.progress or len(inputs) == 1)

        budget = self.engine.budget

        def read_ahead(room: int, at_least: int = 0) -> None:
            """Submit reads while their inputs fit ``room`` (and at least ``at_least`` reads are queued)."""
            while pending and (len(reads) < at_least or len(reads) < self.engine.max_batch):
                item = pending[0]
                item.estimate = decoded_bytes(item.src)
                if len(reads) >= at_least and item.estimate > room:
                    return
                pending.popleft()
                room -= item.estimate
                reads.append((item, pool.submit(self._read, item)))

        def wait_write() -> None:
            """Let the encode in flight finish, and report it (so that reports keep the input order)."""
            nonlocal writing
            if writing is not None:
                items = writing[0].result()
                writing = None
                self._finish(items)
                bar.update(len(items))

        def admitted(item: Item) -> bool:
            """Whether ``item`` goes on to the network; a skip or a failure is reported here, in order."""
            status = self._prepare(item)
            if status != "go":
                wait_write()
                self.on_skip(item) if status == "skip" else self._fail(item.src, item.error)
                bar.update()
            return status == "go"

        try:
            while pending or reads:
                read_ahead(0, at_least=1)
                item, future = reads.popleft()
                future.result()
                if not admitted(item):
                    continue
                group = [item]
                key = self.engine.groupable(item.img)
                # Batching: take the next inputs while they are of the same size (a different one ends the group).
                while key is not None and len(group) < self.engine.max_batch:
                    read_ahead(0, at_least=1)
                    following = reads[0][1].result().img if reads else None
                    if following is None or self.engine.groupable(following) != key:
                        break
                    nxt, _ = reads.popleft()
                    if admitted(nxt):
                        group.append(nxt)
                plans = self._plans(group)
                job_bytes = sum(p.total_bytes for p, _ in plans if p is not None)
                queued = sum(i.estimate for i, _ in reads)
                if writing is not None and job_bytes + writing[1] + queued > budget():
                    wait_write()  # the pass and the encode in flight would not fit together
                read_ahead(budget() - job_bytes - (writing[1] if writing else 0) - queued)
                to_encode, finished = self._compute(plans)
                wait_write()  # the previous image's encode ran beside this pass; report it before this one
                self._finish(finished)
                bar.update(len(finished))
                if to_encode:
                    holds = sum(i.pixels.nbytes for i in to_encode) * (1 + ENCODER_COPIES)
                    writing = (pool.submit(self._write, to_encode), holds)
            wait_write()
        finally:
            bar.close()
            pool.shutdown(wait=True)
        return self.failures

    def _plans(self, group: list[Item]) -> list[tuple]:
        """[(plan, items)]: one batched plan for as many of the group as fit, then single plans for the rest."""
        plans = []
        rest = list(group)
        while len(rest) > 1:
            img = rest[0].img
            channels = 1 if img.ndim == 2 else img.shape[2]
            plan = self.engine.plan_group(*img.shape[:2], channels, img.dtype.itemsize, self.outscale, len(rest))
            if plan is None:
                break
            plans.append((plan, rest[: plan.batch]))
            rest = rest[plan.batch :]
        for item in rest:
            try:
                plans.append((self.engine.plan_file(item.img, item.dst, self.outscale), [item]))
            except ValueError as err:  # over the budget at every tile: reported, the job goes on
                item.error = _reason(err)
                plans.append((None, [item]))
        return plans

    def _compute(self, plans: list[tuple]) -> tuple[list[Item], list[Item]]:
        """Run the network: (items whose outputs wait to be encoded, items already finished: streamed PNGs and
        sequential jobs written here, and failures)."""
        to_encode, finished = [], []
        for plan, items in plans:
            try:
                if plan is None:
                    raise ValueError(items[0].error)
                if len(items) > 1:
                    results = self.engine.upscale_group([i.img for i in items], self.outscale, plan)
                    for item, (out, readout) in zip(items, results):
                        item.pixels, item.readout = out, readout
                    to_encode += items
                elif plan.streamed or not self.io_threads:
                    (item,) = items
                    item.readout = self.engine.upscale_to_file(item.img, item.dst, self.outscale, self.progress)
                    finished.append(item)
                else:
                    (item,) = items
                    item.pixels, item.readout = self.engine.upscale(item.img, self.outscale, self.progress, plan=plan)
                    to_encode.append(item)
            except (ImageError, ValueError, RuntimeError, OSError) as err:
                for item in items:
                    item.error = _reason(err)
                finished += items
            for item in items:
                item.img = None  # the input is no longer needed
        return to_encode, finished


def _reason(err: BaseException) -> str:
    """One line for a failed image: a path's problem as :func:`~nala_gen.fileio.path_problem` names it, else the
    error's first line."""
    return path_problem(err) or (str(err).splitlines()[0] if str(err) else type(err).__name__)
