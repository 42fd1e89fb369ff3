"""Occlusion: track a ball that disappears for a while.

T frames (`n_frames`, 8) of 16x16 pixels show a 2x2 ball moving with a constant
integer velocity in {-1, 0, 1}^2 (never both zero), wrapping at the edges, from a
uniformly random start. The ball's position is its top-left pixel (r, c); it
covers (r + i mod 16, c + j mod 16) for i, j in {0, 1}. During `occlusion_len` (L)
frames the ball is hidden. The target is the quadrant of the ball's top-left pixel
in the last frame: 2 * (r >= 8) + (c >= 8), so a ball straddling a quadrant
boundary, or wrapping around an edge, belongs to the quadrant of its top-left pixel.

Options:
  hide = "middle"  the middle L frames are hidden (frames (T - L) // 2 onwards), as
                   in the paper. The last frame stays visible for L < T, so the
                   answer can be read off the last frame and no memory is needed.
  hide = "end"     the last L frames are hidden: the answer must be extrapolated
                   from the velocity seen before the ball vanished.
  occluder = True  instead of blanking, a static grey (0.5) rectangle is drawn in
                   every frame over the bounding box of the ball's hidden positions,
                   and the ball passes behind it (it may also be partly covered in
                   visible frames next to the hidden ones). The box's size and place
                   follow the hidden path, so it carries information about it; the
                   ceiling counts that (with every frame hidden it is about 0.45, not 0.25).
  block_hidden = True  memory forcing (needs hide = "end", no occluder): the tokens
                   of hidden frames may not attend to the tokens of visible frames,
                   so attention sees only blank frames where the answer is read and
                   an attention-only model is at chance by construction; what was
                   seen reaches the answer only through a state the backbone carries.

Tokens: each frame is cut into 16 patches of 4x4 pixels (row-major); a patch's 16
pixels go through one Linear to d, plus learned patch-position and frame-position
embeddings. The head reads the mean of the last frame's 16 outputs, as the paper's
reference does: with a causal backbone each of them has seen its own patch and every
earlier frame, so together they cover the whole last frame; the mean needs no
position to be singled out.

Ceiling: the Bayes-optimal accuracy given the frames, computed exactly for each
evaluation set: every (start, velocity) hypothesis (256 x 8) is rendered, the
hypotheses whose frames equal a sample's frames form its posterior (the prior is
uniform), and the ceiling is the mean of each sample's largest quadrant posterior.
It is 1.0 when the last frame is visible or the velocity was seen (two consecutive
visible frames); less when the ball is hidden too long to be located.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from tmem_bench.contracts.task import Adapter, Batch, Level, Task
from tmem_bench.errors import UsageError, check_int

SIZE = 16
BALL = 2
PATCH = 4
N_PATCHES = (SIZE // PATCH) ** 2
HIDES = ("middle", "end")
OCCLUDER_VALUE = 0.5
VELOCITIES = torch.tensor([[dr, dc] for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)])  # (8, 2)


def quadrant(position: torch.Tensor) -> torch.Tensor:
    """Quadrant 0..3 (row-major) of top-left pixel positions (..., 2)."""
    return 2 * (position[..., 0] >= SIZE // 2) + (position[..., 1] >= SIZE // 2)


def patchify(frames: torch.Tensor) -> torch.Tensor:
    """(B, T, 16, 16) frames -> (B, T * 16, 16) patch tokens, row-major within each frame."""
    B, T = frames.shape[:2]
    n = SIZE // PATCH
    x = frames.reshape(B, T, n, PATCH, n, PATCH).permute(0, 1, 2, 4, 3, 5)  # (B, T, pr, pc, 4, 4)
    return x.reshape(B, T * N_PATCHES, PATCH * PATCH)


class OcclusionAdapter(Adapter):
    def __init__(self, d_model: int, task: "Occlusion"):
        super().__init__()
        self.task = task
        self.proj = nn.Linear(PATCH * PATCH, d_model)
        self.patch_pos = nn.Parameter(torch.randn(N_PATCHES, d_model) * 0.02)
        self.frame_pos = nn.Parameter(torch.randn(task.n_frames, d_model) * 0.02)
        self.head_proj = nn.Linear(d_model, 4)

    def forward(self, batch: Batch) -> torch.Tensor:
        frames = batch["frames"]  # (B, T, 16, 16)
        T = frames.shape[1]
        pos = (self.frame_pos[:T, None] + self.patch_pos[None]).reshape(T * N_PATCHES, -1)  # (T * 16, d)
        return self.proj(patchify(frames)) + pos  # (B, T * 16, d)

    def blocked(self, batch: Batch) -> torch.Tensor | None:
        if not self.task.block_hidden:
            return None
        hidden = self.task.hidden_frames(int(batch["occlusion_len"][0]))  # (T,)
        hidden = hidden.repeat_interleave(N_PATCHES)  # (T * 16,)
        return hidden[:, None] & ~hidden[None, :]  # (S, S): hidden rows may not see visible columns

    def head(self, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.head_proj(h[:, -N_PATCHES:].mean(dim=1))[:, None]  # (B, 1, 4)


class Occlusion(Task):
    name = "occlusion"
    axes = ("occlusion_len",)
    n_classes = 4
    levels = {"occlusion_len": (0, 2, 4, 6, 8)}
    # hide_end is memory_forcing's data with attention left free to see it.
    variants = {"standard": {}, "occluder": {"occluder": True}, "hide_end": {"hide": "end"},
                "memory_forcing": {"hide": "end", "block_hidden": True}}
    memory_forcing = ("memory_forcing",)

    def __init__(self, n_frames: int = 8, occluder: bool = False, hide: str = "middle", block_hidden: bool = False):
        self.n_frames = check_int("n_frames", n_frames)
        if hide not in HIDES:
            raise UsageError(f"hide {hide!r} is not one of {', '.join(HIDES)}")
        self.occluder = bool(occluder)
        self.hide = hide
        self.block_hidden = bool(block_hidden)
        if self.block_hidden and (hide != "end" or self.occluder):
            # Hidden middle frames are followed by a visible last frame, and an occluder
            # box drawn in hidden frames shows where the ball went: either way attention
            # would still see the answer.
            raise UsageError('block_hidden needs hide = "end" and occluder = false')

    def options(self) -> dict:
        options = {"n_frames": self.n_frames, "occluder": self.occluder, "hide": self.hide}
        if self.block_hidden:
            options["block_hidden"] = True
        return options

    def check_value(self, axis: str, value):
        value = check_int(axis, value, minimum=0)
        if value > self.n_frames:
            raise UsageError(f"occlusion_len must be at most n_frames ({self.n_frames}), got {value}")
        return value

    def hidden_frames(self, occlusion_len: int) -> torch.Tensor:
        """(T,) bool, True on the frames where the ball is hidden."""
        T, L = self.n_frames, occlusion_len
        first = (T - L) // 2 if self.hide == "middle" else T - L
        t = torch.arange(T)
        return (t >= first) & (t < first + L)

    def positions(self, start: torch.Tensor, velocity: torch.Tensor) -> torch.Tensor:
        """(N, T, 2) unwrapped top-left positions of N trajectories."""
        t = torch.arange(self.n_frames)
        return start[:, None] + t[None, :, None] * velocity[:, None]

    def render(self, start: torch.Tensor, velocity: torch.Tensor, occlusion_len: int) -> torch.Tensor:
        """(N, T, 16, 16) float frames (0 background, 1 ball, 0.5 occluder) of N trajectories."""
        hidden = self.hidden_frames(occlusion_len)  # (T,)
        pos = self.positions(start, velocity)  # (N, T, 2)
        px = torch.arange(SIZE)
        inside = (px - pos[..., None]) % SIZE < BALL  # (N, T, 2, 16): rows, then columns
        ball = inside[:, :, 0, :, None] & inside[:, :, 1, None, :]  # (N, T, 16, 16)
        if not self.occluder:
            return (ball & ~hidden[None, :, None, None]).float()
        if not hidden.any():
            return ball.float()
        lo = pos[:, hidden].amin(1)  # (N, 2), unwrapped: the box may wrap around an edge
        extent = pos[:, hidden].amax(1) - lo + BALL  # (N, 2)
        cover = (px - lo[..., None]) % SIZE < extent[..., None]  # (N, 2, 16)
        occluder = cover[:, 0, :, None] & cover[:, 1, None, :]  # (N, 16, 16)
        return torch.where(occluder[:, None], OCCLUDER_VALUE, ball.float())

    def sample(self, level: Level, batch_size: int, generator: torch.Generator) -> Batch:
        start = torch.randint(0, SIZE, (batch_size, 2), generator=generator)
        velocity = VELOCITIES[torch.randint(0, len(VELOCITIES), (batch_size,), generator=generator)]
        frames = self.render(start, velocity, level["occlusion_len"])
        target = quadrant(self.positions(start, velocity)[:, -1] % SIZE)[:, None]  # (B, 1)
        batch = {"frames": frames, "target": target}
        if self.block_hidden:  # the mask depends on the level (only here, so other variants keep their fingerprints)
            batch["occlusion_len"] = torch.full((batch_size,), level["occlusion_len"])
        return batch

    def reach_positions(self, level: Level, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.hidden_frames(level["occlusion_len"]).repeat_interleave(N_PATCHES)  # (S,)
        answer = torch.zeros_like(hidden)
        answer[-N_PATCHES:] = True  # the last frame, whose outputs the head reads
        return ~hidden & ~answer, answer

    def make_adapter(self, d_model: int) -> Adapter:
        return OcclusionAdapter(d_model, self)

    def hypotheses(self, occlusion_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame fingerprints (2048, 2) and last-frame quadrants (2048,) of every (start, velocity)."""
        key = (self.n_frames, self.occluder, self.hide, occlusion_len)
        if key not in _HYPOTHESES:
            starts = torch.cartesian_prod(torch.arange(SIZE), torch.arange(SIZE))  # (256, 2)
            start = starts.repeat_interleave(len(VELOCITIES), 0)
            velocity = VELOCITIES.repeat(len(starts), 1)  # (2048, 2)
            rendered = self.render(start, velocity, occlusion_len)
            _HYPOTHESES[key] = _hash(rendered), quadrant(self.positions(start, velocity)[:, -1] % SIZE)
        return _HYPOTHESES[key]

    def posterior(self, level: Level, batch: Batch) -> torch.Tensor:
        """(B, 4) quadrant posterior given each sample's frames, by exact hypothesis matching."""
        hashes, quadrants = self.hypotheses(level["occlusion_len"])
        matches = _hash(batch["frames"])[:, None].eq(hashes[None]).all(-1)  # (B, 2048)
        counts = matches.double() @ nn.functional.one_hot(quadrants, 4).double()  # (B, 4)
        return counts / counts.sum(-1, keepdim=True)

    def ceiling(self, level: Level, batch: Batch) -> float:
        return float(self.posterior(level, batch).amax(-1).mean())

    def oracle(self, level: Level, batch: Batch) -> torch.Tensor:
        """(B, 1) Bayes-optimal answers given the frames alone."""
        return self.posterior(level, batch).argmax(-1)[:, None]


_HYPOTHESES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _hash(frames: torch.Tensor) -> torch.Tensor:
    """(N, 2) fingerprints of frames (N, T, 16, 16), for exact equality tests.

    Pixel codes 0..2 times two fixed random integer weight vectors below 2**36: with
    at most 2**11 pixels the sums stay below 2**49, exact in float64 (so BLAS can
    do it), and two different frame stacks collide with probability about 2**-72.
    """
    codes = (frames.flatten(1) * 2).round().double()  # (N, T * 256)
    generator = torch.Generator().manual_seed(0)
    weights = torch.randint(0, 2**36, (codes.shape[1], 2), generator=generator).double()
    return codes @ weights
