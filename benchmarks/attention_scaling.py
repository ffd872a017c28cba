"""Attention latency and peak memory vs tokens; same as ``nala-bench attention``. See its --help."""

import sys

from nala_gen.bench.attention_scaling import main

if __name__ == "__main__":
    sys.exit(main())
