"""The causality probe: perturb one position and check that no earlier output moves."""
from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def causality_probe(
    backbone: nn.Module,
    d_model: int,
    seq_len: int,
    blocked: torch.Tensor | None = None,
    batch_size: int = 4,
    trials: int = 4,
    seed: int = 0,
    device: str | torch.device = "cpu",
    rtol: float = 1e-5,
) -> dict:
    """Verdict "causal", "leaking" (an output before the perturbed position changed)
    or "insensitive" (no output changed at all, so the probe proved nothing).

    Each trial replaces the input at a random position t >= 1 and compares the
    outputs at positions < t (must not change) and >= t (should change).
    """
    was_training = backbone.training
    backbone.eval()
    generator = torch.Generator().manual_seed(seed)
    max_past = max_future = 0.0
    positions = []
    try:
        for _ in range(trials):
            t = int(torch.randint(1, seq_len, (1,), generator=generator)) if seq_len > 1 else 0
            x = torch.randn(batch_size, seq_len, d_model, generator=generator)
            x2 = x.clone()
            x2[:, t] = torch.randn(batch_size, d_model, generator=generator)
            y = backbone(x.to(device), blocked=blocked).float().cpu()
            y2 = backbone(x2.to(device), blocked=blocked).float().cpu()
            scale = 1.0 + y.abs().max().item()
            max_past = max(max_past, (y[:, :t] - y2[:, :t]).abs().max().item() / scale if t else 0.0)
            max_future = max(max_future, (y[:, t:] - y2[:, t:]).abs().max().item() / scale)
            positions.append(t)
    finally:
        backbone.train(was_training)
    if max_past > rtol:
        verdict = "leaking"
    elif max_future <= rtol:
        verdict = "insensitive"
    else:
        verdict = "causal"
    return {
        "verdict": verdict,
        "max_past_change": max_past,
        "max_future_change": max_future,
        "positions": positions,
        "seq_len": seq_len,
    }
