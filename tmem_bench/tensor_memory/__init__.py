"""Tensor Memory, one package: read `layer` first (the memory in the paper's order).

- `layer`: the memory (`TensorMemory`), its configs and the `tensor` models;
- `kernels`: which scan runs (`auto`: native on the CPU where measured faster, the
  fused Triton scan on CUDA, else the compiled step, else eager) and `scan`, the one
  entry to it;
- `step`, `torch_scan`: the step's maths and its hand-written backward, and the
  scan that loops them in PyTorch (torch.compile'd, falling back to eager);
- `native`, `native_scan`, `_scan.c`: the C scan, its ctypes loader and its
  autograd Function;
- `triton_scan`: the GPU's scan, one fused Triton kernel per direction and its
  autograd Function (imported only where it is chosen);
- `naive`: the naive twin, the plain per-step loop every kernel must match;
- `params`: the tensor model's parameter count, which baselines are matched to.

The generic memory-beside-attention transformer it plugs into is `tmem_bench.contracts.memory`.
"""
from .layer import MemoryState, TensorConfig, TensorMemory, TensorMemoryConfig, tensor, tensor_local

__all__ = ["MemoryState", "TensorConfig", "TensorMemory", "TensorMemoryConfig", "tensor", "tensor_local"]
