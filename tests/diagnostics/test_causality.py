"""The causality probe can fail: toy backbones that leak in different ways, one built leaking (Tensor
Memory's reference state threading), non-finite outputs; a constant one is insensitive, a causal toy
causal; the positions it probes cover both ends."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.contracts.helpers import NAMES, D, S, build
from tmem_bench.diagnostics.causality import causality_probe


class ToyBackbone(nn.Module):
    def __init__(self, mix):
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.mix = mix

    def forward(self, x, blocked=None):
        return self.mix(self.proj(x))


LEAKS = {
    "mean over the sequence": lambda x: x + x.mean(dim=1, keepdim=True),
    "peeks at the last token": lambda x: x + x[:, -1:],
    "peeks one token ahead": lambda x: x + torch.roll(x, -1, dims=1),
    "mixes inside chunks of 4": lambda x: x + x.view(x.shape[0], -1, 4, D).mean(2, keepdim=True).expand(-1, -1, 4, -1).reshape(x.shape),
    "reverse cumulative sum": lambda x: x.flip(1).cumsum(1).flip(1),
}


def test_probe_names_non_finite_outputs():
    class NaNs(torch.nn.Module):
        def forward(self, x, blocked=None):
            return x * float("nan")

    assert causality_probe(NaNs(), d_model=4, seq_len=6)["verdict"] == "non-finite"


@pytest.mark.parametrize("leak", LEAKS)
def test_probe_flags_a_leaking_backbone(leak):
    result = causality_probe(ToyBackbone(LEAKS[leak]), D, S)
    assert result["verdict"] == "leaking", result
    assert result["leaking_positions"]


def test_probe_flags_a_leak_in_long_sequences_it_only_samples():
    result = causality_probe(ToyBackbone(LEAKS["peeks at the last token"]), D, 200, max_positions=8)
    assert result["verdict"] == "leaking" and len(result["positions"]) == 8


def test_probe_calls_a_constant_backbone_insensitive():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(D))

        def forward(self, x, blocked=None):
            return self.bias.expand_as(x)

    assert causality_probe(Constant(), D, S)["verdict"] == "insensitive"


def test_probe_calls_a_causal_toy_causal():
    result = causality_probe(ToyBackbone(lambda x: x.cumsum(1)), D, S)
    assert result["verdict"] == "causal" and result["max_past_change"] == 0.0


def test_probe_flags_the_reference_state_threading():
    # The reference hands layer l's end-of-sequence memory to layer l+1 (the paper, arXiv 2605.27686).
    if "tensor" not in NAMES:
        pytest.skip("tensor is not registered")
    try:
        model = build("tensor", threading="reference")
    except TypeError:
        pytest.skip("tensor has no `threading` option")
    assert causality_probe(model, D, S)["verdict"] == "leaking"


def test_probe_positions_cover_both_ends_and_reject_too_few():
    from tmem_bench.diagnostics.causality import probe_positions

    positions = probe_positions(500, 10, torch.Generator().manual_seed(0))
    assert len(positions) == 10 and positions[0] == 1 and positions[-1] == 499
    assert probe_positions(6, 10, torch.Generator()) == [1, 2, 3, 4, 5]
    assert probe_positions(S, 32, torch.Generator()) == list(range(1, S))  # the registry tests probe every t
    with pytest.raises(ValueError, match="max_positions"):
        probe_positions(500, 1, torch.Generator())
