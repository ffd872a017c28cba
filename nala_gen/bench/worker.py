"""One protocol for measurements in a fresh Python process.

A fresh process per point keeps one configuration's allocator state, caches and high-water mark out of the
next. The parent names a function (``"module:function"``, or ``"path/to/script.py:function"`` for a script's
worker) and its keyword arguments as JSON; the child
(``python -m nala_gen.bench.worker``) calls it and writes its JSON result to a file the parent gives, so the
function may print freely. A child that fails comes back as one status instead of a result:

- ``{"status": "oom", "note": ...}``: it ran out of memory (a ``MemoryError``, an allocator's out-of-memory
  error, or a kill by signal 9 as the kernel's OOM killer sends);
- ``{"status": "failed", "note": ...}``: any other non-zero exit (the note is its last line of stderr);
- ``{"status": "timeout", "note": ...}``: still running after ``timeout`` seconds (it is killed).

An optional ``memory_cap`` (bytes of ``RLIMIT_DATA``: heap and private mappings) is set in the child before
the function runs, so a configuration that would exhaust the machine fails cleanly as "oom". A function that
must load things first and cap only its measurement calls :func:`limit_memory` itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

FAILURES = ("oom", "failed", "timeout")


def limit_memory(max_bytes: int) -> None:
    """Cap this process's data segment (heap and private mappings), so big allocations fail, not the machine."""
    resource.setrlimit(resource.RLIMIT_DATA, (max_bytes, max_bytes))


def failed(result: dict) -> bool:
    """Whether a worker's answer is a failure status rather than the function's result."""
    return isinstance(result, dict) and result.get("status") in FAILURES and "note" in result


class FreshProcess:
    """A started worker: ``target(**kwargs)`` running in its own Python process; :meth:`result` waits for it.

    Start several before waiting on any to run them side by side.
    """

    def __init__(self, target: str, kwargs: dict | None = None, env: dict | None = None, memory_cap: int | None = None):
        self._dir = tempfile.TemporaryDirectory(prefix="nala-bench-worker-")
        self._out = Path(self._dir.name) / "result.json"
        cmd = [sys.executable, "-m", "nala_gen.bench.worker", target, json.dumps(kwargs or {}), str(self._out)]
        cmd += [str(memory_cap)] if memory_cap else []
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )

    def result(self, timeout: float | None = None) -> dict:
        """The function's JSON result, or a failure status (see the module's docstring)."""
        try:
            try:
                _, stderr = self._proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.communicate()
                return {"status": "timeout", "note": f"over {timeout:.0f} s"}
            code = self._proc.returncode
            if code == 0 and self._out.exists():
                return json.loads(self._out.read_text())
            err = stderr.strip().splitlines()
            reason = err[-1] if err else f"exit {code}"
            oom = "memory" in stderr.lower() or code in (-9, 137)
            return {"status": "oom" if oom else "failed", "note": reason[-300:]}
        finally:
            self._dir.cleanup()


def run_fresh(
    target: str,
    kwargs: dict | None = None,
    env: dict | None = None,
    timeout: float | None = None,
    memory_cap: int | None = None,
) -> dict:
    """``target(**kwargs)`` (see :func:`resolve`) in a fresh Python process with ``env`` added
    to this one's -> its JSON result, or a failure status (see the module's docstring)."""
    return FreshProcess(target, kwargs, env, memory_cap).result(timeout)


def resolve(target: str):
    """The function a target names: ``"module:function"`` or ``"path/to/script.py:function"``."""
    where, _, function = target.rpartition(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, function)


def main(argv: list[str] | None = None) -> int:
    """The child's side: ``TARGET KWARGS_JSON RESULT_PATH [MEMORY_CAP]``."""
    target, kwargs, out, *cap = sys.argv[1:] if argv is None else argv
    if cap:
        limit_memory(int(cap[0]))
    result = resolve(target)(**json.loads(kwargs))
    partial = Path(out).with_suffix(".partial")
    partial.write_text(json.dumps(result))
    partial.replace(out)  # the parent reads a whole result or none
    return 0


if __name__ == "__main__":
    sys.exit(main())
