"""Tensor Memory's C scan (native.py, native_scan.py, kernels.py): outputs and gradients against the eager twin, the extension's build, loading and choice."""
from __future__ import annotations

import ctypes
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
from tests.contracts.helpers import c_compiler
from tests.tensor_memory.helpers import (KERNELS, SCAN_INPUTS, TOL, native_model, output_and_grads,
                                         check_memory_against_naive_twin, grads, perturb, random_scan_inputs, rel,
                                         scan_with_grads)
from tmem_bench.tensor_memory import TensorMemory, TensorMemoryConfig, kernels, native, native_scan


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
    model = native_model()
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(6))
    first = output_and_grads(model, x)
    assert native_scan._free_buffers, "the first backward returned no buffer for reuse"
    other = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(7))
    output_and_grads(model, other)  # dirties the recycled buffers with other values
    again = output_and_grads(model, x)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    with torch.no_grad():
        assert torch.equal(model(x), first[0])


@pytest.mark.parametrize("kernel", ["native"])
def test_evaluation_keeps_no_steps(monkeypatch, kernel):
    """Under torch.no_grad (where a Function still sees needs_input_grad True) the native
    scan saves no per-step state: evaluation allocates none of the backward's buffers."""
    model = native_model()
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
    model = native_model()
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
