"""Tensor Memory: the fast path against its naive twin, causality, gates, settings."""
from __future__ import annotations

import ctypes
import os
import platform
import re
import subprocess
import sysconfig
import tomllib
import types
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from tests.models.helpers import c_compiler
from tmem_bench.diagnostics.causality import causality_probe
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import make_plan
from tmem_bench.registry import get_backbone
from tmem_bench.tensor_memory import (MemoryState, TensorMemory, TensorMemoryConfig, kernels, native, native_scan,
                                      torch_scan)
from tmem_bench.tensor_memory.naive import naive_twin

TOL = 1e-5
# Eager PyTorch and the C scan; the compiled step, slow to compile, at one small size below.
KERNELS = ["eager", "native"]


@pytest.fixture(autouse=True)
def _native_built(request):
    """A native-kernel test fails where the extension is missing or stale although a C
    compiler is there to build it (`pip install -e .`); without a compiler, or with
    TMEM_BENCH_NO_NATIVE=1, it is skipped and the fallback tests below still run."""
    kernel = getattr(request.node, "callspec", None) and request.node.callspec.params.get("kernel")
    if kernel != "native":
        return
    library, why = native.native_status()
    if library is None:
        if os.environ.get("TMEM_BENCH_NO_NATIVE", "") not in ("", "0"):
            pytest.skip("TMEM_BENCH_NO_NATIVE is set")
        if c_compiler() is None:
            pytest.skip("no C compiler here, so no native extension")
        pytest.fail(f"the native Tensor Memory kernel {why}")


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


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", MEMORY_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_memory_matches_naive_twin(case, kernel):
    check_memory_against_naive_twin(case, kernel)


def test_compiled_matches_naive_twin():
    """The torch.compile'd step (inductor) at one small shape: one compilation of each step."""
    check_memory_against_naive_twin(dict(batch=3, seq=5, chunk_size=2, grid=(2, 3, 4)), "compiled")


def check_memory_against_naive_twin(case, kernel):
    """Reads, final state and the gradients of the input, the initial state and every weight."""
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
    for m, dtype in ((memory, torch.float32), (naive, torch.float32), (naive_twin(memory).double(), torch.float64)):
        xs = [t.detach().to(dtype).requires_grad_() for t in (x, h0, c0)]
        read, state = m(xs[0], MemoryState(xs[1], xs[2]))
        loss = (read * weight.to(dtype)).sum() + (state.h * state.h.detach()).sum() + state.c.sin().sum()
        outs.append([read, state.h, state.c, *grads(loss, [*xs, *m.parameters()])])
    names = ["read", "h_final", "c_final", "x", "h0", "c0", *(n for n, _ in memory.named_parameters())]
    assert_close(names, *outs)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("threading", ["per_layer", "reference"])
@pytest.mark.parametrize("batch,seq,chunk_size", [(2, 7, 1), (3, 9, 2), (1, 5, 4)])
def test_backbone_matches_naive_twin(threading, batch, seq, chunk_size, kernel):
    torch.manual_seed(0)
    model = get_backbone("tensor", 16, 2, 2, dropout=0.0, channels=4, grid=(3, 4, 5), chunk_size=chunk_size,
                         threading=threading, kernel=kernel)
    perturb(model, scale=0.1)
    naive = naive_twin(model)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, seq, 16, generator=g)
    weight = torch.randn(batch, seq, 16, generator=g)
    outs = []
    for m, dtype in ((model, torch.float32), (naive, torch.float32), (naive_twin(model).double(), torch.float64)):
        y = m(x.to(dtype))
        outs.append([y, *grads((y * weight.to(dtype)).sum(), list(m.parameters()))])
    assert_close(["output", *(n for n, _ in model.named_parameters())], *outs)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("channels", [16, 8, 6])
def test_paper_sized_gradients_against_float64(kernel, channels):
    """6^3, 24 tokens, the paper's 16 channels, the ablation's 8, and 6 (the C kernel's
    generic, non-vector-multiple path): fast and naive fp32 both against a float64 naive run."""
    torch.manual_seed(0)
    memory = TensorMemory(TensorMemoryConfig(d_model=32, channels=channels, grid=6, kernel=kernel))
    perturb(memory, scale=0.1)
    x = torch.randn(8, 24, 32, generator=torch.Generator().manual_seed(3))
    weight = torch.randn_like(x)
    results = {}
    for name, m, dtype in (("fast", memory, torch.float32), ("naive", naive_twin(memory), torch.float32),
                           ("naive64", naive_twin(memory).double(), torch.float64)):
        xi = x.to(dtype).requires_grad_()
        read, state = m(xi)
        loss = (read * weight.to(dtype)).sum() + state.h.sum()
        results[name] = [t.double() for t in grads(loss, [xi, *m.parameters()])]
    names = ["x", *(n for n, _ in memory.named_parameters())]
    fast_err = max(rel(a, b) for a, b in zip(results["fast"], results["naive64"]))
    naive_err = max(rel(a, b) for a, b in zip(results["naive"], results["naive64"]))
    assert_close(names, results["fast"], results["naive"], results["naive64"])
    assert fast_err < max(2 * naive_err, TOL), (fast_err, naive_err)


def test_batch_tiles():
    assert torch_scan.batch_tiles(37, 16) == [(0, 12), (12, 24), (24, 37)]
    assert torch_scan.batch_tiles(16, 16) == [(0, 16)]
    assert torch_scan.batch_tiles(1, 16) == [(0, 1)]


@pytest.mark.parametrize("tile", [1, 2, 3])
def test_tiled_scan_matches_naive_twin(monkeypatch, tile):
    monkeypatch.setattr(torch_scan, "BATCH_TILE", tile)
    torch.manual_seed(0)
    model = get_backbone("tensor", 16, 2, 2, dropout=0.0, channels=4, grid=3, threading="reference", kernel="eager")
    perturb(model, scale=0.1)
    x = torch.randn(5, 6, 16, generator=torch.Generator().manual_seed(4))
    outs = []
    for m, dtype in ((model, torch.float32), (naive_twin(model), torch.float32), (naive_twin(model).double(), torch.float64)):
        y = m(x.to(dtype))
        outs.append([y, *grads(y.square().sum(), list(m.parameters()))])
    assert_close(["output", *(n for n, _ in model.named_parameters())], *outs)


def test_causality_probe_flags_reference_threading():
    verdicts = {}
    for threading in ("per_layer", "reference"):
        model = get_backbone("tensor", 16, 2, 2, channels=4, grid=4, threading=threading, kernel="eager")
        verdicts[threading] = causality_probe(model, 16, 12)["verdict"]
    assert verdicts == {"per_layer": "causal", "reference": "leaking"}


@pytest.mark.parametrize("name,chunk_size", [("tensor", 3), ("tensor_local", 1)])
def test_causal_with_chunks_and_window(name, chunk_size):
    model = get_backbone(name, 16, 2, 2, channels=4, grid=4, chunk_size=chunk_size, kernel="eager")
    assert causality_probe(model, 16, 13)["verdict"] == "causal"


def test_tensor_local_defaults_to_window_8():
    assert get_backbone("tensor_local", 16, 2, 2).config.window == 8
    assert get_backbone("tensor", 16, 2, 2).config.window is None


def test_gates_and_memory_disabled():
    model = get_backbone("tensor", 16, 3, 2, channels=4, grid=4, gate_init=0.0, kernel="eager").eval()
    assert model.gate_values() == {"layer0": 0.5, "layer1": 0.5, "layer2": 0.5}
    x = torch.randn(2, 6, 16)
    with_memory = model(x)
    with model.memory_disabled():
        off = model(x)
    with torch.no_grad():
        model.gammas.fill_(-1e4)  # sigmoid underflows to exactly zero
    assert torch.equal(off, model(x))
    assert not torch.allclose(off, with_memory)
    with torch.no_grad():
        model.gammas.fill_(0.0)
    assert torch.equal(model(x), with_memory)  # the context restored the memory path


def _native_model(**options):
    torch.manual_seed(0)
    model = get_backbone("tensor", 16, 2, 2, dropout=0.0, channels=4, grid=(3, 4, 5), kernel="native", **options)
    perturb(model, scale=0.1)
    return model


def _output_and_grads(model, x):
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


@pytest.mark.parametrize("kernel", ["native"])
def test_native_is_thread_count_independent(kernel):
    """Each sequence is one task with its own gradient sums, reduced in a fixed order:
    the scan's outputs and gradients do not depend on how many threads ran it."""
    inputs = random_scan_inputs(5, N=6, B=7, grid=(3, 4, 5), C=8)
    runs = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        runs.append(scan_with_grads(inputs, "native"))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


@pytest.mark.parametrize("kernel", ["native"])
@pytest.mark.parametrize("factors", ["dense", "zero", "one cell", "corner"])
@pytest.mark.parametrize("factorised", [True, False])
def test_native_scan_on_any_write_factors(kernel, factors, factorised):
    """Write factors nonzero everywhere (soft writes), nowhere, at one cell (hard writes) or
    in one corner, through the factorised and the pointwise update, with read weights
    nonzero at two cells an axis as trilinear ones are: the native scan gives the PyTorch
    scan's outputs and gradients, those of the zero read weights included."""
    inputs = random_scan_inputs(6, N=4, B=3, grid=(3, 4, 5), C=8)
    for f in inputs[:3]:  # cz, uy, ux: (B, N, n, C)
        keep = torch.zeros(f.shape[2], dtype=torch.bool)
        keep[{"dense": slice(None), "zero": slice(0, 0), "one cell": slice(1, 2), "corner": slice(-2, None)}[factors]] = True
        f[:, :, ~keep] = 0.0
    for f in inputs[4:7]:  # wz, wy, wx: (B, N, n)
        f[..., [0, *range(3, f.shape[-1])]] = 0.0
    runs = {k: scan_with_grads(inputs, k, factorised) for k in ("eager", kernel)}
    for i, (a, b) in enumerate(zip(runs["eager"], runs[kernel])):
        assert (a is None) == (b is None), i
        if a is not None:
            assert rel(b, a) < 1e-5, (i, rel(b, a))


@pytest.mark.parametrize("kernel", KERNELS)
def test_scan_without_the_final_state(kernel):
    """Without output_final_state the scan returns no final state (the native one skips
    the last write) and the same reads, and, trained on the reads, the same gradients."""
    inputs = random_scan_inputs(7, N=5, B=3, grid=(3, 4, 5), C=8)
    weight = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(8))
    runs = []
    for final in (True, False):
        xs = [t.clone().requires_grad_() for t in inputs]
        with torch.no_grad():
            evaluated = kernels.scan(**dict(zip(SCAN_INPUTS, xs)), factorised=True, kernel=kernel,
                                     output_final_state=final)
        reads, hN, cN = kernels.scan(**dict(zip(SCAN_INPUTS, xs)), factorised=True, kernel=kernel,
                                     output_final_state=final)
        assert (hN is None) == (cN is None) == (evaluated[1] is None) == (evaluated[2] is None) == (not final)
        runs.append([evaluated[0], reads, *grads((reads * weight).sum(), xs)])
    for i, (a, b) in enumerate(zip(*runs)):
        assert (a is None and b is None) or torch.equal(a, b), i


@pytest.mark.parametrize("kernel", ["native"])
def test_native_forward_refuses_to_keep_steps_without_the_final_state(kernel):
    """C skips the last write without a final state, so it must not save steps for a backward then."""
    B, N, (D, H, W), C = 2, 3, (3, 4, 5), 8
    inputs = dict(zip(SCAN_INPUTS, random_scan_inputs(9, N=N, B=B, grid=(D, H, W), C=C)))
    saved = {name: torch.empty(B, N, D * H * W, width) for name, width in (("hs", C), ("cs", C), ("gs", 4 * C))}
    call = dict(B=B, N=N, D=D, H=H, W=W, C=C, factorised=1, nthreads=1, **inputs, reads=torch.empty(B, N, C))
    assert native.native_call("tm_forward", **call, hN=None, cN=None, **saved) == 2
    assert native.native_call("tm_forward", **call, hN=torch.empty(B, D, H, W, C), cN=None,
                              **dict.fromkeys(saved)) == 2
    assert native.native_call("tm_forward", **call, hN=None, cN=None, **dict.fromkeys(saved)) == 0


@pytest.mark.parametrize("kernel", ["native"])
def test_native_recycled_buffers_and_no_grad_path(kernel):
    """Saved states are recycled after each backward: repeated steps (and the no-grad
    evaluation path, which saves nothing) give the same numbers every time."""
    model = _native_model()
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(6))
    first = _output_and_grads(model, x)
    assert native_scan._free_buffers, "the first backward returned no buffer for reuse"
    other = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(7))
    _output_and_grads(model, other)  # dirties the recycled buffers with other values
    again = _output_and_grads(model, x)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    with torch.no_grad():
        assert torch.equal(model(x), first[0])


@pytest.mark.parametrize("kernel", ["native"])
def test_evaluation_keeps_no_steps(monkeypatch, kernel):
    """Under torch.no_grad (where a Function still sees needs_input_grad True) the native
    scan saves no per-step state: evaluation allocates none of the backward's buffers."""
    model = _native_model()
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(9))
    expected = model(x)

    def no_buffers(shape):
        raise AssertionError(f"evaluation asked for a saved-state buffer {shape}")

    monkeypatch.setattr(native_scan, "_buffer", no_buffers)
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_buffer_pool_keeps_recent_shapes_only(monkeypatch):
    monkeypatch.setattr(native_scan, "_free_buffers", {})
    shapes = [(i + 1, 3) for i in range(native_scan._POOL_SHAPES + 2)]
    for shape in shapes:
        native_scan._release([torch.empty(shape), torch.empty(shape)])
    assert list(native_scan._free_buffers) == shapes[2:]
    kept = native_scan._free_buffers[shapes[-1]][-1]
    assert native_scan._buffer(shapes[-1]) is kept
    assert native_scan._buffer((99, 3)).shape == (99, 3)


@pytest.mark.parametrize("kernel", ["native"])
def test_native_refuses_a_second_backward(kernel):
    model = _native_model()
    y = model(torch.randn(2, 5, 16))
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="recycles its saved states"):
        y.sum().backward()


def test_without_the_extension_auto_falls_back(monkeypatch):
    """Where the extension is not built, `auto` runs the pure-PyTorch scan (here eager)
    with the same numbers, and asking for `native` is a clear error."""
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(0)
    auto = TensorMemory(TensorMemoryConfig(d_model=16, channels=4, grid=4, kernel="auto"))
    perturb(auto)
    with_extension = auto(x)[0]
    monkeypatch.setattr(native, "_loaded", {})

    def missing(path=None):
        raise ImportError("no _scan")

    monkeypatch.setattr(native, "_open_native", missing)
    monkeypatch.setenv("TMEM_BENCH_NO_COMPILE", "1")
    assert kernels.resolve_kernel("auto", x) == "auto"
    fallback = auto(x)[0]
    assert rel(fallback, with_extension) < TOL
    auto.config.kernel = "native"
    with pytest.raises(RuntimeError, match="not built"):
        auto(x)


@pytest.mark.parametrize("stale", ["older version", "no version"])
def test_stale_extension_is_refused(monkeypatch, stale):
    """A build whose interface version is not the loader's (or that has none) is never called:
    `auto` warns once and takes the PyTorch scan, `native` says why it cannot run."""
    found = native.INTERFACE_VERSION - 1 if stale == "older version" else None
    library = types.SimpleNamespace()  # a stand-in for the ctypes library: nothing else is looked up
    if found is not None:
        library.tm_interface_version = lambda: found
    monkeypatch.setattr(native, "_open_native", lambda path=None: library)
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.delenv("TMEM_BENCH_NO_NATIVE", raising=False)
    expected = f"interface version {found}, the scan expects {native.INTERFACE_VERSION}"
    x = torch.randn(2, 3)
    with pytest.warns(UserWarning, match=re.escape(expected)):
        assert kernels.resolve_kernel("auto", x) == "auto"
    assert native.native_library() is None
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        kernels.resolve_kernel("native", x)


def test_native_signatures_match_scan_c():
    """The loader's argument lists and interface version are those of _scan.c, argument for argument."""
    source = (ROOT / "tmem_bench" / "tensor_memory" / "_scan.c").read_text()
    version = re.search(r"^#define TM_INTERFACE_VERSION (\d+)$", source, re.M)
    assert version and int(version.group(1)) == native.INTERFACE_VERSION
    assert re.search(r"^const char \*tm_variant\(void\) {", source, re.M)
    ctype_of = {"int ": ctypes.c_int, "float *": native._FLOATS}
    for name, signature in native.NATIVE_SIGNATURES.items():
        params = re.search(rf"^int {name}\(([^)]*)\) {{", source, re.M).group(1)
        declared = [re.fullmatch(r"(?:const )?(int |float \*)(\w+)", " ".join(p.split())).groups()
                    for p in params.split(",")]
        assert [(arg, ctype_of[t]) for t, arg in declared] == signature, name


def test_native_call_takes_every_argument_by_name():
    with pytest.raises(TypeError, match=r"missing arguments \['N',.*unknown arguments \['Q'\]"):
        native.native_call("tm_forward", B=1, Q=2)
    args = {arg: 1 if ctype is ctypes.c_int else torch.zeros(2) for arg, ctype in native.NATIVE_SIGNATURES["tm_forward"]}
    with pytest.raises(ValueError, match="h0 must be contiguous float32"):
        native.native_call("tm_forward", **{**args, "h0": torch.zeros(2, dtype=torch.float64)})
    with pytest.raises(ValueError, match="c0 must be contiguous float32"):
        native.native_call("tm_forward", **{**args, "c0": torch.zeros(2, 2).t()})


def test_native_is_float32_cpu_only():
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    memory = TensorMemory(TensorMemoryConfig(d_model=16, channels=4, grid=3, kernel="native")).double()
    with pytest.raises(RuntimeError, match="float32 on CPU"):
        memory(x)
    memory.config.kernel = "auto"
    assert kernels.resolve_kernel("auto", x) == "auto"
    assert memory(x)[0].dtype == torch.float64
    # One tensor of another dtype (as under autocast) is enough to leave the C path.
    assert kernels.resolve_kernel("auto", x.float(), x.float().bfloat16()) == "auto"
    with pytest.raises(RuntimeError, match="torch.bfloat16"):
        kernels.resolve_kernel("native", x.float(), x.float().bfloat16())


@pytest.mark.parametrize("variant,expected", [("avx512", "native"), ("avx2", "native"), ("sse", "native"),
                                              ("generic", "auto"), (None, "auto")])
def test_auto_takes_native_for_measured_variants_only(monkeypatch, variant, expected):
    """`auto` runs the native scan only for a build whose variant was measured faster than
    the compiled step; the generic variant (not x86), or no build, leaves it to the PyTorch scan."""
    monkeypatch.setattr(kernels, "native_variant", lambda: variant)
    assert kernels.resolve_kernel("auto", torch.zeros(2)) == expected


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith("flags")), "").split())


def build_flags() -> list[str]:
    """The extension's compile arguments from pyproject.toml, without its -march."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module = next(m for m in project["tool"]["setuptools"]["ext-modules"] if m["name"] == "tmem_bench.tensor_memory._scan")
    return [a for a in module["extra-compile-args"] if not a.startswith("-march")] + module["extra-link-args"]


# Each vector variant of _scan.c: the flags that select it and the CPU flags it needs to run.
VARIANTS = {
    "avx512": (["-march=native"], {"avx512f"}),
    "avx2": (["-march=native", "-mno-avx512f"], {"avx2", "fma"}),
    "generic": ([], set()),  # no -march: SSE2 on x86-64 (reported as sse), NEON on ARM
}


@pytest.fixture(scope="module")
def variant_builds(tmp_path_factory):
    """Every variant of _scan.c this machine can build and run, compiled side by side into a
    temporary directory on first use: variant -> (path, "") or (None, why it is skipped)."""
    where = tmp_path_factory.mktemp("variants")
    source = ROOT / "tmem_bench" / "tensor_memory" / "_scan.c"
    compiler, flags_here = c_compiler(), cpu_flags()
    built, running = {}, {}
    for variant, (flags, needs) in VARIANTS.items():
        if compiler is None:
            built[variant] = None, "no C compiler here"
        elif needs and platform.machine() not in ("x86_64", "AMD64"):
            built[variant] = None, f"the {variant} variant is x86 only"
        elif not needs <= flags_here:
            built[variant] = None, f"this CPU lacks {sorted(needs - flags_here)}, which the {variant} variant needs"
        else:
            out = where / f"scan_{variant}.so"
            cmd = [compiler, *flags, *build_flags(), "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                   str(source), "-o", str(out)]
            running[variant] = cmd, out, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for variant, (cmd, out, process) in running.items():
        _, err = process.communicate()
        if process.returncode == 0:
            built[variant] = str(out), ""
        elif native.native_library() is None:  # the extension cannot be built here either (no OpenMP, ...)
            built[variant] = None, f"{' '.join(cmd)} failed: {err[-500:]}"
        else:
            built[variant] = None, f"FAILED although the extension is built here: {' '.join(cmd)}\n{err}"
    return built


VARIANT_CASES = [
    dict(batch=3, seq=5, chunk_size=1, grid=(3, 4, 5), channels=16),  # 60 voxels: full register tiles
    dict(batch=2, seq=4, chunk_size=2, grid=(2, 3, 3), channels=8),  # 18 voxels, 16 rows: other tiles, a partial vector block
    dict(batch=2, seq=3, chunk_size=1, grid=(3, 3, 2), channels=12),  # no literal C: whole vectors and a partial one
]


@pytest.mark.parametrize("kernel", ["native"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_native_variant_matches_naive_twin(monkeypatch, variant_builds, variant, kernel):
    """Each vector variant that this machine can build and run, loaded through
    TMEM_BENCH_NATIVE_LIB, against the naive twin: outputs and gradients."""
    path, why = variant_builds[variant]
    if path is None:
        if why.startswith("FAILED"):
            pytest.fail(why)
        pytest.skip(why)
    monkeypatch.setenv(native.LIBRARY_ENV, path)
    monkeypatch.setattr(native, "_chosen", [])
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert native.library_path() == path
    assert native.native_variant() == ("sse" if variant == "generic" and x86 else variant)
    for case in VARIANT_CASES:
        check_memory_against_naive_twin(case, kernel)


def test_an_unloadable_native_library_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(native.LIBRARY_ENV, str(tmp_path / "missing.so"))
    monkeypatch.setattr(native, "_chosen", [])
    monkeypatch.delenv("TMEM_BENCH_NO_NATIVE", raising=False)
    assert native.native_library() is None and native.native_variant() is None
    assert kernels.resolve_kernel("auto", torch.zeros(2)) == "auto"
    with pytest.raises(RuntimeError, match="could not be opened from TMEM_BENCH_NATIVE_LIB"):
        kernels.resolve_kernel("native", torch.zeros(2))


def test_state_size_is_fixed():
    memory = TensorMemory(TensorMemoryConfig(channels=16, grid=6))
    assert memory.state_size() == 2 * 16 * 216 * 4
    model = get_backbone("tensor", 64, 2, 4)
    base = get_backbone("base", 64, 2, 4)
    for seq in (1_000, 64_000):
        assert model.state_size(seq) - base.state_size(seq) == 2 * memory.state_size()
    local = get_backbone("tensor_local", 64, 2, 4)
    assert local.state_size(1_000) == local.state_size(64_000)


@pytest.mark.parametrize("options", [
    dict(channels=0), dict(grid=(4, 4)), dict(grid=0), dict(chunk_size=0), dict(sigma_scale=0.0),
    dict(write_mode="soft"), dict(coord_heads="many"), dict(update="full"), dict(threading="shared"),
    dict(kernel="cuda"),
])
def test_bad_settings_raise(options):
    with pytest.raises(ValueError):
        get_backbone("tensor", 16, 2, 2, **options)


def test_unknown_option_raises():
    with pytest.raises(TypeError):
        get_backbone("tensor", 16, 2, 2, chanels=4)


def test_compile_failure_falls_back_to_eager(monkeypatch):
    monkeypatch.setenv("TMEM_BENCH_NO_NATIVE", "1")

    def broken(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(torch_scan.torch, "compile", broken)
    monkeypatch.setattr(torch_scan, "_compiled", {})
    monkeypatch.setattr(torch_scan, "_compile_failed", [])
    monkeypatch.delenv("TMEM_BENCH_NO_COMPILE", raising=False)
    torch.manual_seed(0)
    auto = TensorMemory(TensorMemoryConfig(d_model=16, channels=4, grid=3, kernel="auto"))
    x = torch.randn(2, 5, 16, requires_grad=True)
    with pytest.warns(UserWarning, match="using eager"):
        read, _ = auto(x)
    read.sum().backward()
    auto.config.kernel = "eager"
    assert torch.equal(read, auto(x)[0])
    assert torch_scan._compile_failed and not torch_scan.compiled_available()
    strict = TensorMemory(TensorMemoryConfig(d_model=16, channels=4, grid=3, kernel="compiled"))
    monkeypatch.setattr(torch_scan, "_compile_failed", [])
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        strict(x)


@pytest.mark.slow
def test_compiled_backbone_matches_naive_twin():
    """The torch.compile'd step in a backbone at two batch sizes (the batch is compiled as
    dynamic); compiles once (minutes on a busy CPU)."""
    model = get_backbone("tensor", 16, 2, 2, dropout=0.0, channels=4, grid=(3, 4, 5), chunk_size=2, kernel="compiled")
    perturb(model, scale=0.1)
    naive = naive_twin(model)
    naive64 = naive_twin(model).double()
    for batch, seq in ((3, 7), (5, 10)):
        x = torch.randn(batch, seq, 16)
        outs = []
        for m, dtype in ((model, torch.float32), (naive, torch.float32), (naive64, torch.float64)):
            y = m(x.to(dtype))
            outs.append([y, *grads(y.square().sum(), list(m.parameters()))])
        assert_close(["output", *(n for n, _ in model.named_parameters())], *outs)


def test_ablations_profile_plans():
    cells = make_plan("coordinate_binding", "ablations")
    labels = {c.label for c in cells}
    assert {"tensor", "tensor_hard", "tensor_separate_heads", "tensor_pointwise", "tensor_grid4", "tensor_grid8",
            "tensor_chunk2", "tensor_chunk4"} <= labels
    # On the memory-forcing variant (where the memory alone carries the answer), trained at one W.
    assert all(c.task_options["block_queries"] and c.train_level == {"n_writes": 10, "noise": 0.05} for c in cells)
    assert max(level["n_writes"] for level in cells[0].eval_levels) >= 100
    with pytest.raises(UsageError):
        make_plan("coordinate_binding", "ablations_missing")
