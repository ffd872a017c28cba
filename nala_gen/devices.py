"""Which torch device a command or the app runs on: one rule for every entry point."""

from __future__ import annotations

import re

import torch

_DEVICE = re.compile(r"(cpu|cuda|mps)(:\d+)?")


def pick_device(device: str = "auto") -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; anything else, or a
    device this machine lacks, is a one-line ``ValueError``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("CUDA was asked for but is not available; use --device cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"no CUDA device {index}: this machine has {torch.cuda.device_count()}")
    if device.startswith("mps") and not torch.backends.mps.is_available():
        raise ValueError("MPS was asked for but is not available; use --device cpu")
    return torch.device(device)


# CPU flags (as Linux names them) of native bf16 arithmetic: AVX-512's dot products (Intel Cooper Lake and later,
# AMD Zen 4 and later) or AMX tiles (Intel Sapphire Rapids and later).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags() -> frozenset[str]:
    """The processor's feature flags (``/proc/cpuinfo``; empty where it cannot be read, e.g. not on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU computes bf16 natively. Elsewhere oneDNN and PyTorch emulate it, slower than fp32."""
    return bool((cpu_flags() if flags is None else flags) & NATIVE_BF16_FLAGS)


def cpu_model() -> str:
    """The processor's name (``/proc/cpuinfo`` on Linux, else what ``platform`` says): the same script gives other
    figures on another CPU, and a shared machine's CPU can change between sessions."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
