"""The fused NaLa op of several git revisions (or built modules) timed against each other in one process.

    python scripts/op_ab.py HEAD~2 HEAD [--shapes 71680x4x32 62500x8x18] [--rounds 11]
    python scripts/op_ab.py --so a.so b.so

Each revision's ``nala_gen/ops/csrc`` (``nala_gen/attention/csrc`` before the kernels moved) is built as setup.py builds
it (cached under ``build/op_ab/<commit>``; a minute or so each), every build is loaded into this process under a name of
its own, and the builds take turns round by round: per round and build, the median of 5 calls of ``linear_attention(q,
k, v, out=...)`` (``into``) and of ``linear_attention(q, k, v)`` (``op``, a new output each call) under
``torch.inference_mode()``, random inputs, batch 1, float32. Printed per shape: each build's median over rounds and the
median of its per-round ratios to the first build. Why one process: the VM's speed drifts by 10-15 % within minutes,
more than the changes compared here, and alternating fresh processes needs many more rounds to see a few per cent. (A
candidate must be loaded before anything imports the op: a harness that swaps it in afterwards times the installed build
twice.) Nothing is written; a developer's diagnostic for the op's speed (docs/kernel.md quotes its ratios). Run it with
nothing else on the CPU."""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("nala_gen/ops/csrc", "nala_gen/attention/csrc")  # where the op's sources are, then where they were
CALLS = 5


def build(revision: str) -> Path:
    """Build the op's sources at ``revision`` (as setup.py's flags, with the module name the package imports);
    returns the module's path, reused when that commit was built before."""
    from torch.utils.cpp_extension import include_paths, library_paths

    commit = subprocess.run(["git", "rev-parse", revision], cwd=ROOT, capture_output=True, text=True, check=True)
    out_dir = ROOT / "build" / "op_ab" / commit.stdout.strip()
    module = out_dir / "_nala_fused.so"
    if module.exists():
        return module
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, *SOURCES], cwd=ROOT, capture_output=True, text=True
    )
    sources = listed.stdout.split()[0]
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "csrc.tar"
        subprocess.run(["git", "archive", "-o", str(archive), revision, sources], cwd=ROOT, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        out_dir.mkdir(parents=True, exist_ok=True)
        includes = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
        libraries = [f"-L{p}" for p in library_paths()]
        cmd = [
            "g++", "-shared", "-fPIC", "-std=c++20", "-O3", "-g0", "-fopenmp", "-fno-math-errno",
            "-fno-trapping-math", "-Wno-psabi", "-DTORCH_EXTENSION_NAME=_nala_fused", *includes,
            str(Path(tmp) / sources / "nala_fused.cpp"), "-o", str(module) + ".tmp", *libraries,
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
        ]  # fmt: skip
        print(f"building {revision} ...", file=sys.stderr)
        subprocess.run(cmd, check=True)
        Path(str(module) + ".tmp").rename(module)
    return module


def load(path: Path, index: int):
    """The extension module at ``path``, loaded under a name of its own (its init function is PyInit__nala_fused)."""
    import torch  # noqa: F401  (its libraries, which the module links, are loaded with it)

    name = f"op_ab_{index}._nala_fused"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, str(path), loader=loader))
    loader.exec_module(module)
    return module


def compare(labels: list[str], modules: list, shape: str, rounds: int) -> list[str]:
    """Alternated rounds of every module at one shape; one printed line per module."""
    import torch

    from nala_gen.attention import linear_attention
    from nala_gen.ops import nala_fused

    tokens, heads, head_dim = map(int, shape.split("x"))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, tokens, head_dim) for _ in range(3))
    out = torch.empty(1, heads, tokens, head_dim)
    calls = {"into": lambda: linear_attention(q, k, v, out=out), "op": lambda: linear_attention(q, k, v)}
    times = {label: {kind: [] for kind in calls} for label in labels}
    installed = nala_fused._op
    try:
        with torch.inference_mode():
            for module in modules:  # one warm-up call of each kind per build
                nala_fused._op = module
                for call in calls.values():
                    call()
            for _ in range(rounds):
                for label, module in zip(labels, modules):
                    nala_fused._op = module
                    for kind, call in calls.items():
                        runs = []
                        for _ in range(CALLS):
                            start = time.perf_counter()
                            call()
                            runs.append(time.perf_counter() - start)
                        times[label][kind].append(statistics.median(runs) * 1e3)
    finally:
        nala_fused._op = installed
    lines = []
    for label in labels:
        parts = [f"{shape}  {label:>14}"]
        for kind in calls:
            ratios = [a / b for a, b in zip(times[label][kind], times[labels[0]][kind])]
            parts.append(f"{kind} {statistics.median(times[label][kind]):7.2f} ms  x{statistics.median(ratios):.3f}")
        lines.append("   ".join(parts))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*", help="git revisions to build and compare (the first is the base)")
    parser.add_argument("--so", nargs="*", default=[], type=Path, help="built modules to compare instead")
    parser.add_argument("--shapes", nargs="+", default=["71680x4x32", "62500x8x18"], help="tokens x heads x head dim")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    paths = [build(revision) for revision in args.revisions] + list(args.so)
    labels = [*args.revisions, *(p.name for p in args.so)]
    if len(paths) < 2:
        parser.error("give at least two revisions or modules")
    if len(set(labels)) < len(labels):
        labels = [f"{i}:{label}" for i, label in enumerate(labels)]
    modules = [load(path, i) for i, path in enumerate(paths)]
    for shape in args.shapes:
        for line in compare(labels, modules, shape, args.rounds):
            print(line, flush=True)


if __name__ == "__main__":
    main()
