"""Attention baselines, each registered in tmem_bench.registry.BACKBONES."""
from . import transformer  # noqa: F401
from . import linear, lstm, registers, slots, wide, xl  # noqa: F401
