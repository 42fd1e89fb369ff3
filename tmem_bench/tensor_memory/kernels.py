"""Which Tensor Memory scan runs, and the one entry to it (`scan`).

Three implementations of one function: the PyTorch scan (`torch_scan`, the step
torch.compile'd, or eager), the C scan (`native_scan`) and the fused Triton scan
(`triton_scan`, the GPU's). All take the write volume and the read weights as 1D
factors (the caller convolves the write's factors outside the loop), so none forms a
volume it does not need.

On CUDA in float32 "auto" takes the Triton scan (kernel "triton"), one launch per
layer and direction, where Triton can be imported (`pip install -e '.[gpu]'`; the CUDA
builds of PyTorch on Linux bring it); without it "auto" takes the compiled step, as
before, and says so once. Kernel "triton" on CPU tensors runs only under Triton's
interpreter (TRITON_INTERPRET=1, set before the first scan), which is how it is tested.

On CPU in float32 the whole scan can run in `_scan.c` (kernel "native"), built by
`pip install` as an optional extension for the instruction set of the machine that
builds it (its variant: avx512, avx2 or generic; see `native.py`): one C call per
direction, each sequence's recurrence kept in cache from its first step to its last,
every volume formed from its factors in C. "auto" takes it where its variant is one
of AUTO_NATIVE_VARIANTS. Elsewhere, and wherever the extension is not built (no C
compiler, no OpenMP, an uninstalled checkout) or is switched off with
TMEM_BENCH_NO_NATIVE=1, "auto" takes the compiled step, and eager PyTorch where
compilation fails. A stale build (its interface version is not INTERFACE_VERSION)
is never called: "auto" warns and falls back the same way.
"""
from __future__ import annotations

import functools
import os
import warnings

import torch

from .native import native_status, native_variant
from .native_scan import NativeScan
from .torch_scan import TensorMemoryScan, compiled_available

KERNELS = ("auto", "native", "triton", "compiled", "eager")


# The native variants that `auto` takes: those measured faster than the compiled step
# (benchmarks/bench_tensor_step.py, results in benchmarks/results/tensor_step_*.json;
# sse against a compiled step that still had AVX2, which a CPU without AVX2 lacks too).
# A build's variant is fixed when it is compiled, so a machine always makes the same
# choice. The generic variant (ARM and anything else) has not been measured, so there
# "auto" takes the compiled step.
AUTO_NATIVE_VARIANTS = ("avx512", "avx2", "sse")


@functools.cache
def triton_status() -> tuple[type | None, str]:
    """The Triton scan's autograd Function, or None and why it cannot be had here."""
    try:
        from .triton_scan import TritonScan
    except ImportError as e:
        return None, f"needs Triton, which cannot be imported here ({e}); pip install -e '.[gpu]' on Linux"
    return TritonScan, ""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


@functools.cache
def _say_no_triton(why: str) -> None:
    warnings.warn(f"Tensor Memory's fused GPU scan {why}; running the compiled PyTorch step on CUDA instead")


def resolve_kernel(kernel: str, *tensors: torch.Tensor) -> str:
    """The kernel a scan over `tensors` runs with: native, triton, compiled or eager
    ("auto" where the PyTorch path decides between the last two)."""
    float32 = all(t.dtype == torch.float32 for t in tensors)
    cuda = all(t.device.type == "cuda" for t in tensors)
    if kernel == "triton":
        if not (float32 and (cuda or (_interpreting() and all(t.device.type == "cpu" for t in tensors)))):
            found = sorted({f"{t.dtype} on {t.device}" for t in tensors})
            raise RuntimeError(f"the triton Tensor Memory kernel runs float32 on CUDA (or on CPU under "
                               f"TRITON_INTERPRET=1), got {', '.join(found)}")
        module, why = triton_status()
        if module is None:
            raise RuntimeError(f"the triton Tensor Memory kernel {why}; use kernel auto, compiled or eager")
        return "triton"
    if kernel == "auto" and cuda and float32:
        module, why = triton_status()
        if module is not None:
            return "triton"
        _say_no_triton(why)
    native_ok = all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    if kernel == "native":
        if not native_ok:
            found = sorted({f"{t.dtype} on {t.device}" for t in tensors})
            raise RuntimeError(f"the native Tensor Memory kernel runs float32 on CPU only, got {', '.join(found)}")
        lib, why = native_status()
        if lib is None:
            raise RuntimeError(f"the native Tensor Memory kernel {why}; use kernel auto, compiled or eager")
        return "native"
    if kernel == "auto" and native_ok and native_variant() in AUTO_NATIVE_VARIANTS:
        return "native"
    return kernel


def kernel_that_runs(kernel: str, *tensors: torch.Tensor) -> str:
    """What a scan over `tensors` asked to run `kernel` runs now, for the record:
    "native (<variant>)", "triton", "compiled" or "eager"."""
    kernel = resolve_kernel(kernel, *tensors)
    if kernel == "native":
        return f"native ({native_variant()})"
    if kernel == "auto":
        return "compiled" if compiled_available() else "eager"
    return kernel


def scan(*, cz: torch.Tensor, uy: torch.Tensor, ux: torch.Tensor, bvol: torch.Tensor, wz: torch.Tensor,
         wy: torch.Tensor, wx: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, taps: torch.Tensor,
         biases: torch.Tensor, mix_w: torch.Tensor, mix_b: torch.Tensor, factorised: bool,
         kernel: str = "auto", output_final_state: bool = True
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The Tensor Memory recurrence over N steps: each step reads the state at its read
    point, then writes its volume through the gated update.

    Args:
        cz (torch.Tensor):
            the write volume's D factor, of shape `[B, N, D, C]`: step n writes
            `cz[d] * uy[h] * ux[w] + bvol[h, w]` into cell (d, h, w), the write already
            through the convs' write half where factorised.
        uy (torch.Tensor):
            the write volume's H factor, of shape `[B, N, H, C]`.
        ux (torch.Tensor):
            the write volume's W factor, of shape `[B, N, W, C]`.
        bvol (torch.Tensor):
            the write volume's part from the convs' biases, of shape `[H, W, C]`.
        wz (torch.Tensor):
            the read weights' D factor, of shape `[B, N, D]`; cell (d, h, w) weighs
            `wz[d] * wy[h] * wx[w]`.
        wy (torch.Tensor):
            the read weights' H factor, of shape `[B, N, H]`.
        wx (torch.Tensor):
            the read weights' W factor, of shape `[B, N, W]`.
        h0 (torch.Tensor):
            the initial hidden state, channel-last, of shape `[B, D, H, W, C]`.
        c0 (torch.Tensor):
            the initial cell state, of shape `[B, D, H, W, C]`.
        taps (torch.Tensor):
            the state's depthwise 3-tap convs along D, H, W, of shape `[3, 3, C]`
            (axis, tap, channel).
        biases (torch.Tensor):
            those convs' biases, of shape `[3, C]`.
        mix_w (torch.Tensor):
            the pointwise mix from [write, state] to the gates (i, f, o, g), of shape `[2C, 4C]`.
        mix_b (torch.Tensor):
            the mix's bias, of shape `[4C]`.
        factorised (bool):
            whether the state goes through the three convs (taps, biases) before the mix;
            if False they are unused.
        kernel (str):
            "native" (`_scan.c`, float32 on CPU), "triton" (fused, float32 on CUDA),
            "compiled" (torch.compile'd step), "eager", or "auto" (native on CPU where its
            variant is in AUTO_NATIVE_VARIANTS, triton on CUDA where Triton imports, else
            compiled, else eager).
            Default: "auto".
        output_final_state (bool):
            whether to return the final state; without it, the native scan skips the last
            step's write, which nothing else sees.
            Default: True.

    Returns:
        reads (torch.Tensor):
            each step's read of the state before its own write, of shape `[B, N, C]`.
        hN, cN (torch.Tensor | None):
            the final hidden and cell states, of shape `[B, D, H, W, C]`; None without
            output_final_state.
    """
    args = (cz, uy, ux, bvol, wz, wy, wx, h0, c0, taps, biases, mix_w, mix_b)
    kernel = resolve_kernel(kernel, *args)
    # Only a scan that autograd will differentiate keeps each step's state and gates (the
    # native scan: 1.3 GB per layer at the evaluation batch of 512). Inside a Function's
    # forward this is no longer visible: grad mode is off there, and needs_input_grad
    # stays True under torch.no_grad.
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in args)
    if kernel == "native":
        reads, hN, cN = NativeScan.apply(*args, factorised, keep, output_final_state)
    elif kernel == "triton":
        reads, hN, cN = triton_status()[0].apply(*args, factorised, keep)
    else:
        cyz = cz[:, :, :, None] * uy[:, :, None]  # (B, N, D, H, C)
        w3 = wz[..., :, None, None] * wy[..., None, :, None] * wx[..., None, None, :]  # (B, N, D, H, W)
        reads, hN, cN = TensorMemoryScan.apply(
            cyz.transpose(0, 1).contiguous(), ux.transpose(0, 1).contiguous(), bvol, w3.transpose(0, 1).contiguous(),
            h0, c0, taps, biases, mix_w, mix_b, factorised, kernel, keep)
        reads = reads.transpose(0, 1)
    return (reads, hN, cN) if output_final_state else (reads, None, None)
