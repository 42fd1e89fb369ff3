"""A memory beside attention: the generic memory-augmented transformer any Memory plugs into.

A Memory (`init_state(batch)`, `forward(x, state) -> (read, state)`) is attached
after every transformer block, with the paper's per-layer LayerNorm and gate:

    x = x + sigmoid(gamma_l) * dropout(memory(LayerNorm_l(x)))

so every memory gets the gate values, the switch that turns it off (the report's
memory reliance) and its state bytes from here, whatever it is. Tensor Memory
(`tmem_bench.tensor_memory`) is one such memory; nothing here knows it.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn as nn

from .transformer import Transformer, TransformerConfig

THREADINGS = ("per_layer", "reference")


class Memory(Protocol):
    """What the memory-augmented transformer needs from a memory. A forward that also takes
    `output_final_state: bool = True` is told when nobody reads the final state, and may
    then return None for it and skip the work. Optional: `state_size(bytes_per_element)`,
    the bytes of one sequence's state, and `scan_kernel()`, which implementation ran where
    the memory chooses one per machine (both end up in each cell's result)."""

    def init_state(self, batch: int): ...

    def forward(self, x: torch.Tensor, state) -> tuple[torch.Tensor, object]: ...


def state_tensors(state) -> dict[str, torch.Tensor]:
    """A memory's state as named tensors: one tensor, a NamedTuple's fields, a tuple's or a dict's
    entries; what is not a tensor is left out (so a state of other objects has nothing to probe)."""
    if isinstance(state, torch.Tensor):
        return {"state": state}
    if hasattr(state, "_asdict"):
        state = state._asdict()
    elif isinstance(state, (tuple, list)):
        state = {str(i): t for i, t in enumerate(state)}
    if not isinstance(state, dict):
        return {}
    return {str(k): t for k, t in state.items() if isinstance(t, torch.Tensor)}


@dataclass
class MemoryTransformerConfig(TransformerConfig):
    gate_init: float = 0.0
    threading: str = "per_layer"

    def __post_init__(self):
        super().__post_init__()
        if self.threading not in THREADINGS:
            raise ValueError(f"threading must be one of {', '.join(THREADINGS)}, got {self.threading!r}")


class MemoryTransformer(Transformer):
    """Pre-norm transformer blocks, each followed by a gated read of one shared Memory.

    threading "per_layer": every layer's scan starts from the memory's initial state,
    so the model stays strictly causal. "reference": layer l+1 starts from layer l's
    state after the whole sequence, as the reference implementation does; a token
    can then read what later tokens wrote (the causality probe flags it).
    """

    windowed = True  # the blocks are the skeleton's attention, which the window restricts

    def __init__(self, config: MemoryTransformerConfig, memory: nn.Module):
        super().__init__(config)
        self.memory = memory
        self._final_state_optional = "output_final_state" in inspect.signature(memory.forward).parameters
        self.mem_norms = nn.ModuleList(nn.LayerNorm(config.d_model) for _ in range(config.n_layers))
        self.gammas = nn.Parameter(torch.full((config.n_layers,), float(config.gate_init)))
        self.mem_dropout = nn.Dropout(config.dropout)
        self._memory_off = False
        # The final norm goes last among the children, as it did before this class derived from
        # Transformer: parameter order sets the order of the clipped gradient norm's sum, and so
        # the bits of every clipped step of a seed.
        self.ln_f = self._modules.pop("ln_f")

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(x, blocked, None)

    def memory_state(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The state hook (`tmem_bench.contracts.model`): every layer's memory state after the last token,
        its tensors named "layer<i>.<field>" (a NamedTuple's fields, a dict's keys, "state" for one tensor)."""
        states = []
        self._run(x, blocked, states)
        return {f"layer{i}.{name}": t for i, state in enumerate(states) for name, t in state_tensors(state).items()}

    def _run(self, x: torch.Tensor, blocked: torch.Tensor | None, states: list | None) -> torch.Tensor:
        mask = self.mask(x.shape[1], x.device, blocked)
        gates = torch.sigmoid(self.gammas)
        state = None
        for layer, block in enumerate(self.blocks):
            x = block(x, mask)  # (B, S, d)
            if self._memory_off:
                continue
            threaded = self.config.threading == "reference"
            start = state if threaded and state is not None else self.memory.init_state(x.shape[0])
            # Only "reference" threading reads a final state, and only below the last layer (or the hook).
            final = (threaded and layer < len(self.blocks) - 1) or states is not None
            wanted = {"output_final_state": final} if self._final_state_optional else {}
            read, state = self.memory(self.mem_norms[layer](x), start, **wanted)
            if states is not None:
                states.append(state)
            x = x + gates[layer] * self.mem_dropout(read)
        return self.ln_f(x)

    def gate_values(self) -> dict[str, float]:
        return {f"layer{i}": float(g) for i, g in enumerate(torch.sigmoid(self.gammas.detach()))}

    @contextlib.contextmanager
    def memory_disabled(self):
        """Gates forced to zero (the memory path contributes nothing), weights untouched."""
        previous, self._memory_off = self._memory_off, True
        try:
            yield
        finally:
            self._memory_off = previous

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens at inference: the KV cache plus one memory state per layer."""
        memory = self.memory.state_size(bytes_per_element) if hasattr(self.memory, "state_size") else 0
        return self.kv_cache_size(seq_len, bytes_per_element) + self.config.n_layers * memory

    def scan_kernel(self) -> str | None:
        """The memory's own `scan_kernel()`, for the record; None where it has no choice to make."""
        scan_kernel = getattr(self.memory, "scan_kernel", None)
        return scan_kernel() if callable(scan_kernel) else None
