"""What the models' tests share: tiny sizes, a backbone built at them, inputs, and the C compiler."""
from __future__ import annotations

import os
import shutil
import sysconfig

import torch
import torch.nn as nn

from tmem_bench.registry import backbone_names, get_backbone

D, LAYERS, HEADS, S = 16, 2, 2, 16
NAMES = backbone_names()
BUILTIN = (
    "base", "base_wide", "slots", "local", "linear", "xl", "registers", "lstm", "delta", "ssm", "tensor", "tensor_local",
)
# Tensor Memory is the slow one: the smallest memory that still exercises every part.
_TINY_MEMORY = {"channels": 2, "grid": 3, "kernel": "eager"}  # eager: compiling the scan costs ~30 s per process
TINY = {"tensor": _TINY_MEMORY, "tensor_local": _TINY_MEMORY, "base_wide": _TINY_MEMORY}


def build(name: str, seed: int = 0, **options) -> nn.Module:
    torch.manual_seed(seed)
    return get_backbone(name, d_model=D, n_layers=LAYERS, n_heads=HEADS, **{**TINY.get(name, {}), **options})


def inputs(batch: int = 2, seq_len: int = S, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, seq_len, D, generator=torch.Generator().manual_seed(seed))


def bump() -> torch.Tensor:
    """A change of one token that LayerNorm cannot remove (a constant shift it would)."""
    return torch.randn(D, generator=torch.Generator().manual_seed(7))


def query_blocked(seq_len: int = S) -> torch.Tensor:
    """The memory-forcing shape: the last 4 positions may not attend to the first half."""
    blocked = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    blocked[-4:, : seq_len // 2] = True
    return blocked


def c_compiler() -> str | None:
    """The C compiler setuptools would build the extension with, if this machine has it."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(cc.split()[0])
