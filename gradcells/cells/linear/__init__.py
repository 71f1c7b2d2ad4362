"""The diagonal linear recurrence ``h_t = a_t∘h_{t-1} + b_t`` as a public op. docs/spec.md §18.1."""
