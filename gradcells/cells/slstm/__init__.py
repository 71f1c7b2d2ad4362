"""xLSTM's sLSTM cell: exponential gating with its stabiliser, heads. docs/spec.md §19."""
