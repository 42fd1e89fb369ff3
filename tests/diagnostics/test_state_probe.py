"""The state probe (tmem_bench.diagnostics.state_probe): it answers every query from a state that
stores each value at its key's slot, is at chance from a constant state, chooses the readout of its
family best on its own validation sequences, reports attention alone as having no state, and says so
where a task cannot be probed; on the reference states of known content (probe_references) it reads
each within its goal and the empty ones at chance. The state hook it reads is tested in
tests/contracts/test_model.py, a run probed in tests/harness/test_probe_run.py."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from tmem_bench.contracts.model import TaskModel
from tmem_bench.contracts.task import Adapter, Task
from tmem_bench.diagnostics.probe_readouts import READOUTS
from tmem_bench.diagnostics.state_probe import (NO_STATE, PROBED, ReadoutConfig, StateReader, describe_readout,
                                                probe_model)
from tmem_bench.errors import UsageError
from tmem_bench.registry import get_backbone

SLOTS, VALUES, WRITES, QUERIES = 4, 8, 3, 4


SMALL = ReadoutConfig(readouts=("gated",), width=64, query_width=32, steps=300, batch_size=64, queries=QUERIES,
                      lr=3e-3, validation_size=256, validate_every=100)


class LookupAdapter(Adapter):
    """Write tokens [one-hot slot, one-hot value, 0], then query tokens [one-hot slot, 0, 1]."""

    def forward(self, batch):
        slots = nn.functional.one_hot(torch.cat([batch["slots"], batch["asked"]], 1), SLOTS).float()
        values = nn.functional.one_hot(batch["values"], VALUES).float()
        values = torch.cat([values, values.new_zeros(values.shape[0], QUERIES, VALUES)], 1)
        is_query = (torch.arange(WRITES + QUERIES, device=slots.device) >= WRITES).float()
        is_query = is_query.expand(slots.shape[0], -1)[..., None]
        return torch.cat([slots, values, is_query], dim=-1)  # (B, W + Q, SLOTS + VALUES + 1)


class Lookup(Task):
    """WRITES distinct slots get a value each; each query names a written slot and asks its value."""
    name = "lookup"
    n_classes = VALUES

    def sample(self, level, batch_size, generator):
        slots = torch.rand(batch_size, SLOTS, generator=generator).argsort(-1)[:, :WRITES]
        values = torch.randint(0, VALUES, (batch_size, WRITES), generator=generator)
        picked = torch.randint(0, WRITES, (batch_size, QUERIES), generator=generator)
        return {"slots": slots, "values": values, "asked": slots.gather(1, picked), "target": values.gather(1, picked)}

    def reach_positions(self, level, batch):
        writes = torch.arange(WRITES + QUERIES) < WRITES
        return writes, ~writes

    def make_adapter(self, d_model):
        return LookupAdapter()


class ExactSlots(nn.Module):
    """A plug-in whose state holds each written value one-hot at its key's slot: (B, SLOTS, VALUES)."""

    def forward(self, x, blocked=None):
        return x

    def memory_state(self, x, blocked=None):
        return {"slots": torch.einsum("bsk,bsv->bkv", x[..., :SLOTS], x[..., SLOTS:SLOTS + VALUES])}


class ConstantState(ExactSlots):
    def memory_state(self, x, blocked=None):
        return {"slots": torch.ones(x.shape[0], SLOTS, VALUES)}


def probe(backbone, config=SMALL, device=torch.device("cpu")):
    task = Lookup()
    eval_batch = task.sample({}, 512, torch.Generator().manual_seed(123))
    return probe_model(TaskModel(task.make_adapter(0), backbone), task, {}, eval_batch, config, device=device)


def test_the_probe_answers_every_query_from_a_state_that_holds_each_value_at_its_key():
    result = probe(ExactSlots())
    assert result["status"] == PROBED and result["state_floats"] == SLOTS * VALUES
    assert result["probe_accuracy"] == 1.0


def test_the_probe_is_at_chance_from_a_constant_state():
    result = probe(ConstantState())
    # 2,048 queries: four standard deviations of a binomial at chance are 0.03.
    assert abs(result["probe_accuracy"] - 1 / VALUES) < 0.03


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@CUDA
def test_on_cuda_the_probe_reads_the_states_and_queries_it_reads_on_the_cpu():
    task = Lookup()
    model = TaskModel(task.make_adapter(0), ExactSlots())
    batch = task.sample({}, 64, torch.Generator().manual_seed(5))
    on_cpu = StateReader(model, task, {}, torch.device("cpu"))(batch)
    on_cuda = StateReader(model.to("cuda"), task, {}, torch.device("cuda"))(batch)
    for cpu, cuda in zip(on_cpu, on_cuda):
        assert cuda.is_cuda and torch.allclose(cpu, cuda.cpu())


@CUDA
def test_on_cuda_the_probe_answers_every_query_from_an_exact_state_and_none_from_a_constant():
    cuda = torch.device("cuda")
    assert probe(ExactSlots(), device=cuda)["probe_accuracy"] == 1.0
    assert abs(probe(ConstantState(), device=cuda)["probe_accuracy"] - 1 / VALUES) < 0.03


def test_the_probe_is_deterministic_for_its_seed():
    config = ReadoutConfig(width=16, query_width=16, mlp_width=16, bilinear_units=8, bilinear_query=8,
                           bilinear_rank=16, attention_width=16, learned_rows=4, steps=40, batch_size=16,
                           queries=QUERIES, validation_size=64, validate_every=20)
    config = replace(config, readouts=READOUTS)
    first = probe(ExactSlots(), config)
    assert set(first["readouts"]) == set(READOUTS) and first == probe(ExactSlots(), config)


def test_the_readout_best_on_validation_is_chosen_and_every_member_reported():
    config = replace(SMALL, readouts=("gated", "attention"), steps=100, attention_width=32)
    result = probe(ExactSlots(), config)
    members = result["readouts"]
    assert set(members) == {"gated", "attention"}
    assert result["readout"] == max(members, key=lambda n: members[n]["validation"])
    assert result["probe_accuracy"] == members[result["readout"]]["evaluation"]
    assert result["probe_validation_accuracy"] == members[result["readout"]]["validation"]


def test_an_unknown_readout_is_refused_in_one_line():
    with pytest.raises(UsageError, match="readouts nope unknown; known: gated, mlp"):
        ReadoutConfig(readouts=("gated", "nope"))


def test_attention_alone_has_no_state_to_probe():
    result = probe(get_backbone("base", d_model=SLOTS + VALUES + 1, n_layers=1, n_heads=1))
    assert result == {"status": NO_STATE}


def test_the_readout_is_described_with_its_capacity_seeds_and_steps():
    text = describe_readout(ReadoutConfig(width=77, steps=333, seed=5))
    assert "77 hidden units" in text and "333 steps" in text and "seed 5" in text and "no state to probe" in text


def test_a_task_with_several_answer_tokens_per_target_is_reported_not_probed():
    """Occlusion marks every token of the last frame as an answer for its one target: the probe
    has no single query token to read, and says so instead of raising."""
    from tmem_bench.diagnostics.state_probe import probe_problem
    from tmem_bench.registry import get_task

    occlusion = get_task("occlusion", n_frames=4, hide="end", block_hidden=True)
    level = occlusion.validate_level({"occlusion_len": 2})
    batch = occlusion.sample(level, 2, torch.Generator().manual_seed(0))
    assert "one answer token per target" in probe_problem(occlusion, level, batch)
    binding = get_task("coordinate_binding", block_queries=True)
    level = binding.validate_level({"n_writes": 5, "noise": 0.05})
    assert probe_problem(binding, level, binding.sample(level, 2, torch.Generator().manual_seed(0))) is None
