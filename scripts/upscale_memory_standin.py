"""The upscale engine's memory on a 6000 x 6000 input at x4 (a 24000 x 24000 PNG) under a 512 MiB budget.

NaLaSR would take over an hour on a 2-core CPU at this size, so a stand-in network (one 3x3 convolution and a
pixel shuffle, random weights) runs instead: what is measured is the engine's job (input, tiles, band, resize,
streamed PNG), not the network's activations, which the budget covers through the probes either way. Prints the
process's peak RSS (``ru_maxrss``) against the budget plus the fixed cost (RSS after the libraries, the network
and a warm-up job, less the input). Run: ``python scripts/upscale_memory_standin.py [SIDE] [OUT.png]``.
"""

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from nala_gen.bench.upscale_memory import stand_in_network
from nala_gen.profiling import current_rss
from nala_gen.sr.upscale.engine import Upscaler


def photo_like(side: int) -> np.ndarray:
    small = np.random.default_rng(0).random((side // 8, side // 8, 3)).astype(np.float32)
    return np.round(cv2.resize(small, (side, side), interpolation=cv2.INTER_LINEAR) * 255).astype(np.uint8)


def main() -> int:
    side = int(sys.argv[1]) if len(sys.argv) > 1 else 6000
    budget = 512 * 2**20
    img = photo_like(side)
    engine = Upscaler(stand_in_network(), 4, memory_budget=budget)
    engine.upscale(photo_like(32))  # libraries, thread pools and the network warmed up: the fixed cost
    fixed = current_rss() - img.nbytes
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tmp) / "out.png"
        start = time.perf_counter()
        readout = engine.upscale_to_file(img, out)
        seconds = time.perf_counter() - start
        size = out.stat().st_size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        "side": side,
        "budget_mib": budget / 2**20,
        "fixed_mib": round(fixed / 2**20),
        "peak_mib": round(peak / 2**20),
    }
    result.update(within=peak <= budget + fixed, seconds=round(seconds, 1), png_bytes=size, **readout.as_dict())
    print(json.dumps(result))
    return 0 if result["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
