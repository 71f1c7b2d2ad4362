"""The GRU cell (TensorFlow's block cell and the reset-after variant of cuDNN, PyTorch and
Keras). docs/spec.md §3."""
