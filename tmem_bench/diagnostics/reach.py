"""The information-reach probe: can the answer depend on the evidence at all?

The gradient of the backbone's outputs at the answer tokens (projected on a fixed random
direction) is taken with respect to every input token. Its mean norm over the evidence
tokens, relative to its mean norm over the answer tokens themselves, says whether a path
from the evidence to the answer exists (an attention-only model under memory forcing has
none: the ratio is exactly zero), exists but carries almost no gradient (a tiny ratio), or
carries gradient. Probed at initialisation and on the trained weights, it tells "no path"
from "a path that was not learned".
"""
from __future__ import annotations

import torch

from ..contracts.model import TaskModel
from ..contracts.task import Batch, Level, Task


def reach_probe(model: TaskModel, task: Task, level: Level, batch: Batch, seed: int = 0) -> dict | None:
    """{"evidence_grad", "answer_grad", "ratio"} on `batch` (drawn at `level`), in eval mode; None
    when the task names no evidence (no memory axis)."""
    positions = task.reach_positions(level, batch)
    if positions is None:
        return None
    evidence, answer = (p.to(batch["target"].device) for p in positions)  # (S,), (S,)
    was_training = model.training
    model.eval()
    try:
        # cuDNN's recurrent kernels take no backward pass in eval mode, and eval mode is what keeps
        # dropout out of the gradient: the plain kernels do both.
        with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
            x = model.adapter(batch).detach().requires_grad_(True)  # (B, S, d)
            h = model.backbone(x, blocked=model.adapter.blocked(batch))  # (B, S, d)
            out = h[:, answer]  # (B, A, d)
            direction = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
            (grad,) = torch.autograd.grad((out * direction).sum(), x)  # (B, S, d)
    finally:
        model.train(was_training)
    per_token = grad.detach().float().norm(dim=-1)  # (B, S)
    evidence_grad = per_token[:, evidence].mean().item()
    answer_grad = per_token[:, answer].mean().item()
    return {
        "evidence_grad": evidence_grad,
        "answer_grad": answer_grad,
        "ratio": evidence_grad / answer_grad if answer_grad > 0 else None,
    }
