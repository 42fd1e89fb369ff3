"""Where a cell computes and what computed its numbers: the device a run asks for, the CPU model and
instruction set (on the CPU, numbers differ between them) or the GPU, and moving a batch there."""
from __future__ import annotations

import platform

import torch

from .task import Batch


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def hardware(device: torch.device) -> str:
    """What computed the numbers: on the CPU they differ between vendors and instruction sets (the
    kernels torch dispatches to), so a result names both; on a GPU, its model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()}, {torch.backends.cpu.get_cpu_capability()}"


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
