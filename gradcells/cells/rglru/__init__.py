"""The RG-LRU (De et al. 2024, Griffin and Hawk; recurrentgemma): docs/spec.md §18.3."""
