"""What the task families' tests share."""
from __future__ import annotations

import torch


def cut(blocked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) of an (S, S) mask: the rows with a blocked edge, and the columns blocked for any of them."""
    return blocked.any(1), blocked.any(0)
