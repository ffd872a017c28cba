"""One shared way to measure latency and peak memory, on CPU and CUDA.

Used by the CLIs, the app and the benchmarks so every readout means the same thing: memory *above the level
at the start* of the measured call.

* CUDA: ``torch.cuda.max_memory_allocated`` (tensors only, exact).
* CPU (Linux): the resident set size (RSS) high-water mark. Freed heap memory is first returned to the OS
  (``malloc_trim``), the mark is reset to the current RSS (``/proc/self/clear_refs``) and read from ``VmHWM``
  at the end, so the figure includes every allocation, not just tensors, even in a long-running process.
  Where the reset is not allowed, a background thread samples the RSS every millisecond (a lower bound).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch


def _status_kib(field_name: str) -> int:
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field_name}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return 0
    return int(match.group(1)) if match else 0


def current_rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is unavailable)."""
    return _status_kib("VmRSS") * 1024


def peak_rss() -> int:
    """The RSS high-water mark since the process started or since :func:`reset_peak_rss`, in bytes."""
    return _status_kib("VmHWM") * 1024


def _load_libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _load_libc()


def release_free_memory() -> None:
    """Hand glibc's free heap back to the OS (``malloc_trim``), so the next measurement starts from what is really in
    use; otherwise memory freed by an earlier call is reused without showing in the RSS."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


_M_TRIM_THRESHOLD = -1
_PROMPT_THRESHOLD = 2**20  # the mmap threshold return_large_frees_promptly sets
_DEFAULT_TRIM_THRESHOLD = 128 * 2**10  # glibc's


@contextmanager
def reused_large_temporaries() -> Iterator[None]:
    """Within the block, large allocations come from the heap, and a freed temporary's pages serve the next one;
    at its end the freed memory goes back to the OS (``malloc_trim``) and large blocks are again returned
    promptly (:func:`return_large_frees_promptly`).

    Why: with every large block a fresh mapping, each temporary of a network pass is page-faulted in on first
    touch, which on a VM runs at a few GB/s: NaLaSR-light's whole-image pass at 1 MP out spent about a third of
    its time there (its transformer makes a dozen 70 MB temporaries). Reusing them within the pass removes that,
    and trimming after it keeps the resident memory between passes what the program holds. Process-wide (glibc);
    a no-op elsewhere.
    """
    if _LIBC is None or not hasattr(_LIBC, "mallopt"):
        yield
        return
    _LIBC.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # keep freed blocks for reuse during the block
    _LIBC.mallopt(_M_MMAP_THRESHOLD, 2**30)
    try:
        yield
    finally:
        return_large_frees_promptly()
        _LIBC.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        release_free_memory()


def return_large_frees_promptly(threshold: int = _PROMPT_THRESHOLD) -> None:
    """Serve allocations above ``threshold`` bytes with their own mappings, handed back to the OS when freed.

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which such blocks come
    from the heap and stay resident once freed: a loop of large temporaries (tiles, bands) then holds 30-70 %
    more memory than it uses. A fixed threshold keeps the resident memory what the program holds, which is what
    a memory budget can promise. Process-wide and idempotent; a no-op off glibc.
    """
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_MMAP_THRESHOLD, threshold)


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0). False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return peak_rss() > 0


@dataclass
class Measurement:
    """What one measured call cost. ``peak_mem_bytes`` is memory above the level at the start."""

    latency_s: float
    peak_mem_bytes: int
    device: str
    runs: list[float] = field(default_factory=list)

    @property
    def peak_mem_mib(self) -> float:
        return self.peak_mem_bytes / 2**20

    def as_dict(self) -> dict:
        return {**asdict(self), "peak_mem_mib": round(self.peak_mem_mib, 1)}


class PeakMemory:
    """Context manager: ``with PeakMemory(device) as pm: ...`` then ``pm.peak_bytes`` (above the start, on the
    device) and ``pm.process_peak_bytes`` (the process's host RSS high-water mark during the block, everything
    the process holds included)."""

    def __init__(self, device: torch.device | str = "cpu", interval_s: float = 0.001) -> None:
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.process_peak_bytes = 0

    def __enter__(self) -> PeakMemory:
        release_free_memory()
        self._host_start = current_rss()
        self._exact = reset_peak_rss()
        self._sampled = self._host_start
        self._thread = None
        if not self._exact:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._sampled = max(self._sampled, current_rss())
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc) -> None:
        if self._exact:
            peak = peak_rss()
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._sampled, current_rss())
        self.process_peak_bytes = peak
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._start
        else:
            self.peak_bytes = max(0, peak - self._host_start)


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[[], object], device: torch.device | str = "cpu", repeats: int = 1, warmup: int = 0
) -> tuple[object, Measurement]:
    """Run ``fn`` ``warmup + repeats`` times; return its last result and the median latency and peak memory."""
    for _ in range(warmup):
        fn()
    runs: list[float] = []
    result = None
    with PeakMemory(device) as pm:
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            result = fn()
            synchronize(device)
            runs.append(time.perf_counter() - start)
    return result, Measurement(statistics.median(runs), pm.peak_bytes, str(device), runs)
