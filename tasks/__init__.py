"""Procedural task families, each registered in tmem_bench.registry.TASKS.

Importing map_building also registers the gymnasium environment
`tmem_bench/MapBuilding-v0`.
"""
from . import coordinate_binding, map_building, no_harm, occlusion  # noqa: F401
