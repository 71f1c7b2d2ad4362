"""The minGRU (Feng et al. 2024), a gated linear recurrence. docs/spec.md §18.2."""
