"""The CPU kernels' runtime options (nala_gen.ops.options): the environment read once, overridden by ``using``."""

import subprocess
import sys

import pytest

from nala_gen.ops import RuntimeOptions, runtime_options, using
from nala_gen.ops.options import from_environ


def test_each_variable_sets_its_field():
    assert from_environ({}) == RuntimeOptions()
    assert not from_environ({"NALA_GEN_FUSED": "0"}).fused and not from_environ({"NALA_GEN_FUSED": "False"}).fused
    assert from_environ({"NALA_GEN_FUSED_ISA": "AVX2"}).fused_isa == "avx2"
    assert from_environ({"NALA_GEN_FUSED_ISA": "baseline"}).fused_isa == "baseline"
    assert from_environ({"NALA_GEN_FUSED_ISA": "sse"}).fused_isa is None  # an unknown name caps nothing
    assert not from_environ({"NALA_GEN_WINOGRAD": "no"}).winograd
    assert from_environ({"NALA_GEN_COMPILE": "1"}).compile and not from_environ({"NALA_GEN_COMPILE": "0"}).compile
    assert from_environ({"NALA_GEN_WINOGRAD_ISA": "avx2"}).winograd_isa == "avx2"
    assert from_environ({"NALA_GEN_WINOGRAD_ISA": "sse"}).winograd_isa is None


def test_an_unknown_instruction_set_is_refused_in_code():
    with pytest.raises(ValueError, match="fused_isa"):
        RuntimeOptions(fused_isa="sse")
    with pytest.raises(ValueError, match="winograd_isa"):
        RuntimeOptions(winograd_isa="sse")


def test_using_nests_and_restores():
    before = runtime_options()
    with using(fused=False) as outer:
        assert runtime_options() == outer and not outer.fused
        with using(winograd=False) as inner:
            assert not inner.fused and not inner.winograd  # changes apply to the options in force
        assert runtime_options() == outer
        with using(RuntimeOptions(compile=True)):
            assert runtime_options() == RuntimeOptions(compile=True)
    assert runtime_options() == before


def test_the_environment_is_read_once_per_process():
    code = (
        "import os; from nala_gen.ops import runtime_options; first = runtime_options(); "
        "os.environ['NALA_GEN_FUSED'] = '1'; assert runtime_options() is first and not first.fused"
    )
    env = {"NALA_GEN_FUSED": "0", "PATH": ""}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
