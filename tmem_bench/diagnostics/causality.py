"""The causality probe: change the inputs from a position t on and check that no output before t moves.

A backbone is causal when the output at position i depends only on inputs at
positions <= i. Replacing the whole suffix x[t:] (not only x[t]) tests every
future input at once, so a leak from any later position to any earlier output is
caught whenever the probed t falls between them; probing every t (or, for long
sequences, t = 1, t = S-1 and a random sample in between) leaves no pair untested.
Each probed position is one row of a batch, so the probe costs two forward passes
per trial whatever the number of positions.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def probe_positions(seq_len: int, max_positions: int, generator: torch.Generator) -> list[int]:
    """Positions t to perturb from: all of 1..S-1, or the two ends plus a random sample in between."""
    if max_positions < 2:
        raise ValueError(f"max_positions must be at least 2 (both ends), got {max_positions}")
    if seq_len == 1:
        return [0]
    if seq_len - 1 <= max_positions:
        return list(range(1, seq_len))
    inner = torch.randperm(seq_len - 3, generator=generator)[: max_positions - 2] + 2
    return sorted({1, seq_len - 1, *inner.tolist()})


@torch.no_grad()
def causality_probe(
    backbone: nn.Module,
    d_model: int,
    seq_len: int,
    blocked: torch.Tensor | None = None,
    trials: int = 2,
    seed: int = 0,
    device: str | torch.device = "cpu",
    rtol: float = 1e-5,
    max_positions: int = 32,
    train_mode: bool = False,
) -> dict:
    """Verdict "causal", "leaking" (an output before the perturbed position changed),
    "insensitive" (no output changed at all, so the probe proved nothing) or
    "non-finite" (an output was NaN or infinite, so nothing could be compared).

    Changes are measured relative to 1 + the largest output magnitude, so `rtol`
    tolerates float reordering but not a real dependence. The backbone runs in eval
    mode (no dropout), or with `train_mode` in train mode, where a leak may hide behind
    `self.training`; both passes of a trial then draw the same dropout masks, so that
    different masks are not taken for a dependence. It is returned to its previous mode.
    """
    was_training = backbone.training
    backbone.train(train_mode)
    generator = torch.Generator().manual_seed(seed)
    max_past = max_future = 0.0
    leaks: set[int] = set()
    finite = True
    positions = probe_positions(seq_len, max_positions, generator)
    t = torch.tensor(positions)
    after = torch.arange(seq_len)[None, :] >= t[:, None]  # (P, S): row r perturbs positions >= t_r
    try:
        for trial in range(trials):
            x = torch.randn(len(positions), seq_len, d_model, generator=generator)
            x2 = torch.where(after[..., None], torch.randn(x.shape, generator=generator), x)
            y, y2 = (_forward(backbone, inputs.to(device), blocked, seed + trial, device) for inputs in (x, x2))
            finite &= bool(torch.isfinite(y).all() and torch.isfinite(y2).all())
            scale = 1.0 + y.abs().max().item()
            change = (y - y2).abs().amax(dim=-1) / scale  # (P, S)
            past = change.masked_fill(after, 0.0).amax(dim=-1)  # (P,)
            max_past = max(max_past, past.max().item())
            max_future = max(max_future, change.masked_fill(~after, 0.0).max().item())
            leaks.update(t[past > rtol].tolist())
    finally:
        backbone.train(was_training)
    if not finite:
        verdict = "non-finite"  # NaN compares unequal to everything: no change can be measured
    elif max_past > rtol:
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
        "leaking_positions": sorted(leaks),
        "seq_len": seq_len,
        "trials": trials,
        "mode": "train" if train_mode else "eval",
    }


def _forward(backbone: nn.Module, x: torch.Tensor, blocked, seed: int, device) -> torch.Tensor:
    """One pass with the global generators at `seed`, restored afterwards: the caller's own random
    stream is left as it was, and two passes with one seed draw the same dropout masks."""
    device = torch.device(device)
    cuda = None if device.type != "cuda" else device.index if device.index is not None else torch.cuda.current_device()
    with torch.random.fork_rng(devices=[] if cuda is None else [cuda]):
        torch.default_generator.manual_seed(seed)
        if cuda is not None:
            torch.cuda.default_generators[cuda].manual_seed(seed)
        return backbone(x, blocked=blocked).float().cpu()
