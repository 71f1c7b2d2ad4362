"""Mamba's selective scan (Gu and Dao 2023) as a public op. docs/spec.md §18.4."""
