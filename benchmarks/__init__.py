"""Benchmarks: quality on LoCoMo, speed on synthetic stores, and the stores they make."""
