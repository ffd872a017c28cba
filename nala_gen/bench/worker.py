"""Run one benchmark configuration in a fresh Python process and read back its JSON line.

A fresh process per point keeps one configuration's allocator state and high-water mark out of the next. An
optional address-space cap (``RLIMIT_DATA``) turns a configuration that would exhaust the machine into a
clean "out of memory" result instead of the kernel's OOM killer.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys


def limit_memory(max_bytes: int) -> None:
    """Cap this process's data segment (heap and private mappings), so big allocations fail, not the machine."""
    resource.setrlimit(resource.RLIMIT_DATA, (max_bytes, max_bytes))


def run_worker(module: str, args: list[str], env: dict | None = None, timeout: float | None = None) -> dict:
    """``python -m module *args`` -> the JSON object on its last stdout line, or a status with the reason."""
    cmd = [sys.executable, "-m", module, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "note": f"over {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = proc.stderr.strip().splitlines()
    reason = err[-1] if err else f"exit {proc.returncode}"
    oom = "memory" in proc.stderr.lower() or proc.returncode in (-9, 137)
    return {"status": "oom" if oom else "failed", "note": reason[-300:]}
