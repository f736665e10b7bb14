"""Benchmark harness (bench/run.sh). Not imported by the product."""
