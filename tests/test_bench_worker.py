"""The fresh-process protocol every bench measures through (nala_gen.bench.worker): results, failures, caps."""

import importlib
import os
import re
from pathlib import Path

from nala_gen.bench.worker import FreshProcess, failed, run_fresh

WORKERS = """
import os


def answer(n, label="x"):
    return {"pid": os.getpid(), "n": n * 2, "label": label, "env": os.environ.get("NALA_TEST_WORKER")}


def chatty():
    print("progress goes to stdout; the result does not")
    return {"status": "ok"}


def crash():
    raise ValueError("no such configuration")


def allocate(mib):
    block = bytearray(mib * 2**20)
    return {"bytes": len(block)}


def exit_code(code):
    os._exit(code)


def sleep(seconds):
    import time

    time.sleep(seconds)
    return {}
"""


def _script(tmp_path) -> str:
    path = tmp_path / "bench_workers.py"
    path.write_text(WORKERS)
    return str(path)


def test_a_worker_runs_in_a_fresh_process_with_its_arguments_and_environment(tmp_path):
    script = _script(tmp_path)
    result = run_fresh(f"{script}:answer", {"n": 21, "label": "y"}, env={"NALA_TEST_WORKER": "set"})
    assert result == {"pid": result["pid"], "n": 42, "label": "y", "env": "set"}
    assert result["pid"] != os.getpid() and not failed(result)
    assert run_fresh(f"{script}:chatty") == {"status": "ok"}  # printing does not garble the result


def test_a_module_function_is_a_target_too():
    assert run_fresh("nala_gen.bench.common:run_stamp").endswith(" UTC")


def test_a_crashing_worker_reports_failed_with_its_error(tmp_path):
    result = run_fresh(f"{_script(tmp_path)}:crash")
    assert result["status"] == "failed" and "ValueError: no such configuration" in result["note"] and failed(result)
    result = run_fresh(f"{_script(tmp_path)}:exit_code", {"code": 3})
    assert result == {"status": "failed", "note": "exit 3"}


def test_a_worker_over_its_memory_cap_reports_out_of_memory(tmp_path):
    script = _script(tmp_path)
    assert run_fresh(f"{script}:allocate", {"mib": 8}, memory_cap=256 * 2**20) == {"bytes": 8 * 2**20}
    result = run_fresh(f"{script}:allocate", {"mib": 1024}, memory_cap=256 * 2**20)
    assert result["status"] == "oom" and "MemoryError" in result["note"]


def test_a_worker_killed_by_signal_nine_reads_as_out_of_memory(tmp_path):
    # what the kernel's OOM killer does: no traceback, only the signal
    result = run_fresh(f"{_script(tmp_path)}:exit_code", {"code": 137})
    assert result["status"] == "oom"


def test_a_worker_past_its_timeout_is_killed_and_says_so(tmp_path):
    assert run_fresh(f"{_script(tmp_path)}:sleep", {"seconds": 60}, timeout=2) == {
        "status": "timeout",
        "note": "over 2 s",
    }


def test_workers_started_together_run_side_by_side(tmp_path):
    script = _script(tmp_path)
    procs = [FreshProcess(f"{script}:answer", {"n": n}) for n in range(3)]
    results = [p.result(timeout=60) for p in procs]
    assert [r["n"] for r in results] == [0, 2, 4] and len({r["pid"] for r in results}) == 3


def test_a_bench_s_declared_measure_is_its_own_worker_run_fresh():
    """A bench that declares ``MEASURE = "module:function"`` names a function of its own module and runs it
    through the protocol by that name."""
    benches = sorted((Path(__file__).resolve().parents[1] / "nala_gen" / "bench").glob("*.py"))
    declaring = 0
    for path in benches:
        source = path.read_text()
        measure = re.search(r'^MEASURE = "([\w.]+):(\w+)"$', source, re.MULTILINE)
        if measure is None:
            continue
        declaring += 1
        module = importlib.import_module(measure[1])
        assert Path(module.__file__) == path, f"{path.name}: MEASURE names {measure[1]}"
        assert callable(getattr(module, measure[2], None)), f"{path.name}: no function {measure[2]}"
        assert re.search(r"(run_fresh|FreshProcess)\(\s*MEASURE\b", source), f"{path.name}: MEASURE is not run"
    assert declaring, "no bench declares MEASURE: the pattern is broken"
