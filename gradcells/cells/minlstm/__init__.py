"""The minLSTM (docs/spec.md §18.2; Feng et al. 2024, "Were RNNs All We Needed?")."""
