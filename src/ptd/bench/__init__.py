"""Benchmarks that run ptd itself (``ptd bench``)."""
