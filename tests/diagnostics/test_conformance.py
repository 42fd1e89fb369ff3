"""The backbone checks (tmem_bench.diagnostics.conformance, `tmem-bench check MODEL`): each passes a good
backbone and fails one broken its way; every registered model passes the probe after training steps."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

from tmem_bench.cli import main
from tmem_bench.diagnostics import conformance
from tmem_bench.registry import BACKBONES, backbone_names


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


class GatedLeak(Toy):
    """Leaks through a gate that starts at zero: causal as built, leaking after one optimiser step."""

    def __init__(self, d_model):
        super().__init__(d_model)
        self.gate = nn.Parameter(torch.zeros(()))

    def mix(self, x):
        return super().mix(x) + self.gate * x.mean(dim=1, keepdim=True)


class TrainModeLeak(Toy):
    def mix(self, x):
        return super().mix(x) + (x.mean(dim=1, keepdim=True) if self.training else 0)


class GrowsPast512(Toy):
    fixed_state = True

    def state_size(self, seq_len: int) -> int:
        return super().state_size(seq_len) * max(1, seq_len // 512)


class StatefulToy(Toy):
    """A causal backbone with a state probe hook: its running mean after the last token."""

    def memory_state(self, x, blocked=None):
        return {"h": self.mix(self.proj(x))[:, -1]}


class HookLeaksFuture(StatefulToy):
    """The hook adds the last token of the sequence the last forward saw: later than the hook's own."""

    def forward(self, x, blocked=None):
        self.seen = x.detach()
        return super().forward(x)

    def memory_state(self, x, blocked=None):
        seen = getattr(self, "seen", x)
        return {"h": super().memory_state(x)["h"] + seen[:, -1]}


class HookIgnoresWrites(StatefulToy):
    def memory_state(self, x, blocked=None):
        return {"h": self.proj.weight.sum(0).expand(x.shape[0], -1)}


class HookGrowingState(StatefulToy):
    def memory_state(self, x, blocked=None):
        return {"h": self.mix(self.proj(x))}  # every position: grows with the sequence


class Broken(Toy):
    def __init__(self, d_model):
        raise ValueError("cannot build")


def factory(cls):
    def make(d_model, n_layers, n_heads, **options):
        return cls(d_model)
    return make


leaky = factory(Leaky)
good = factory(Toy)
hook_leaks = factory(HookLeaksFuture)


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
    (GatedLeak, {"causal_trained"}),
    (TrainModeLeak, {"causal_trained"}),
    (GrowsPast512, {"state_size"}),
    (HookLeaksFuture, {"memory_state"}),
    (HookIgnoresWrites, {"memory_state"}),
    (HookGrowingState, {"memory_state"}),
])
def test_each_check_fails_the_backbone_broken_its_way(cls, failing):
    results = {r.name: r for r in conformance.run_checks(factory(cls))}
    assert {name for name, r in results.items() if not r.passed} >= failing
    assert {"builds", "parameters"}.isdisjoint(name for name, r in results.items() if not r.passed)
    for name in failing:
        assert results[name].detail


@pytest.mark.parametrize("cls, failing, needle", [
    (GatedLeak, "causal_trained", "after 3 AdamW steps, leaking in eval mode"),
    (TrainModeLeak, "causal_trained", "after 3 AdamW steps, leaking in train mode"),
    (GrowsPast512, "state_size", "claims fixed_state but its state grows: S=1: 64, S=8: 64"),
])
def test_what_the_initial_eval_probe_and_short_lengths_missed_fails_check(cls, failing, needle):
    results = {r.name: r for r in conformance.run_checks(factory(cls))}
    assert [name for name, r in results.items() if not r.passed] == [failing]
    assert needle in results[failing].detail, results[failing].detail
    assert results["causal"].passed and results["causal_blocked"].passed  # all that check probed before


@pytest.mark.parametrize("name", backbone_names())
def test_every_registered_model_passes_the_probe_after_training_steps(name):
    result = conformance.check_causal_trained(BACKBONES.get(name), conformance.Spec())
    assert result.passed, result.detail


@pytest.mark.parametrize("cls, needle", [
    (HookLeaksFuture, "not causal: the state after 8 tokens depends on later tokens (h)"),
    (HookIgnoresWrites, "does not depend on the writes"),
    (HookGrowingState, "the state's shapes change with the sequence"),
])
def test_the_memory_state_hook_is_checked_alone(cls, needle):
    results = {r.name: r for r in conformance.run_checks(factory(cls))}
    assert [name for name, r in results.items() if not r.passed] == ["memory_state"]
    assert needle in results["memory_state"].detail, results["memory_state"].detail


def test_a_causal_hook_passes_the_memory_state_check():
    result = conformance.check_memory_state(factory(StatefulToy), conformance.Spec())
    assert result.passed and "depends on the writes, causal" in result.detail, result.detail


@pytest.mark.parametrize("name", backbone_names())
def test_every_registered_model_passes_the_memory_state_check(name):
    result = conformance.check_memory_state(BACKBONES.get(name), conformance.Spec())
    assert result.passed, result.detail


def test_the_probe_in_train_mode_gives_both_passes_the_same_dropout_draws():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))

    class Causal(nn.Module):  # position-wise: causal whatever the dropout mask
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x, blocked=None):
            return self.inner(x)

    backbone = Causal()
    x = torch.randn(2, 6, 8)
    assert not torch.equal(backbone.train()(x), backbone(x))  # dropout is on in train mode
    state = torch.get_rng_state()
    result = conformance.causality_probe(backbone, 8, 6, train_mode=True)
    assert result["verdict"] == "causal" and result["mode"] == "train"
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random stream is untouched
    assert conformance.causality_probe(backbone, 8, 6)["mode"] == "eval" and backbone.training


def test_a_backbone_that_does_not_build_fails_every_check_without_raising():
    results = conformance.run_checks(factory(Broken))
    assert not any(r.passed for r in results)
    assert "cannot build" in results[0].detail and all("not run" in r.detail for r in results[1:])


def test_check_command_passes_a_registered_backbone(capsys):
    assert main(["check", "lstm"]) == 0
    out = capsys.readouterr().out
    for result in ("builds", "forward", "gradients", "causal_blocked", "deterministic", "state_size", "parameters"):
        assert result in out
    assert "FAIL" not in out and "lstm: 10 of 10 checks pass" in out


def test_check_command_fails_a_leaking_plugin(capsys):
    assert main(["check", f"{__name__}:leaky"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "failed: causal, causal_blocked" in out


def test_check_command_fails_a_plugin_whose_state_hook_reads_later_tokens(capsys):
    assert main(["check", f"{__name__}:hook_leaks"]) == 1
    out = capsys.readouterr().out
    assert "failed: memory_state" in out and "depends on later tokens" in out


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
