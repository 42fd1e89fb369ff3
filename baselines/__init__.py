"""Attention baselines, each registered in tmem_bench.registry.BACKBONES."""
from . import transformer  # noqa: F401
