#!/usr/bin/env bash
# SR cost vs tokens on a CUDA GPU: NaLaSR-light, ESRT, SwinIR-light, x4, fp32, batch 1, each point a fresh
# process; CUDA-synchronised median latency and torch.cuda.max_memory_allocated. Writes
# benchmarks/results/sr_scaling_cuda.{json,png} (the CPU run's format) and the attention-only figures.
# Sized for under eight minutes on one H200. Run from the repository root: bash benchmarks/gpu_check.sh
set -euo pipefail
PY=${PY:-python}
$PY - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device: this script is for a GPU machine"
print("GPU:", torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
PY
# 64x64 .. 256x280 (71,680 tokens, the paper's 70K+ point) .. 512x512 (262,144 tokens)
timeout 240 $PY -m nala_gen.bench.cli sr --device cuda --tag cuda --repeats 5 \
    --sizes 64x64 128x128 192x192 256x280 320x320 384x384 512x512
# The attention op alone, forward and backward: NaLa (eager and torch.compile-fused map; the C++ op is CPU-only),
# ReLU linear attention and SDPA, up to 262,144 tokens.
timeout 240 $PY -m nala_gen.bench.cli attention --device cuda --tag cuda --backward --repeats 5 \
    --methods nala nala_compiled relu softmax_sdpa --sizes 4096 16384 71680 262144
