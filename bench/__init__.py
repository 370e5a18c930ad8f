"""Maintained benchmarks and their results file (bench/results.jsonl, see bench/results.py)."""
