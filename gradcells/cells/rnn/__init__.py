"""The plain (Elman) RNN cell, tanh or relu. docs/spec.md §9.3."""
