"""The state probe (tmem_bench.diagnostics.state_probe) and the state hook it reads (`memory_state`, tmem_bench.contracts.model):
a readout answers every query from a state that stores each value at its key's slot, is at chance from
a constant state, and reports attention alone as having no state; every registered model's hook gives
a per-sequence state of the prefix it was given, changing nothing the model computes."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from tmem_bench.baselines.delta import gated_delta_recurrent
from tmem_bench.baselines.ssm import ssd_recurrent
from tmem_bench.cli import main
from tmem_bench.contracts.model import TaskModel
from tmem_bench.contracts.task import Adapter, Task
from tmem_bench.diagnostics.state_probe import NO_STATE, PROBED, ReadoutConfig, describe_readout, probe_model
from tmem_bench.errors import UsageError
from tmem_bench.harness.probe_run import probe_run
from tmem_bench.registry import backbone_names, get_backbone

SLOTS, VALUES, WRITES, QUERIES = 4, 8, 3, 4
SMALL = ReadoutConfig(width=64, query_width=32, steps=300, batch_size=64, queries=QUERIES, lr=3e-3,
                      validation_size=256, validate_every=100)
# Attention alone: its cache grows with the sequence, so there is no fixed state to read.
NO_STATE_MODELS = {"base", "local", "base_wide", "registers", "xl"}
MEMORIES = {"tensor", "tensor_local", "linear", "delta", "ssm", "lstm", "slots"}


class LookupAdapter(Adapter):
    """Write tokens [one-hot slot, one-hot value, 0], then query tokens [one-hot slot, 0, 1]."""

    def forward(self, batch):
        slots = nn.functional.one_hot(torch.cat([batch["slots"], batch["asked"]], 1), SLOTS).float()
        values = nn.functional.one_hot(batch["values"], VALUES).float()
        values = torch.cat([values, values.new_zeros(values.shape[0], QUERIES, VALUES)], 1)
        is_query = (torch.arange(WRITES + QUERIES) >= WRITES).float().expand(slots.shape[0], -1)[..., None]
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


def probe(backbone, config=SMALL):
    task = Lookup()
    eval_batch = task.sample({}, 512, torch.Generator().manual_seed(123))
    return probe_model(TaskModel(task.make_adapter(0), backbone), task, {}, eval_batch, config)


def test_the_probe_answers_every_query_from_a_state_that_holds_each_value_at_its_key():
    result = probe(ExactSlots())
    assert result["status"] == PROBED and result["state_floats"] == SLOTS * VALUES
    assert result["probe_accuracy"] == 1.0


def test_the_probe_is_at_chance_from_a_constant_state():
    result = probe(ConstantState())
    # 2,048 queries: four standard deviations of a binomial at chance are 0.03.
    assert abs(result["probe_accuracy"] - 1 / VALUES) < 0.03


def test_the_probe_is_deterministic_for_its_seed():
    config = ReadoutConfig(width=16, query_width=16, steps=40, batch_size=16, queries=QUERIES,
                           validation_size=64, validate_every=20)
    assert probe(ExactSlots(), config) == probe(ExactSlots(), config)


def test_attention_alone_has_no_state_to_probe():
    result = probe(get_backbone("base", d_model=SLOTS + VALUES + 1, n_layers=1, n_heads=1))
    assert result == {"status": NO_STATE}


def test_the_readout_is_described_with_its_capacity_seeds_and_steps():
    text = describe_readout(ReadoutConfig(width=77, steps=333, seed=5))
    assert "77 hidden units" in text and "333 steps" in text and "seed 5" in text and "no state to probe" in text


# The hook of every registered model.

def small(name):
    torch.manual_seed(0)
    return get_backbone(name, d_model=16, n_layers=2, n_heads=2).eval()


@pytest.mark.parametrize("name", backbone_names())
def test_the_state_hook_is_present_exactly_where_a_model_carries_a_state(name):
    has_state = bool(getattr(small(name), "memory_state", None) and small(name).memory_state(torch.randn(1, 3, 16)))
    if name in NO_STATE_MODELS:
        assert not has_state
    if name in MEMORIES:
        assert has_state


@pytest.mark.parametrize("name", backbone_names())
def test_the_state_hook_gives_each_sequence_its_state_and_changes_nothing(name):
    model = small(name)
    if not getattr(model, "memory_state", None):
        pytest.skip(f"{name} has no state hook")
    x = torch.randn(3, 11, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(x)
        state = model.memory_state(x)
        alone = model.memory_state(x[1:2])
        shorter = model.memory_state(x[:, :6])
        after = model(x)
    if not state:
        pytest.skip(f"{name} has no state to probe")
    assert torch.equal(before, after)
    for key, tensor in state.items():
        assert isinstance(tensor, torch.Tensor) and tensor.shape[0] == 3 and torch.isfinite(tensor).all(), key
        torch.testing.assert_close(alone[key], tensor[1:2], atol=1e-5, rtol=1e-4)
    assert set(shorter) == set(state) and any(not torch.allclose(shorter[k], state[k]) for k in state)
    assert any(not torch.allclose(state[k][0], state[k][2]) for k in state)


def test_the_matrix_states_are_those_of_the_token_by_token_recurrences():
    x = torch.randn(2, 37, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        mixer = small("delta").blocks[0].attn
        _, reference = gated_delta_recurrent(*mixer.rule_inputs(x))
        torch.testing.assert_close(mixer.final_state(x)["S"], reference, atol=1e-5, rtol=1e-4)
        mixer = small("ssm").blocks[0].attn
        _, u, dt, a, B, C = mixer.scan_inputs(x)
        _, reference = ssd_recurrent(u * dt[..., None], a, B, C)
        torch.testing.assert_close(mixer.final_state(x)["H"], reference, atol=1e-5, rtol=1e-4)
        mixer = small("linear").blocks[0].attn
        B_, S, D = x.shape
        _, k, v = mixer.qkv(x).view(B_, S, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
        k = nn.functional.elu(k) + 1
        state = sum(k[:, :, t, :, None] * v[:, :, t, None, :] for t in range(S))
        torch.testing.assert_close(mixer.final_state(x)["S"], state, atol=1e-5, rtol=1e-4)


def test_tensor_memory_gives_its_final_state_per_layer():
    model = small("tensor")
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        state = model.memory_state(x)
        first = model.blocks[0](x, model.mask(9, x.device, None))
        _, own = model.memory(model.mem_norms[0](first), model.memory.init_state(2))
    assert sorted(state) == ["layer0.c", "layer0.h", "layer1.c", "layer1.h"]
    torch.testing.assert_close(state["layer0.h"], own.h)
    torch.testing.assert_close(state["layer0.c"], own.c)


# A run directory probed from the command line.

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "run"
    assert main(["run", "coordinate_binding", "--models", "base,lstm", "--steps", "3", "--batch-size", "8",
                 "--level", "n_writes=4", "--seeds", "1", "--out", str(out), "--no-report"]) == 0
    return out


def test_a_run_is_probed_into_state_probe_json_and_resumed(tiny_run, capsys, monkeypatch):
    assert main(["probe", str(tiny_run), "--steps", "20"]) == 0
    doc = json.loads((tiny_run / "state_probe.json").read_text())
    assert doc["readout_config"]["steps"] == 20 and "20 steps" in doc["readout"]
    by_label = {}
    for row in doc["rows"]:
        by_label.setdefault(row["label"], []).append(row)
    assert {r["status"] for r in by_label["base"]} == {NO_STATE}
    assert all(r["probe_accuracy"] is None for r in by_label["base"])
    assert {r["status"] for r in by_label["lstm"]} == {PROBED}
    assert all(0.0 <= r["probe_accuracy"] <= 1.0 and r["n_writes"] == 4 for r in by_label["lstm"])
    assert "no state to probe" in capsys.readouterr().out

    def never(*args, **kwargs):
        raise AssertionError("a probed cell was probed again")

    monkeypatch.setattr("tmem_bench.diagnostics.state_probe.probe_model", never)
    assert probe_run(tiny_run, config=ReadoutConfig(steps=20), say=lambda line: None)["rows"] == doc["rows"]
    with pytest.raises(UsageError, match="other readout settings"):
        probe_run(tiny_run, config=ReadoutConfig(steps=21))


@pytest.mark.parametrize("args, needle", [
    (["--steps", "0"], "--steps must be an integer >= 1"),
    (["--models", "nope"], "--models: no cells of nope"),
    (["--seeds", "0,x"], "--seeds '0,x' is malformed"),
    (["--weights", "/nonexistent"], "is not a folder"),
])
def test_bad_probe_arguments_are_one_line(tiny_run, capsys, args, needle):
    assert main(["probe", str(tiny_run), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
