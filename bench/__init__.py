"""Benchmarks of the proxy against baselines measured in the same run (see bench/README.md)."""
