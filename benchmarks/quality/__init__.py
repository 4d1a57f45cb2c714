"""Quality benchmarks: how well the learned metrics verify and classify."""
