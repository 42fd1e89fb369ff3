"""Tensor Memory's fused Triton scan (triton_scan.py) against the eager twin: outputs, final
state and every gradient, on CUDA where there is one and otherwise under Triton's
interpreter on CPU tensors; and how `auto` chooses it."""
from __future__ import annotations

import os
import types
import warnings

import pytest
import torch

CUDA = torch.cuda.is_available()  # without it tests/conftest.py has chosen Triton's interpreter
pytest.importorskip("triton", reason="the fused scan needs Triton (pip install -e '.[gpu]', Linux)")

from tests.tensor_memory.helpers import (SCAN_INPUTS, TOL, check_memory_against_naive_twin, random_scan_inputs, rel,
                                         scan_with_grads)
from tmem_bench.tensor_memory import kernels

DEVICE = "cuda" if CUDA else "cpu"
NAMES = ["reads", "hN", "cN", *(f"d_{n}" for n in SCAN_INPUTS)]

# (grid, channels, batch, steps, factorised): grids 4, 6 and 8 and an uneven one, both updates,
# batch 1 and odd batches, N=1 and N=50; channels below 16 and not a power of two pad the tiles.
CASES = [
    ((4, 4, 4), 16, 1, 50, True),
    ((6, 6, 6), 16, 3, 7, True),
    ((6, 6, 6), 16, 5, 1, False),
    ((8, 8, 8), 16, 1, 3, True),
    ((8, 8, 8), 8, 3, 2, False),
    ((3, 4, 5), 6, 3, 5, True),
    ((2, 1, 3), 4, 2, 4, True),
]


def _on_device(inputs):
    return [t.to(DEVICE) for t in inputs]


@pytest.mark.parametrize("grid,C,B,N,factorised", CASES)
def test_triton_scan_matches_the_eager_scan(grid, C, B, N, factorised):
    inputs = random_scan_inputs(11, N=N, B=B, grid=grid, C=C)
    eager = scan_with_grads(inputs, "eager", factorised)
    fused = scan_with_grads(_on_device(inputs), "triton", factorised)
    for name, a, b in zip(NAMES, eager, fused):
        if not factorised and name in ("d_taps", "d_biases"):
            assert not b.abs().max() > 0, name  # the pointwise update never reads the convs
            continue
        assert rel(b.cpu(), a) < TOL, (name, rel(b.cpu(), a))


def test_triton_scan_with_only_some_outputs_used():
    """Gradients that reach only the reads (no final state), or only the final cell state."""
    inputs = _on_device(random_scan_inputs(12, N=4, B=2, grid=(3, 4, 5), C=8))
    for pick in (lambda r, h, c: r.square().sum(), lambda r, h, c: c.sin().sum()):
        results = []
        for kernel, xs in (("eager", [t.cpu() for t in inputs]), ("triton", inputs)):
            xs = [t.clone().requires_grad_() for t in xs]
            outs = kernels.scan(**dict(zip(SCAN_INPUTS, xs)), factorised=True, kernel=kernel)
            results.append(torch.autograd.grad(pick(*outs), xs, allow_unused=True))
        for name, a, b in zip(SCAN_INPUTS, *results):
            if a is None or not a.abs().max() > 0:
                assert b is None or not b.abs().max() > 0, name
            else:
                assert rel(b.cpu(), a) < TOL, name


def test_triton_scan_without_grad_keeps_nothing():
    """Under no_grad the forward saves no step states and gives the same reads and final state."""
    inputs = _on_device(random_scan_inputs(13, N=3, B=2, grid=(4, 4, 4), C=16))
    with torch.no_grad():
        a = kernels.scan(**dict(zip(SCAN_INPUTS, inputs)), factorised=True, kernel="triton")
    b = kernels.scan(**dict(zip(SCAN_INPUTS, [t.clone().requires_grad_() for t in inputs])), factorised=True,
                     kernel="triton")
    for x, y in zip(a, b):
        assert torch.equal(x, y.detach())


def test_tensor_memory_through_triton_matches_its_naive_twin():
    """The whole memory (chunking, coordinates, read-out) with the fused scan, against the
    nn.Conv3d / grid_sample loop."""
    check_memory_against_naive_twin(dict(batch=3, seq=5, chunk_size=2, grid=(3, 4, 5)), kernel="triton",
                                    device=DEVICE)


def _fake(device: str, dtype=torch.float32):
    """What resolve_kernel reads of a tensor (its device and dtype), with no CUDA here."""
    return types.SimpleNamespace(device=torch.device(device), dtype=dtype)


def test_auto_takes_triton_on_cuda_float32_only(monkeypatch):
    monkeypatch.setattr(kernels, "triton_status", lambda: (object(), ""))
    assert kernels.resolve_kernel("auto", _fake("cuda"), _fake("cuda")) == "triton"
    assert kernels.resolve_kernel("auto", _fake("cuda", torch.float64)) == "auto"
    assert kernels.resolve_kernel("auto", torch.zeros(2)) != "triton"  # the CPU keeps its choice


def test_auto_without_triton_falls_back_and_says_so_once(monkeypatch):
    monkeypatch.setattr(kernels, "triton_status", lambda: (None, "needs Triton, which cannot be imported here"))
    kernels._say_no_triton.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert kernels.resolve_kernel("auto", _fake("cuda")) == "auto"
    assert len(caught) == 1 and "compiled PyTorch step" in str(caught[0].message)
    with pytest.raises(RuntimeError, match="^the triton Tensor Memory kernel needs Triton") as e:
        kernels.resolve_kernel("triton", _fake("cuda"))
    assert "\n" not in str(e.value)


def test_triton_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="runs float32 on CUDA"):
        kernels.resolve_kernel("triton", torch.zeros(2))


COMPILE = """
import inspect, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tmem_bench.tensor_memory import triton_scan as ts

PB, CB, warps = ts._blocks(6, 6, 6, 16)
shape = dict(D=6, H=6, W=6, C=16, PB=PB, CB=CB, FACTORISED=True)
for fn, flags in ((ts._scan_forward, dict(KEEP=True)), (ts._scan_backward, dict(HAS_DH=True, HAS_DC=True))):
    params = list(inspect.signature(fn.fn).parameters)
    consts = {**shape, **flags}
    signature = {p: "constexpr" if p in consts else "i32" if p == "N" else "*fp32" for p in params}
    source = ASTSource(fn=fn, signature=signature, constexprs={(params.index(k),): v for k, v in consts.items()})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    assert kernel.asm["cubin"], fn.__name__
print("compiled")
"""


@pytest.mark.skipif(CUDA, reason="on a GPU the tests above compile and run the kernels")
def test_the_kernels_compile_for_a_hopper_gpu_without_one():
    """The interpreter runs what a GPU would, but not Triton's compiler: both kernels are compiled
    here for sm_90 with Triton's own ptxas, no device needed, so CI catches what only a GPU's
    first call would."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
