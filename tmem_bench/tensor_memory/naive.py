"""The naive twin of Tensor Memory: the plain per-step loop, written for clarity.

nn.Conv3d for the factorised operator, F.grid_sample for the read, the write
volume built over the full 3D grid of cell centres. It uses the weights of a
`TensorMemory` unchanged, so the fast path can be checked against it: the tests
hold every scan kernel to it (outputs and gradients) and the benchmarks time it.
Shipped in the package, as flash-linear-attention ships its naive.py files, so
either imports it as `tmem_bench.tensor_memory.naive`.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .layer import MemoryState, TensorMemory


class NaiveTensorMemory(TensorMemory):
    def write_volume(self, write_in: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """(B, d), (B, 3) -> (B, C, D, H, W)."""
        D, H, W = self.config.grid
        content = self.content(write_in)  # (B, C)
        if self.config.write_mode == "hard":
            idx = [((mu[:, k].detach() + 1) * 0.5 * (n - 1)).round().clamp(0, n - 1).long()
                   for k, n in ((2, D), (1, H), (0, W))]
            vol = torch.zeros(write_in.shape[0], D, H, W, dtype=write_in.dtype, device=write_in.device)
            vol[torch.arange(write_in.shape[0]), idx[0], idx[1], idx[2]] = 1.0
        else:
            z, y, x = torch.meshgrid(
                *(torch.linspace(-1, 1, n, dtype=write_in.dtype, device=write_in.device) for n in (D, H, W)),
                indexing="ij",
            )
            centres = torch.stack([x, y, z], dim=-1)  # (D, H, W, 3) in grid_sample's (x, y, z) order
            sigma = self.config.sigma_scale * (F.softplus(self.spread(write_in)) + 1e-4)  # (B, 1)
            dist2 = ((centres[None] - mu[:, None, None, None]) ** 2).sum(-1)  # (B, D, H, W)
            vol = torch.exp(-dist2 / (2 * sigma[:, :, None, None] ** 2 + 1e-6))
        return content[:, :, None, None, None] * vol[:, None]

    def forward(self, x: torch.Tensor, state: MemoryState | None = None, output_final_state: bool = True):
        B, S, d = x.shape
        K = self.config.chunk_size
        if state is None:
            state = self.init_state(B, x.device, x.dtype)
        h, c = state
        write_head = self.coord_write or self.coord
        reads = []
        for start in range(0, S, K):
            chunk = x[:, start:start + K]
            chunk = F.pad(chunk, (0, 0, 0, K - chunk.shape[1]))  # zero-padded partial last chunk
            mu_read = torch.tanh(self.coord(chunk[:, 0]))  # (B, 3)
            sample = F.grid_sample(h, mu_read[:, None, None, None], mode="bilinear",
                                   padding_mode="border", align_corners=True)  # (B, C, 1, 1, 1)
            reads.append(self.read_out(sample.flatten(1)))
            write_in = self.write_proj(chunk.reshape(B, K * d))
            mu_write = torch.tanh(write_head(write_in))
            u = torch.cat([self.write_volume(write_in, mu_write), h], dim=1)  # (B, 2C, D, H, W)
            if self.config.update == "factorised":
                u = self.conv_w(self.conv_h(self.conv_d(u)))
            i, f, o, g = self.mix(u).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        read = torch.stack(reads, dim=1).repeat_interleave(K, dim=1)[:, :S]  # (B, S, d)
        return read, MemoryState(h, c) if output_final_state else None


def naive_twin(model):
    """A copy of a model (a TensorMemory, or any module holding one) whose memory runs the naive loop."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if type(module) is TensorMemory:
            module.__class__ = NaiveTensorMemory
    return twin
