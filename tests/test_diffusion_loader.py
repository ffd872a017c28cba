"""diffusers' generic loader on our folders: ``DiffusionPipeline.from_pretrained`` in a fresh process."""

import json
import subprocess
import sys

import pytest
import torch

from nala_gen.diffusion import NaLaDiTPipeline, NaLaDiTTransformer2DModel
from nala_gen.diffusion.pipeline import LOADER_CODE
from nala_gen.weights import resolve

SHIPPED = [
    "naladit-digits",
    "naladit-digits-block",
    "nalasit-digits",
    "naladit-digits-softmax",
    "naladit-digits-softmax-block",
]

# Run in a fresh interpreter that never imports nala_gen itself: only diffusers and the folder.
GENERIC = """
import sys, torch
from diffusers import DiffusionPipeline
pipe = DiffusionPipeline.from_pretrained(sys.argv[1], trust_remote_code=True)
images = pipe([1, 2], num_inference_steps=3, output_type="pt", generator=torch.Generator().manual_seed(0)).images
print(type(pipe).__module__, type(pipe).__name__, tuple(images.shape), "nala_gen" in sys.modules)
"""


def generic_load(folder):
    env_proc = subprocess.run(
        [sys.executable, "-c", GENERIC, str(folder)],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert env_proc.returncode == 0, env_proc.stderr[-2000:]
    return env_proc.stdout.split()


@pytest.mark.parametrize("name", SHIPPED)
def test_the_generic_loader_loads_every_shipped_folder(name):
    folder = resolve(name).payload
    module, cls, *shape_and_flag = generic_load(folder)
    assert (module, cls) == ("nala_gen.diffusion.pipeline", "NaLaDiTPipeline")
    assert shape_and_flag[-1] == "True"  # diffusers imported our package through the folder's pipeline.py


def test_a_saved_pipeline_loads_generically_and_ours_needs_no_trust_argument(tmp_path):
    from diffusers import DDIMScheduler, DiffusionPipeline

    torch.manual_seed(0)
    model = NaLaDiTTransformer2DModel.from_size("tiny", sample_size=8, in_channels=1, num_classes=3, learn_sigma=False)
    NaLaDiTPipeline(model, DDIMScheduler(), id2label={0: "a", 1: "b", 2: "c"}).save_pretrained(tmp_path)
    assert (tmp_path / "pipeline.py").read_text() == LOADER_CODE
    assert json.loads((tmp_path / "model_index.json").read_text())["_class_name"] == ["pipeline", "NaLaDiTPipeline"]
    assert generic_load(tmp_path)[:2] == ["nala_gen.diffusion.pipeline", "NaLaDiTPipeline"]
    # Without trust_remote_code diffusers refuses, and its message names the argument that works.
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        DiffusionPipeline.from_pretrained(tmp_path)
    loaded = NaLaDiTPipeline.from_pretrained(tmp_path)  # our class: the file is ours, so no argument is needed
    assert loaded.id2label == {0: "a", 1: "b", 2: "c"}
    (tmp_path / "pipeline.py").write_text(LOADER_CODE + "import os\n")  # anything else is not run
    with pytest.raises(ValueError, match="not the file nala_gen writes"):
        NaLaDiTPipeline.from_pretrained(tmp_path)
