"""`tmem-bench check` and the conformance checks: each must pass a good backbone and fail a broken one."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

from tmem_bench import conformance
from tmem_bench.cli import main


class Toy(nn.Module):
    """A causal backbone (a running mean after a projection) that each subclass breaks in one way."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.ln = nn.LayerNorm(d_model)

    def mix(self, x):
        return x.cumsum(1) / torch.arange(1, x.shape[1] + 1, device=x.device)[:, None]

    def forward(self, x, blocked=None):
        return self.ln(self.mix(self.proj(x)))

    def state_size(self, seq_len: int) -> int:
        return 4 * self.proj.out_features


class Leaky(Toy):
    def mix(self, x):
        return x + x.mean(dim=1, keepdim=True)  # every position sees the whole sequence


class WrongShape(Toy):
    def forward(self, x, blocked=None):
        return super().forward(x)[:, :-1]


class DeadParameter(Toy):
    def __init__(self, d_model):
        super().__init__(d_model)
        self.unused = nn.Parameter(torch.zeros(3))


class Unseeded(Toy):
    def __init__(self, d_model):
        super().__init__(d_model)
        with torch.no_grad():
            fresh = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))  # ignores torch.manual_seed
            self.proj.weight.copy_(torch.randn(self.proj.weight.shape, generator=fresh))


class ClaimsFixedButGrows(Toy):
    fixed_state = True

    def state_size(self, seq_len: int) -> int:
        return 4 * seq_len


class NoStateSize(Toy):
    state_size = None


class BlockedLeak(Toy):
    def forward(self, x, blocked=None):
        y = super().forward(x)
        return y if blocked is None else y + x.flip(1)  # the blocked path reads the future


class Broken(Toy):
    def __init__(self, d_model):
        raise ValueError("cannot build")


def factory(cls):
    def make(d_model, n_layers, n_heads, **options):
        return cls(d_model)
    return make


leaky = factory(Leaky)
good = factory(Toy)


def test_a_good_backbone_passes_every_check():
    results = conformance.run_checks(good)
    assert [r.name for r in results] == [c.__name__.removeprefix("check_") for c in conformance.CHECKS]
    assert all(r.passed for r in results), results


@pytest.mark.parametrize("cls, failing", [
    (Leaky, {"causal", "causal_blocked"}),
    (BlockedLeak, {"causal_blocked"}),
    (WrongShape, {"forward", "causal", "causal_blocked", "gradients"}),
    (DeadParameter, {"gradients"}),
    (Unseeded, {"deterministic"}),
    (ClaimsFixedButGrows, {"state_size"}),
    (NoStateSize, {"state_size"}),
])
def test_each_check_fails_the_backbone_broken_its_way(cls, failing):
    results = {r.name: r for r in conformance.run_checks(factory(cls))}
    assert {name for name, r in results.items() if not r.passed} >= failing
    assert {"builds", "parameters"}.isdisjoint(name for name, r in results.items() if not r.passed)
    for name in failing:
        assert results[name].detail


def test_a_backbone_that_does_not_build_fails_every_check_without_raising():
    results = conformance.run_checks(factory(Broken))
    assert not any(r.passed for r in results)
    assert "cannot build" in results[0].detail and all("not run" in r.detail for r in results[1:])


def test_check_command_passes_a_registered_backbone(capsys):
    assert main(["check", "lstm"]) == 0
    out = capsys.readouterr().out
    for result in ("builds", "forward", "gradients", "causal_blocked", "deterministic", "state_size", "parameters"):
        assert result in out
    assert "FAIL" not in out and "lstm: 8 of 8 checks pass" in out


def test_check_command_fails_a_leaking_plugin(capsys):
    assert main(["check", "test_conformance:leaky"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "failed: causal, causal_blocked" in out


def test_check_command_passes_options_to_the_factory(capsys):
    assert main(["check", "local", "--option", "window=4", "--seq-len", "12"]) == 0
    assert main(["check", "local", "--option", "window"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["check", "local", "--option", "no_such_option=1"]) == 2
    assert "no_such_option" in capsys.readouterr().err


def test_check_command_rejects_an_unknown_model_in_one_line(capsys):
    assert main(["check", "no_such_model"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown model 'no_such_model'" in err and "base" in err
    assert main(["check", "no_such_module:thing"]) == 2
    assert "cannot load model" in capsys.readouterr().err
