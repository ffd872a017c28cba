"""The auto-tile probes kept across processes (nala_gen.sr.upscale.probe_cache): read, written, keyed, harmless."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from nala_gen.bench.upscale_memory import stand_in_network
from nala_gen.ops import using
from nala_gen.sr.archs.nalasr_arch import NaLaSR
from nala_gen.sr.upscale import engine as upscaler
from nala_gen.sr.upscale import probe_cache
from nala_gen.sr.upscale.engine import PROBE_SIDES, MemoryBudgetError, Upscaler

MIB = 2**20


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "probes.json"
    monkeypatch.setenv(probe_cache.CACHE_ENV, str(path))
    monkeypatch.setattr(upscaler, "_JOBS_RUN", False)  # as in a fresh process (other tests ran jobs in this one)
    return path


def key_of(network, precision="fp32"):
    return probe_cache.network_key(network, torch.device("cpu"), precision, PROBE_SIDES)


def tiny_nalasr(num_feat=16, seed=0):
    torch.manual_seed(seed)
    return NaLaSR(num_feat=num_feat, num_block=1, num_heads=2, upscale=2)


def test_a_full_probe_set_is_stored_under_the_networks_key(cache):
    net = stand_in_network()
    Upscaler(net, 4, "cpu", memory_budget=1024 * MIB).plan(40, 40)
    entries = json.loads(cache.read_text())
    key = key_of(Upscaler(stand_in_network(), 4, "cpu").network)
    assert list(entries) == [key]
    peaks = entries[key]["peaks"]
    assert len(peaks) == len(PROBE_SIDES) and all(p > 0 for p in peaks)


def test_the_key_follows_structure_and_place_not_weight_values():
    same, other_weights = tiny_nalasr(seed=0), tiny_nalasr(seed=1)
    assert not torch.equal(same.head.weight, other_weights.head.weight)
    assert key_of(same) == key_of(other_weights)
    assert key_of(same) != key_of(tiny_nalasr(num_feat=24))  # other shapes
    assert key_of(same) != key_of(NaLaSR(num_feat=16, num_block=1, num_heads=2, upscale=2, kernel="relu"))
    assert key_of(same) != key_of(same, precision="bf16")
    threads, before = torch.get_num_threads(), key_of(same)
    torch.set_num_threads(threads + 1)
    try:
        assert key_of(same) != before  # other threads: other workspaces
    finally:
        torch.set_num_threads(threads)


def test_a_stored_set_plans_the_job_without_probing(cache):
    # Readings no real probe of this one-conv network would give (a GiB per 128^2 pass): a plan that follows
    # them proves the file was read instead of the network probed.
    network = Upscaler(stand_in_network(), 4, "cpu").network
    huge = [int(2**30 * (side / PROBE_SIDES[-1]) ** 2) for side in PROBE_SIDES]
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({key_of(network): {"peaks": huge, "stored": 0}}))
    engine = Upscaler(stand_in_network(), 4, "cpu", memory_budget=512 * MIB)
    plan = engine.plan(200, 200)
    assert plan.tile and plan.tile < 128 and plan.pass_bytes > 100 * MIB
    with pytest.raises(MemoryBudgetError):
        Upscaler(stand_in_network(), 4, "cpu", memory_budget=4 * MIB).plan(200, 200)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"KEY": {"peaks": [1, -5, "x"]}}'])
def test_a_corrupt_cache_is_ignored_and_replaced(cache, content):
    network = Upscaler(stand_in_network(), 4, "cpu").network
    cache.parent.mkdir(parents=True)
    cache.write_text(content.replace("KEY", key_of(network)))
    img = np.full((24, 24, 3), 128, np.uint8)
    out, _ = Upscaler(stand_in_network(), 4, "cpu", memory_budget=1024 * MIB).upscale(img)
    assert out.shape == (96, 96, 3)
    peaks = json.loads(cache.read_text())[key_of(network)]["peaks"]
    assert len(peaks) == len(PROBE_SIDES) and all(p > 0 for p in peaks)


def test_an_unwritable_cache_or_off_costs_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(probe_cache.CACHE_ENV, str(blocker / "probes.json"))  # its folder is a file
    img = np.full((24, 24, 3), 128, np.uint8)
    assert Upscaler(stand_in_network(), 4, "cpu").upscale(img)[0].shape == (96, 96, 3)
    monkeypatch.setenv(probe_cache.CACHE_ENV, "off")
    assert probe_cache.cache_path() is None
    Upscaler(stand_in_network(), 4, "cpu").upscale(img)
    assert list(tmp_path.iterdir()) == [blocker]


def test_the_cache_keeps_only_the_newest_entries(cache, monkeypatch):
    monkeypatch.setattr(probe_cache, "MAX_ENTRIES", 3)
    for i in range(5):
        probe_cache.store(f"key{i}", [1, 2, 3])
    assert sorted(json.loads(cache.read_text())) == ["key2", "key3", "key4"]


def test_a_second_cli_run_reads_what_the_first_stored(tmp_path):
    # Two fresh nala-sr processes, as a user runs them: the first probes and stores, the second finds the entry.
    src = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(src)
    env_cache = tmp_path / "probes.json"
    env = {**os.environ, probe_cache.CACHE_ENV: str(env_cache)}
    for i in range(2):
        cmd = [sys.executable, "-m", "nala_gen.sr.cli", "upscale", str(src), "-o", str(tmp_path / f"out{i}.png")]
        proc = subprocess.run([*cmd, "--model", "nalasr-light-x4", "-q"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-1500:]
        if i == 0:
            first = env_cache.read_text()
            assert len(json.loads(first)) == 1
    assert env_cache.read_text() == first  # read, not probed and stored again


def test_probes_taken_after_a_job_are_not_kept_for_other_processes(cache):
    img = np.full((24, 24, 3), 128, np.uint8)
    Upscaler(stand_in_network(), 4, "cpu", memory_budget=1024 * MIB).upscale(img)  # probes, stores, then a job
    assert len(json.loads(cache.read_text())) == 1
    # a network of another structure, probed in a process whose allocator now holds the job's freed memory
    Upscaler(tiny_nalasr(), 2, "cpu", memory_budget=1024 * MIB).upscale(img)
    assert len(json.loads(cache.read_text())) == 1


@pytest.mark.parametrize(
    "change",
    [{"fused": False}, {"fused_isa": "avx2"}, {"fused_isa": "baseline"}, {"winograd": False}, {"compile": True}],
)
def test_toggling_a_runtime_option_changes_the_key(change):
    """The probes of one kernel configuration are never read for another (NALA_GEN_* set differently, or
    ``using``): the options value is part of the key, whether or not this build can run the kernel it names."""
    net = tiny_nalasr()
    before = key_of(net)
    with using(**change):
        assert key_of(net) != before, change
    assert key_of(net) == before


def test_editing_a_kernel_source_changes_the_key(tmp_path):
    """Every source file under the kernels', the attention's and the networks' packages is hashed (a C++ file or a
    new module as much as a listed one)."""
    from pathlib import Path

    import nala_gen.ops

    ops = tmp_path / "ops"
    for path in Path(nala_gen.ops.__file__).parent.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".cpp", ".inc", ".h"):
            target = ops / path.relative_to(Path(nala_gen.ops.__file__).parent)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    before = probe_cache.source_digest([ops])
    assert probe_cache.source_digest([ops]) == before
    kernel = ops / "csrc" / "winograd.cpp"
    kernel.write_text(kernel.read_text() + "\n// an edit\n")
    assert probe_cache.source_digest([ops]) != before
    edited = probe_cache.source_digest([ops])
    (ops / "new_kernel.py").write_text("")
    assert probe_cache.source_digest([ops]) != edited
    source = probe_cache._code_digest()
    assert len(source) == 64 and source == probe_cache._code_digest()
