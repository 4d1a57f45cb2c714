"""Models: their runtime (the single-writer learner task), the registry, the schemas."""
