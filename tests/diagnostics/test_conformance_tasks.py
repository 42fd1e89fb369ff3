"""The task checks (tmem_bench.diagnostics.conformance_tasks, `tmem-bench check --task`): a toy task
that passes them all, and one broken for each check."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tmem_bench.cli import main
from tmem_bench.contracts.task import Adapter, Task
from tmem_bench.diagnostics import conformance_tasks
from tmem_bench.errors import check_int


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
    assert "task no_harm: 9 of 9 checks pass" in out and "FAIL" not in out
    assert main(["check", "--task", f"{__name__}:WrongOracle"]) == 1
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
