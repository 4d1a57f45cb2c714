"""Benchmarks of speed, latency and availability."""
