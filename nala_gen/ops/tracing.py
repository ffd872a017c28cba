"""Whether code runs under a tracer: the CPU kernels then step aside for the PyTorch ops a graph can hold."""

from __future__ import annotations

import sys

import torch


def tracing() -> bool:
    """Whether the code runs under a tracer (torch.compile, torch.export, torch.onnx.export, torch.jit.trace) rather
    than eagerly: the fused op is then not called, and Python loops over sizes must not be, since a traced graph
    keeps the trip count of the size it was traced at."""
    # torch.onnx is imported lazily, and importing it costs a tenth of a second: an export has imported it already.
    onnx = sys.modules.get("torch.onnx")
    exporting = torch.compiler.is_exporting() or (onnx is not None and onnx.is_in_onnx_export())
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or exporting
