"""Benchmark harness for colauto: `python -m bench.run`."""
