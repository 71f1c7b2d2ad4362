"""The minGRU (Feng et al. 2024), a gated linear recurrence trained by a parallel scan. docs/spec.md §18.2."""
