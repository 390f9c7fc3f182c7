"""Benchmarks: the paper's Table 5 (`python -m world_model.benchmark`), the attention family, training speed."""
