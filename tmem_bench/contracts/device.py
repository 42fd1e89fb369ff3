"""Where a cell computes and what computed its numbers: the device a run asks for, the CPU model and
instruction set (on the CPU, numbers differ between them) or the GPU, and moving a batch there."""
from __future__ import annotations

import platform
from contextlib import contextmanager

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


def eval_chunk(device: torch.device) -> int:
    """Sequences per forward pass where nothing is trained (evaluation, probes): on a GPU as many as
    keep it busy; on the CPU a batch whose activations stay near the cores' caches, which also keeps
    the CPU numbers those of every earlier run."""
    return 4096 if device.type == "cuda" else 512


@contextmanager
def matmul_precision(tf32: bool):
    """CUDA's float32 matrix products and convolutions in TF32 while inside, as they were after."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def to_device(batch: Batch, device: str | torch.device) -> Batch:
    """The batch on `device`. To a GPU through pinned memory: a copy from pageable memory waits for
    the work queued before it, which would make every step wait for the last."""
    device = torch.device(device)
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: (v.pin_memory() if v.device.type == "cpu" else v).to(device, non_blocking=True) for k, v in batch.items()}
