"""`lstm` and `gru`: a stack of LSTM (or GRU) layers of width d_model, the classic recurrent
reference points (the GRU is POPGym's strongest memory model).

Both take the common factory signature so any task can build them: `n_heads` is
accepted and ignored (a recurrent cell has no heads), and a task's `blocked` mask has
nothing to act on (there is no attention; the recurrent state is never masked).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from tmem_bench.errors import check_int


@dataclass
class LSTMConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4  # ignored
    dropout: float = 0.1  # between stacked layers, as nn.LSTM applies it

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads"):
            setattr(self, name, check_int(name, getattr(self, name)))
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class LSTM(nn.Module):
    fixed_state = True

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.lstm = nn.LSTM(
            config.d_model, config.d_model, config.n_layers, batch_first=True,
            dropout=config.dropout if config.n_layers > 1 else 0.0,
        )
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        y, _ = self.lstm(x)  # (B, S, d)
        return self.ln_f(y)

    def memory_state(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The state hook (`tmem_bench.contracts.model`): h and the cell c of every layer after the last
        token, (B, n_layers, d) each."""
        _, (h, c) = self.lstm(x)
        return {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: h and c of every layer, independent of seq_len."""
        return 2 * self.config.n_layers * self.config.d_model * bytes_per_element


class GRU(nn.Module):
    """The LSTM's stack with GRU layers: one state vector per layer, no separate cell."""
    fixed_state = True

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.gru = nn.GRU(config.d_model, config.d_model, config.n_layers, batch_first=True,
                          dropout=config.dropout if config.n_layers > 1 else 0.0)
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        return self.ln_f(self.gru(x)[0])  # (B, S, d)

    def memory_state(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """h of every layer after the last token, (B, n_layers, d)."""
        return {"h": self.gru(x)[1].transpose(0, 1)}

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        return self.config.n_layers * self.config.d_model * bytes_per_element


def lstm(d_model: int, n_layers: int, n_heads: int, **options) -> LSTM:
    return LSTM(LSTMConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options))


def gru(d_model: int, n_layers: int, n_heads: int, **options) -> GRU:
    return GRU(LSTMConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options))
