"""Development support shared by the tests and the benchmarks (not installed)."""
