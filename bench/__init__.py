"""Benchmarks, each reported as a ratio against a side-by-side baseline (`make bench`)."""
