"""Tensor Memory: a fixed-size recurrent 3D voxel memory attached to transformer blocks.

Read top to bottom in the order of the paper,
"Tensor Memory: Fixed-Size Recurrent State for Long-Horizon Transformers" (arXiv 2605.27686) (docs/models.md):

1. state: hidden and cell volumes `h`, `c` of shape (B, C, D, H, W), zero at the
   start, never growing with sequence length;
2. chunking: the read input of a chunk is its first token, the write input a
   learned projection of its concatenated tokens;
3. a coordinate head (shared by read and write, or one each) with tanh;
4. trilinear read of `h` (align_corners=True, border padding) and a projection
   back to the token width;
5. Gaussian soft write (or a hard write to the nearest cell) of predicted content
   with predicted spread;
6. the factorised 3D operator (depthwise 3-tap convs along D, H, W, then a
   pointwise mix to 4C) giving ConvLSTM gates; each chunk reads before it writes;
7. the read broadcast to every token of its chunk.

The model (`tensor`) attaches it after every block through the generic
memory-augmented transformer of `tmem_bench.contracts.memory`, with a per-layer LayerNorm and
gate: `x = x + sigmoid(gamma_l) * dropout(memory(LayerNorm_l(x)))`.

The trilinear read and the Gaussian write are both separable (a product of three
1D weight vectors, one per axis), and so are the depthwise convolutions of the
write volume; the implementation uses that and runs the recurrence through the
one-node scan of `kernels.scan`. The plain per-step loop with nn.Conv3d and
F.grid_sample is the naive twin (`naive.py`), which it must agree with.

A sequence whose length is not a multiple of `chunk_size` ends in a partial
chunk: it reads like any other chunk, and its write summary sees the missing
tokens as zeros (the projection's input is zero-padded), so its write only
changes the final state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..contracts.memory import MemoryTransformer, MemoryTransformerConfig
from ..errors import check_int
from .kernels import KERNELS, kernel_that_runs, scan

WRITE_MODES = ("gaussian", "hard")
COORD_HEADS = ("shared", "separate")
UPDATES = ("factorised", "pointwise")


class MemoryState(NamedTuple):
    h: torch.Tensor  # (B, C, D, H, W)
    c: torch.Tensor  # (B, C, D, H, W)


@dataclass
class TensorMemoryConfig:
    d_model: int = 64
    channels: int = 16
    grid: int | tuple[int, int, int] | list = 6  # D, H, W (one int: a cube)
    chunk_size: int = 1
    sigma_scale: float = 1.0
    write_mode: str = "gaussian"
    coord_heads: str = "shared"
    update: str = "factorised"
    kernel: str = "auto"  # the scan: native C, torch.compile'd step, eager; auto = the first available

    def __post_init__(self):
        for name in ("d_model", "channels", "chunk_size"):
            setattr(self, name, check_int(name, getattr(self, name)))
        grid = (self.grid,) * 3 if isinstance(self.grid, int) else tuple(self.grid)
        if len(grid) != 3:
            raise ValueError(f"grid must be a positive integer or three of them (D, H, W), got {self.grid!r}")
        self.grid = tuple(check_int("grid", g) for g in grid)
        if not self.sigma_scale > 0:
            raise ValueError(f"sigma_scale must be positive, got {self.sigma_scale!r}")
        for name, allowed in (("write_mode", WRITE_MODES), ("coord_heads", COORD_HEADS),
                              ("update", UPDATES), ("kernel", KERNELS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")


def cell_centres(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, n, device=like.device, dtype=like.dtype)


def hat_weights(mu: torch.Tensor, n: int) -> torch.Tensor:
    """Trilinear read weights along one axis: (...,) coords in [-1, 1] -> (..., n).

    align_corners=True puts cell i at pixel i of (mu + 1) / 2 * (n - 1); border
    padding clamps the pixel into the grid.
    """
    pixel = ((mu + 1) * 0.5 * (n - 1)).clamp(0, n - 1)
    return F.relu(1 - (pixel.unsqueeze(-1) - torch.arange(n, device=mu.device, dtype=mu.dtype)).abs())


def gaussian_weights(mu: torch.Tensor, sigma: torch.Tensor, n: int) -> torch.Tensor:
    """One axis of the write kernel exp(-|p - mu|^2 / (2 sigma^2 + 1e-6)): (...,) -> (..., n)."""
    d = cell_centres(n, mu) - mu.unsqueeze(-1)
    return torch.exp(-d * d / (2 * sigma * sigma + 1e-6).unsqueeze(-1))


def nearest_weights(mu: torch.Tensor, n: int) -> torch.Tensor:
    """One axis of a hard write: one-hot at the nearest cell centre (no gradient to mu)."""
    index = ((mu.detach() + 1) * 0.5 * (n - 1)).round().clamp(0, n - 1).long()
    return F.one_hot(index, n).to(mu.dtype)


def conv_factor(f: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """Per-channel 3-tap cross-correlation (zero padding, no bias) of 1D factors: (..., n) -> (..., n, C)."""
    fp = F.pad(f, (1, 1))
    n = f.shape[-1]
    # One (..., n, 3) @ (3, C) product: broadcast multiplies of an (..., n, 1) operand are several times slower.
    return torch.stack([fp[..., :n], f, fp[..., 2:]], dim=-1) @ taps


class TensorMemory(nn.Module):
    """One memory interface; its weights are shared by every layer it is attached to."""

    def __init__(self, config: TensorMemoryConfig):
        super().__init__()
        self.config = config
        d, C, K = config.d_model, config.channels, config.chunk_size
        # Chunking: the write summary is a learned projection of the chunk's tokens.
        self.write_proj = nn.Linear(K * d, d)
        # Coordinates (x=width, y=height, z=depth, as grid_sample orders them).
        self.coord = nn.Linear(d, 3)
        self.coord_write = nn.Linear(d, 3) if config.coord_heads == "separate" else None
        # Read back to the token width.
        self.read_out = nn.Linear(C, d)
        # Write content and spread; softplus(bias 1.0) starts sigma near 1.3.
        self.content = nn.Linear(d, C)
        self.spread = nn.Linear(d, 1)
        nn.init.constant_(self.spread.bias, 1.0)
        # The factorised operator on [write volume, h]: depthwise D, H, W taps, then the mix.
        if config.update == "factorised":
            self.conv_d, self.conv_h, self.conv_w = (
                nn.Conv3d(2 * C, 2 * C, k, padding=p, groups=2 * C)
                for k, p in (((3, 1, 1), (1, 0, 0)), ((1, 3, 1), (0, 1, 0)), ((1, 1, 3), (0, 0, 1)))
            )
            for conv in (self.conv_d, self.conv_h, self.conv_w):
                nn.init.zeros_(conv.weight)
                nn.init.zeros_(conv.bias)
                with torch.no_grad():
                    conv.weight.view(2 * C, 3)[:, 1] = 1.0
        self.mix = nn.Conv3d(2 * C, 4 * C, 1)
        nn.init.xavier_uniform_(self.mix.weight)
        nn.init.zeros_(self.mix.bias)

    def init_state(self, batch: int, device=None, dtype=None) -> MemoryState:
        device = device or self.mix.weight.device
        dtype = dtype or self.mix.weight.dtype
        # Channel-last in memory, as the scan takes it, so that forward's permute copies nothing.
        zeros = torch.zeros(batch, *self.config.grid, self.config.channels, device=device, dtype=dtype)
        zeros = zeros.permute(0, 4, 1, 2, 3)  # (B, C, D, H, W)
        return MemoryState(zeros, zeros)

    def state_size(self, bytes_per_element: int = 4) -> int:
        """Bytes of one sequence's state (h and c), whatever its length."""
        return 2 * self.config.channels * math.prod(self.config.grid) * bytes_per_element

    def scan_kernel(self) -> str:
        """The scan this memory runs here ("native (avx2)", "compiled", "eager"): the config's
        `kernel` says what was asked, which "auto" resolves per machine."""
        return kernel_that_runs(self.config.kernel, self.mix.weight)

    def chunk_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S, d) -> read inputs and write inputs, both (B, N, d) for N = ceil(S / K) chunks."""
        B, S, d = x.shape
        K = self.config.chunk_size
        N = -(-S // K)
        padded = F.pad(x, (0, 0, 0, N * K - S))  # a partial last chunk is zero-padded
        return padded[:, ::K], self.write_proj(padded.reshape(B, N, K * d))

    def coordinates(self, read_in: torch.Tensor, write_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        write_head = self.coord_write or self.coord
        return torch.tanh(self.coord(read_in)), torch.tanh(write_head(write_in))  # (B, N, 3) each

    def write_factors(self, write_in: torch.Tensor, mu_write: torch.Tensor):
        """Content (B, N, C) and the write volume's 1D factors along D, H, W, each (B, N, n)."""
        D, H, W = self.config.grid
        content = self.content(write_in)
        if self.config.write_mode == "hard":
            fz, fy, fx = (nearest_weights(mu_write[..., k], n) for k, n in ((2, D), (1, H), (0, W)))
        else:
            sigma = self.config.sigma_scale * (F.softplus(self.spread(write_in)) + 1e-4)  # (B, N, 1)
            fz, fy, fx = (gaussian_weights(mu_write[..., k], sigma[..., 0], n) for k, n in ((2, D), (1, H), (0, W)))
        return content, fz, fy, fx

    def _operator_weights(self):
        """The h half's taps (3 axes, 3, C) and biases (3, C); the write half's; the mix (2C, 4C)."""
        C = self.config.channels
        if self.config.update == "factorised":
            convs = (self.conv_d, self.conv_h, self.conv_w)
            taps = torch.stack([conv.weight.view(2 * C, 3).t() for conv in convs])  # (3, 3, 2C)
            biases = torch.stack([conv.bias for conv in convs])  # (3, 2C)
        else:
            taps = F.pad(torch.ones(3, 1, 2 * C, device=self.mix.weight.device, dtype=self.mix.weight.dtype),
                         (0, 0, 1, 1))  # identity taps, never used by the scan
            biases = taps.new_zeros(3, 2 * C)
        mix_w = self.mix.weight.view(4 * C, 2 * C).t()
        return taps[..., C:], biases[:, C:], taps[..., :C], biases[:, :C], mix_w, self.mix.bias

    def forward(self, x: torch.Tensor, state: MemoryState | None = None,
                output_final_state: bool = True) -> tuple[torch.Tensor, MemoryState | None]:
        """(B, S, d) tokens, optionally from `state` -> their reads (B, S, d) and, with
        output_final_state, the state after the last chunk's write (else None: the native
        scan then skips that write)."""
        B, S, _ = x.shape
        cfg = self.config
        C, K = cfg.channels, cfg.chunk_size
        D, H, W = cfg.grid
        if state is None:
            state = self.init_state(B, x.device, x.dtype)
        read_in, write_in = self.chunk_inputs(x)  # (B, N, d)
        mu_read, mu_write = self.coordinates(read_in, write_in)
        content, fz, fy, fx = self.write_factors(write_in, mu_write)
        taps, biases, w_taps, w_biases, mix_w, mix_b = self._operator_weights()

        # The write half through the depthwise convs: conv(v) = conv_without_bias(v) + conv(0),
        # and both terms are separable.
        factorised = cfg.update == "factorised"
        if factorised:
            uz, uy, ux = (conv_factor(f, w_taps[k]) for k, f in enumerate((fz, fy, fx)))  # (B, N, n, C)
            s_h = conv_factor(torch.ones_like(fy[0, 0]), w_taps[1])  # (H, C)
            s_w = conv_factor(torch.ones_like(fx[0, 0]), w_taps[2])  # (W, C)
            bvol = (w_biases[0] * s_h + w_biases[1])[:, None] * s_w + w_biases[2]  # (H, W, C)
        else:
            uz, uy, ux = (f.unsqueeze(-1).expand(*f.shape, C) for f in (fz, fy, fx))
            bvol = x.new_zeros(H, W, C)
        cz = content[:, :, None] * uz  # (B, N, D, C)
        wz, wy, wx = (hat_weights(mu_read[..., k], n) for k, n in ((2, D), (1, H), (0, W)))  # (B, N, n)

        h0 = state.h.permute(0, 2, 3, 4, 1).contiguous()  # (B, D, H, W, C)
        c0 = state.c.permute(0, 2, 3, 4, 1).contiguous()
        r, hN, cN = scan(
            cz=cz, uy=uy, ux=ux, bvol=bvol, wz=wz, wy=wy, wx=wx, h0=h0, c0=c0, taps=taps, biases=biases,
            mix_w=mix_w, mix_b=mix_b, factorised=factorised, kernel=cfg.kernel, output_final_state=output_final_state,
        )  # r (B, N, C): each chunk's read of the state before its own write
        read = self.read_out(r)  # (B, N, d)
        read = read.repeat_interleave(K, dim=1)[:, :S]  # (B, S, d)
        return read, MemoryState(hN.permute(0, 4, 1, 2, 3), cN.permute(0, 4, 1, 2, 3)) if output_final_state else None


@dataclass
class TensorConfig(MemoryTransformerConfig):
    memory: TensorMemoryConfig = field(default_factory=TensorMemoryConfig)

    def __post_init__(self):
        super().__post_init__()
        if self.memory.d_model != self.d_model:
            raise ValueError(f"the memory's d_model {self.memory.d_model} differs from the model's {self.d_model}")


_MEMORY_FIELDS = {f.name for f in fields(TensorMemoryConfig)} - {"d_model"}


def tensor(d_model: int, n_layers: int, n_heads: int, **options) -> MemoryTransformer:
    """`options`: the transformer's and the memory's config fields, side by side (channels=, grid=, kernel=, ...)."""
    memory = {k: options.pop(k) for k in list(options) if k in _MEMORY_FIELDS}
    config = TensorConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                          memory=TensorMemoryConfig(d_model=d_model, **memory), **options)
    return MemoryTransformer(config, TensorMemory(config.memory))


def tensor_local(d_model: int, n_layers: int, n_heads: int, window: int = 8, **options) -> MemoryTransformer:
    return tensor(d_model, n_layers, n_heads, window=window, **options)
