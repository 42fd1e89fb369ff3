"""Procedural task families, one module per family; `tmem_bench.registry` names them."""
