"""Procedural task families, each registered in tmem_bench.registry.TASKS."""
from . import coordinate_binding  # noqa: F401
