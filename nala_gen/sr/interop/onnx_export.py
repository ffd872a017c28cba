"""SR networks as ONNX: export with a dynamic height and width, check against PyTorch, run with onnxruntime.

    nala-sr export-onnx nalasr-light-x4 -o nalasr-light-x4.onnx

What is exported is what the network runs in inference (its ``inference_form()``): for NaLaSR its fast form
(:mod:`~nala_gen.sr.archs.fast`: its folded and composed layers, as PyTorch runs it; the NaLa op as plain tensor
ops, one step over all tokens), not its training layers; with ``fast_inference`` off, its layers. The export goes
through ``torch.onnx.export(dynamo=True)`` (torch.export, then onnxscript), so any input size runs; the file is
checked with onnxruntime on three sizes (one of odd sides, one of more tokens than the attention's eager chunk: a
traced loop over chunks would keep the traced size's count) before it is written in place. ESRT does not export:
its split softmax cuts the tokens into N // 4 segments, a loop whose length the exported graph fixes at the traced
size (it then fails on other sizes), so only NaLaSR is offered.
:class:`OnnxSR` wraps an onnxruntime session as a module, so the tiled upscaler (and its benchmark) can drive it
exactly as it drives the PyTorch network.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nala_gen.fileio import temporary_beside

CHECK_SIZES = ((32, 40), (27, 51), (72, 80))  # (height, width) of the parity check's inputs; the first is traced


class OnnxSR(nn.Module):
    """An ONNX super-resolution network run by onnxruntime: (B, 3, h, w) -> (B, 3, sh, sw), float32 on the CPU."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        super().__init__()
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = x.detach().float().contiguous().cpu().numpy()
        return torch.from_numpy(self.session.run(None, {self.input_name: image})[0])


def parity(model: nn.Module, path: str | Path, sizes=CHECK_SIZES, seed: int = 0) -> float:
    """Largest |onnxruntime - PyTorch| over random inputs of ``sizes``."""
    generator = torch.Generator().manual_seed(seed)
    runtime = OnnxSR(path)
    worst = 0.0
    for h, w in sizes:
        x = torch.rand(1, 3, h, w, generator=generator)
        with torch.no_grad():
            worst = max(worst, float((runtime(x) - model(x)).abs().max()))
    return worst


def export_onnx(model: nn.Module, path: str | Path, tolerance: float = 1e-4) -> float:
    """Export ``model`` to ``path`` (dynamic height and width), check it, then move it into place.

    Returns the parity error; raises ValueError, leaving ``path`` untouched, when it exceeds ``tolerance``.
    """
    path = Path(path)
    model = model.eval()
    # NaLaSR's fast form is exported as the module it is: traced, the network's own forward runs its layers
    form = getattr(model, "inference_form", None)
    graph = model if form is None else form()
    height, width = torch.export.Dim("height", min=8, max=8192), torch.export.Dim("width", min=8, max=8192)
    with torch.no_grad():
        program = torch.onnx.export(
            graph,
            (torch.rand(1, 3, *CHECK_SIZES[0]),),
            dynamo=True,
            dynamic_shapes={"x": {2: height, 3: width}},
            input_names=["image"],
            output_names=["upscaled"],
            optimize=False,  # onnxruntime optimises the graph itself; onnxscript's pass fails on ESRT's fold
            verbose=False,
        )
    with temporary_beside(path) as (fd, tmp):
        os.close(fd)
        program.save(str(tmp))
        try:
            error = parity(model, str(tmp))
        except Exception as err:  # onnxruntime's own errors: the export does not hold at another size
            raise ValueError(f"the ONNX model fails at another input size ({str(err).splitlines()[0][:200]})") from None
        if not np.isfinite(error) or error > tolerance:
            raise ValueError(f"the ONNX model differs from PyTorch by {error:.2e} (over {tolerance:g}); not written")
        os.replace(tmp, path)
    return error
