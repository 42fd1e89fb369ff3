"""Tensor Memory's layer and backbone (layer.py, step.py, params.py): the fast path against its naive twin, causality, gates, settings."""
from __future__ import annotations

import pytest
import torch

from tests.tensor_memory.helpers import (KERNELS, MEMORY_CASES, TOL, assert_close, check_memory_against_naive_twin,
                                         grads, perturb, rel)
from tmem_bench.diagnostics.causality import causality_probe
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import make_plan
from tmem_bench.registry import get_backbone
from tmem_bench.tensor_memory import TensorMemory, TensorMemoryConfig, torch_scan
from tmem_bench.tensor_memory.naive import naive_twin


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", MEMORY_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_memory_matches_naive_twin(case, kernel):
    check_memory_against_naive_twin(case, kernel)


def test_compiled_matches_naive_twin():
    """The torch.compile'd step (inductor) at one small shape: one compilation of each step."""
    check_memory_against_naive_twin(dict(batch=3, seq=5, chunk_size=2, grid=(2, 3, 4)), "compiled")


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
