"""Benchmarks reachable as ``nala-bench``; the scripts in ``benchmarks/`` call these."""
