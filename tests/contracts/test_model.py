"""The state hook (memory_state, tmem_bench.contracts.model) of every registered model: present exactly
where a model carries a state, a per-sequence state of the prefix it was given that changes nothing the
model computes, and the states of the recurrences it stands for."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tmem_bench.baselines.delta import gated_delta_recurrent
from tmem_bench.baselines.ssm import ssd_recurrent
from tmem_bench.registry import backbone_names, get_backbone


# Attention alone: its cache grows with the sequence, so there is no fixed state to read.
NO_STATE_MODELS = {"base", "local", "base_wide", "registers", "xl"}


MEMORIES = {"tensor", "tensor_local", "linear", "delta", "ssm", "lstm", "slots"}


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
