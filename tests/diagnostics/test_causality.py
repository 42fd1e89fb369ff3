"""The causality probe can fail: toy backbones that leak in different ways, a constant one, non-finite outputs; the positions it probes."""
from __future__ import annotations

import torch

from tmem_bench.diagnostics.causality import causality_probe


def test_probe_names_non_finite_outputs():
    class NaNs(torch.nn.Module):
        def forward(self, x, blocked=None):
            return x * float("nan")

    assert causality_probe(NaNs(), d_model=4, seq_len=6)["verdict"] == "non-finite"
