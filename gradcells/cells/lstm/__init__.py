"""The LSTM cell (TensorFlow's block cell, gate layout i, ci, f, o) with its options:
peepholes, the projection (LSTMP) and the layer norm. docs/spec.md §2, §9.1, §9.2."""
