"""Benchmarks and the demo."""
