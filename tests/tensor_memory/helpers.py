"""Tensor Memory's test helpers: tolerances, perturbations, the naive-twin comparison, scan inputs."""
from __future__ import annotations

import torch

from tmem_bench.registry import get_backbone
from tmem_bench.tensor_memory import MemoryState, TensorMemory, TensorMemoryConfig, kernels
from tmem_bench.tensor_memory.naive import naive_twin

TOL = 1e-5
# Eager PyTorch and the C scan; the compiled step, slow to compile, at one small size below.
KERNELS = ["eager", "native"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, the per-tensor relative error."""
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def perturb(module: torch.nn.Module, seed: int = 0, scale: float = 0.2):
    """Move every weight off its initial value so every path (taps, biases) matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    return list(torch.autograd.grad(loss, inputs, allow_unused=True))


def assert_close(names, fast, naive, naive64=None, tol=TOL):
    """Every tensor within `tol` of the naive twin's, relative; where fp32 rounding alone
    keeps a tensor from that (small sums of cancelling terms), the fast value must be
    at least as close to a float64 run of the naive twin as the naive fp32 value is."""
    for name, a, b, b64 in zip(names, fast, naive, naive64 or [None] * len(names)):
        if b is None or not b.abs().max() > 0:
            assert a is None or not a.abs().max() > 0, name
            continue
        err = rel(a, b)
        if err < tol:
            continue
        assert b64 is not None, f"{name}: relative error {err:.2e}"
        fast64, naive64_err = rel(a.double(), b64), rel(b.double(), b64)
        assert fast64 <= max(2 * naive64_err, tol), f"{name}: {err:.2e} to naive, {fast64:.2e} vs {naive64_err:.2e} to fp64"


MEMORY_CASES = [
    dict(batch=1, seq=1, chunk_size=1, grid=6),
    dict(batch=3, seq=7, chunk_size=1, grid=6),
    dict(batch=2, seq=7, chunk_size=2, grid=(3, 4, 5)),  # partial last chunk
    dict(batch=4, seq=9, chunk_size=4, grid=4),
    dict(batch=2, seq=5, chunk_size=3, grid=(2, 1, 3)),  # a grid axis of size 1
    dict(batch=3, seq=8, chunk_size=2, grid=8),
    dict(batch=2, seq=6, chunk_size=1, grid=4, update="pointwise"),
    dict(batch=2, seq=6, chunk_size=2, grid=4, write_mode="hard"),
    dict(batch=2, seq=6, chunk_size=1, grid=(4, 3, 5), coord_heads="separate"),
    dict(batch=2, seq=5, chunk_size=1, grid=4, sigma_scale=0.2),
    dict(batch=37, seq=5, chunk_size=2, grid=3),  # an odd batch (tiling: test_tiled_scan_matches_naive_twin)
]



def check_memory_against_naive_twin(case, kernel, device="cpu"):
    """Reads, final state and the gradients of the input, the initial state and every weight;
    the memory under test runs on `device`, its naive twins on the CPU."""
    case = dict(case)
    B, S = case.pop("batch"), case.pop("seq")
    torch.manual_seed(0)
    memory = TensorMemory(TensorMemoryConfig(**{"d_model": 16, "channels": 4, **case}, kernel=kernel))
    perturb(memory)
    naive = naive_twin(memory)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, S, 16, generator=g, requires_grad=True)
    shape = (B, memory.config.channels, *memory.config.grid)
    h0 = (0.5 * torch.randn(shape, generator=g)).requires_grad_()
    c0 = (0.5 * torch.randn(shape, generator=g)).requires_grad_()
    weight = torch.randn(B, S, 16, generator=g)

    outs = []
    runs = ((memory.to(device), torch.float32, device), (naive, torch.float32, "cpu"),
            (naive_twin(memory).double().cpu(), torch.float64, "cpu"))
    for m, dtype, on in runs:
        xs = [t.detach().to(on, dtype).requires_grad_() for t in (x, h0, c0)]
        read, state = m(xs[0], MemoryState(xs[1], xs[2]))
        loss = (read * weight.to(on, dtype)).sum() + (state.h * state.h.detach()).sum() + state.c.sin().sum()
        outs.append([None if t is None else t.cpu() for t in (read, state.h, state.c, *grads(loss, [*xs, *m.parameters()]))])
    names = ["read", "h_final", "c_final", "x", "h0", "c0", *(n for n, _ in memory.named_parameters())]
    assert_close(names, *outs)

def native_model(**options):
    torch.manual_seed(0)
    model = get_backbone("tensor", 16, 2, 2, dropout=0.0, channels=4, grid=(3, 4, 5), kernel="native", **options)
    perturb(model, scale=0.1)
    return model


def output_and_grads(model, x):
    y = model(x)
    return [y, *grads(y.square().sum(), list(model.parameters()))]


SCAN_INPUTS = ["cz", "uy", "ux", "bvol", "wz", "wy", "wx", "h0", "c0", "taps", "biases", "mix_w", "mix_b"]


def random_scan_inputs(seed: int, N: int, B: int, grid: tuple[int, int, int], C: int) -> list[torch.Tensor]:
    """Dense random inputs of kernels.scan, in SCAN_INPUTS' order."""
    g, (D, H, W) = torch.Generator().manual_seed(seed), grid
    return [0.5 * torch.randn(shape, generator=g) for shape in (
        (B, N, D, C), (B, N, H, C), (B, N, W, C), (H, W, C), (B, N, D), (B, N, H), (B, N, W),
        (B, D, H, W, C), (B, D, H, W, C), (3, 3, C), (3, C), (2 * C, 4 * C), (4 * C,))]


def scan_with_grads(inputs: list[torch.Tensor], kernel: str, factorised: bool = True) -> list[torch.Tensor | None]:
    """The scan's outputs, then every input's gradient of a fixed random projection of them."""
    xs = [t.clone().requires_grad_() for t in inputs]
    outs = kernels.scan(**dict(zip(SCAN_INPUTS, xs)), factorised=factorised, kernel=kernel)
    loss = sum((o * torch.randn(o.shape, generator=torch.Generator().manual_seed(i))).sum() for i, o in enumerate(outs))
    return [*outs, *grads(loss, xs)]
