"""`tmem-bench check` and the conformance checks: each must pass a good backbone or task and fail a broken one."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

from tmem_bench.cli import main
from tmem_bench.contracts.task import Adapter, Task
from tmem_bench.diagnostics import conformance, conformance_tasks
from tmem_bench.errors import check_int
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
    (GatedLeak, {"causal_trained"}),
    (TrainModeLeak, {"causal_trained"}),
    (GrowsPast512, {"state_size"}),
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
    assert "FAIL" not in out and "lstm: 9 of 9 checks pass" in out


def test_check_command_fails_a_leaking_plugin(capsys):
    assert main(["check", "tests.test_conformance:leaky"]) == 1
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


# The task checks: a toy task that passes them all, and one broken for each check.

class RecallAdapter(Adapter):
    """The items, then a query token; the head reads the query's output."""

    def __init__(self, d_model: int, task: "Recall"):
        super().__init__()
        self.task = task
        self.emb = nn.Embedding(5, d_model)  # values 0..3, and 4 for the query (and relay) tokens
        self.head_proj = nn.Linear(d_model, 4)

    def tokens(self, values):
        return torch.cat([values, torch.full_like(values[:, :1], 4)], 1)

    def forward(self, batch):
        return self.emb(self.tokens(batch["values"]))

    def blocked(self, batch):
        if not self.task.block_query:
            return None
        S = self.tokens(batch["values"]).shape[1]
        blocked = torch.zeros(S, S, dtype=torch.bool)
        blocked[-1, : batch["values"].shape[1]] = True  # the query may not attend to the items
        return blocked

    def head(self, h, batch):
        return self.head_proj(h[:, -1:])


class Recall(Task):
    """n_items values in 0..3, then a query whose target is the first value."""
    name = "recall"
    axes = ("n_items",)
    n_classes = 4
    levels = {"n_items": (3, 5)}
    variants = {"standard": {}, "memory_forcing": {"block_query": True}}
    memory_forcing = ("memory_forcing",)

    def __init__(self, block_query: bool = False):
        self.block_query = bool(block_query)

    def options(self):
        return {"block_query": self.block_query}

    def check_value(self, axis, value):
        return check_int(axis, value)

    def sample(self, level, batch_size, generator):
        values = torch.randint(0, 4, (batch_size, level["n_items"]), generator=generator)
        return {"values": values, "target": values[:, :1]}

    def make_adapter(self, d_model):
        return RecallAdapter(d_model, self)

    def oracle(self, level, batch):
        return batch["values"][:, :1]

    def reach_positions(self, level, batch):
        n = batch["values"].shape[1]
        items = torch.arange(n + 1) < n
        return items, ~items


class WrongOracle(Recall):
    def oracle(self, level, batch):
        return (batch["values"][:, :1] + 1) % 4


class WrongChance(Recall):
    def chance(self, level):
        return 0.5


class Unseeded(Recall):
    def sample(self, level, batch_size, generator):
        return super().sample(level, batch_size, None)  # the global generator: not a function of `generator`


class UnnamedForcing(Recall):
    memory_forcing = ("forcing",)


class MaskIgnored(Recall):
    def make_adapter(self, d_model):
        adapter = RecallAdapter(d_model, self)
        adapter.blocked = lambda batch: None
        return adapter


class PeekAdapter(RecallAdapter):
    def blocked(self, batch):
        blocked = super().blocked(batch)
        if blocked is not None:
            blocked[-1, 0] = False  # the query still sees the first item, the answer
        return blocked


class Peeks(Recall):
    def make_adapter(self, d_model):
        return PeekAdapter(d_model, self)


class RelayAdapter(RecallAdapter):
    def tokens(self, values):
        return torch.cat([values, torch.full_like(values[:, :2], 4)], 1)  # a relay token before the query


class Relays(Recall):
    def make_adapter(self, d_model):
        return RelayAdapter(d_model, self)


class Unmarked(Recall):
    reach_positions = Task.reach_positions  # None: the reach and state probes see no evidence


class MarkedBackwards(Recall):
    def reach_positions(self, level, batch):
        return tuple(reversed(super().reach_positions(level, batch)))


class MarkedShort(Recall):
    def reach_positions(self, level, batch):
        return tuple(p[:-1] for p in super().reach_positions(level, batch))


class MarkedOffByOne(Recall):
    def reach_positions(self, level, batch):
        items, query = super().reach_positions(level, batch)
        last = torch.arange(len(items)) == len(items) - 2
        return items & ~last, query | last  # the last item, which attends to the others, marked an answer


def recall_factory(**options):
    """A function that builds the task: no forces_memory for the report to ask."""
    return Recall(**options)


class SetOption(Recall):
    def options(self):
        return {**super().options(), "tags": {"a"}}

    def __init__(self, block_query: bool = False, tags=()):
        super().__init__(block_query)


class NumpyLevel(Recall):
    def check_value(self, axis, value):
        import numpy
        return numpy.int64(check_int(axis, value))


def test_a_good_task_passes_every_task_check():
    results = conformance_tasks.run_task_checks(Recall)
    assert [r.name for r in results] == [conformance_tasks.task_check_name(c) for c in conformance_tasks.TASK_CHECKS]
    assert all(r.passed for r in results), results
    assert "in a fresh process" in results[4].detail


@pytest.mark.parametrize("cls, failing, needle", [
    (WrongOracle, "oracle", "the oracle scores 0.0000, the ceiling is 1.0000"),
    (WrongChance, "chance", "chance() says 0.5000"),
    (Unseeded, "fingerprints", "the same generator seed gives different batches"),
    (MaskIgnored, "blocked", "memory-forcing variant memory_forcing blocks no edge"),
    (Relays, "blocked", "the edge 4 -> 0 is blocked, but attention reaches 0 from 4 through other tokens"),
    (Relays, "blind", "the attention reference's answer moves with the blocked tokens"),
    (Peeks, "blind", "the tokens attention still sees tell the target"),
    (Unmarked, "reach", "memory_forcing at n_items=3: a memory-forcing variant marks no evidence and answer tokens"),
    (MarkedBackwards, "reach", "evidence token 3 comes after answer token 0"),
    (MarkedShort, "reach", "expected two bool (4,) masks over the adapter's tokens"),
    (MarkedOffByOne, "reach", "attention still carries the marked evidence to the marked answer"),
])
def test_each_task_check_fails_the_task_broken_its_way(cls, failing, needle):
    check = next(c for c in conformance_tasks.TASK_CHECKS if conformance_tasks.task_check_name(c) == failing)
    result = check(cls, conformance_tasks.TaskSpec())
    assert not result.passed and needle in result.detail, result.detail
    assert conformance_tasks.check_task_declarations(cls, conformance_tasks.TaskSpec()).passed


@pytest.mark.parametrize("factory, needle", [
    (recall_factory, "has no forces_memory"),
    (SetOption, "are not JSON, as every cell records them"),
    (NumpyLevel, "comes back from JSON as TypeError"),
])
def test_the_declarations_check_fails_the_task_broken_its_way(factory, needle):
    result = conformance_tasks.check_task_declarations(factory, conformance_tasks.TaskSpec())
    assert not result.passed and needle in result.detail, result.detail


def test_a_task_whose_declarations_fail_is_not_checked_further():
    results = conformance_tasks.run_task_checks(UnnamedForcing)
    assert "memory_forcing names ['forcing']" in results[0].detail
    assert not any(r.passed for r in results) and all("not run" in r.detail for r in results[1:])


def test_check_task_command(capsys):
    assert main(["check", "--task", "no_harm"]) == 0
    out = capsys.readouterr().out
    assert "task no_harm: 8 of 8 checks pass" in out and "FAIL" not in out
    assert main(["check", "--task", "tests.test_conformance:WrongOracle"]) == 1
    assert "failed: oracle" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["check", "--task", "no_such_task"], "unknown task 'no_such_task'"),
    (["check", "--task", "no_such_module:Task"], "cannot load task"),
    (["check", "--task", "occlusion", "--option", "hide=start"], "hide 'start' is not one of middle, end"),
    (["check", "--task", "no_harm", "--option", "bogus=1"], "unexpected keyword argument 'bogus'"),
    (["check"], "check takes a MODEL or --task TASK"),
    (["check", "base", "--task", "no_harm"], "check takes a MODEL or --task TASK"),
])
def test_check_task_command_refuses_bad_input_in_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
