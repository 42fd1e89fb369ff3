"""What a plan would cost (`tmem-bench run --dry-run`, printed by dryrun.py): its rows, and the wall
time they would take on this machine and executor, from a few training steps measured per distinct
shape. Nothing is written.

A cell costs its setup (building the model, the causality and reach probes), its training steps and
its evaluation. A cell that stops early costs at most its cap: it is counted at every step of it and
every validation check on the way. A search's second selection seed is counted wherever one could be
needed. Both make the estimate an upper bound.

Per model (model, model options, task, task options) a training step is measured at the shortest
and the longest sequence the plan trains it at, and a forward pass at the shortest and longest it
evaluates; lengths in between are interpolated on a power law between the two (attention
grows between linearly and quadratically with the length, a scan linearly), so the cost of a
measurement does not grow with the number of levels of a sweep.

Each is measured at two batch sizes and fitted as a + b * batch: a fixed cost per call (kernel
launches, the optimiser's update) and a cost per example. On the CPU the sizes are small (8 and 32)
and the fit is extrapolated to the real batch (within about 20% of a step measured at batch 128 on a
2-core machine); on a GPU, where small batches leave it idle, the larger size is the real batch.

Given a timings.Timings, a shape measured before on this machine is read from it, and what is
measured is added to it.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from ..contracts.device import eval_chunk
from ..contracts.task import level_key
from .plan import Cell
from .rundir import RunDir
from .timings import Timings

WARMUP_STEPS = 1
TIMED_STEPS = 2  # at the larger batch size; one at the smaller, which only anchors the fixed cost
# A shape whose warm-up step alone takes this long is timed once per batch size: such a cell's
# cost is dominated by its step count, not by the noise of a single step.
SLOW_STEP_S = 1.0
GENERATE_SAMPLE = 128  # examples generated to time an evaluation set's generation, per level
CPU_SIZES = (8, 32)
PROBE_ROWS = 32  # probe.causality_probe's max_positions: at most this many rows per forward pass
PROBE_FORWARDS = 8  # two trials of two passes, before and after training
REACH_ROWS = 16  # the reach probe: a forward and backward pass on 16 examples, at init and trained
REACH_PASSES = 2


@dataclass(frozen=True)
class Cost:
    """Measured seconds of one cell's parts."""
    setup_s: float  # building the model and the probes
    step_s: float  # one training step (sampling the batch, forward, backward, update)
    eval_s: float  # the evaluation at every level of its grid, and the validation set
    check_s: float = 0.0  # one early-stopping check: a forward pass over the validation set

    def seconds(self, steps: int, checks: int = 0) -> float:
        return self.setup_s + steps * self.step_s + checks * self.check_s + self.eval_s


def budget(cell: Cell) -> tuple[int, int]:
    """(training steps, validation checks) a cell runs at most: with early stopping its cap and a
    check at step 0, every `every` steps and at the cap."""
    steps, rule = cell.train["steps"], cell.train.get("early_stop")
    if not rule:
        return steps, 0
    return steps, 1 + steps // rule["every"] + (steps % rule["every"] > 0)


class Meter(Protocol):
    def cost(self, cell: Cell) -> Cost: ...


@dataclass(frozen=True)
class Affine:
    """Seconds of one call on a batch of n: fixed + per_example * n."""
    fixed: float
    per_example: float

    def __call__(self, n: int) -> float:
        return self.fixed + self.per_example * n

    @classmethod
    def fit(cls, points: list[tuple[int, float]]) -> "Affine":
        (n1, t1), (n2, t2) = min(points), max(points)
        if n2 == n1 or t2 <= t1:  # one size, or noise larger than the difference: proportional to the larger
            return cls(0.0, t2 / n2)
        per_example = (t2 - t1) / (n2 - n1)
        return cls(max(0.0, t1 - per_example * n1), per_example)

    @classmethod
    def between(cls, s: int, s1: int, a1: "Affine", s2: int, a2: "Affine") -> "Affine":
        """At sequence length s, from the fits at s1 < s < s2: each coefficient on the power law
        through its two values (linearly where one is zero)."""
        def at(v1: float, v2: float) -> float:
            if v1 <= 0 or v2 <= 0:
                return v1 + (v2 - v1) * (s - s1) / (s2 - s1)
            return v1 * (s / s1) ** (math.log(v2 / v1) / math.log(s2 / s1))
        return cls(at(a1.fixed, a2.fixed), at(a1.per_example, a2.per_example))


def _options_key(options: dict) -> str:
    return json.dumps(options, sort_keys=True, default=str)


def _model_key(cell: Cell) -> tuple:
    return cell.model, _options_key(cell.model_options), cell.task, _options_key(cell.task_options)


class MeasuredCost:
    """Costs measured on `device` with `threads` torch threads. `prepare(cells)` first tells it every
    length the plan needs, so that each model is measured only at its shortest and longest."""

    def __init__(self, device: torch.device, threads: int, warmup: int = WARMUP_STEPS, steps: int = TIMED_STEPS,
                 timings: Timings | None = None):
        self.device, self.threads, self.warmup, self.steps, self.timings = device, threads, warmup, steps, timings
        self.build: dict[tuple, tuple[float, bool]] = {}  # model -> (seconds to build, gated)
        self.train_at: dict[tuple, dict[int, Cell]] = {}  # model -> length -> a cell trained there
        self.eval_at: dict[tuple, dict[int, tuple[Cell, dict]]] = {}  # model -> length -> (cell, level)
        self.step: dict[tuple, Affine] = {}  # (model, length) -> a training step, measured or interpolated
        self.forward: dict[tuple, Affine] = {}  # (model, length) -> an evaluation forward pass
        self.generate: dict[tuple, float] = {}  # (task, options, level) -> seconds per example
        self.lengths: dict[tuple, int] = {}
        self.measured = 0  # shapes timed (training steps and forward passes), not interpolated
        self.seconds = 0.0  # spent measuring
        self._model: tuple | None = None  # (model key, the model last built)

    def _sizes(self, batch: int) -> tuple[int, int]:
        if self.device.type == "cpu":
            return min(CPU_SIZES[0], batch), min(CPU_SIZES[1], batch)
        return min(REACH_ROWS, batch), batch

    def seq_len(self, cell: Cell, level: dict) -> int:
        key = (cell.task, _options_key(cell.task_options), level_key(level), cell.model_options["d_model"])
        if key not in self.lengths:
            task = cell.task_object()
            one = task.sample(level, 1, torch.Generator().manual_seed(0))
            self.lengths[key] = task.make_adapter(cell.model_options["d_model"])(one).shape[1]
        return self.lengths[key]

    def prepare(self, cells) -> None:
        for cell in cells:
            key = _model_key(cell)
            self.train_at.setdefault(key, {}).setdefault(self.seq_len(cell, cell.train_level), cell)
            evals = self.eval_at.setdefault(key, {})
            for level in (*cell.eval_levels, cell.train_level):
                evals.setdefault(self.seq_len(cell, level), (cell, level))

    def cost(self, cell: Cell) -> Cost:
        key = _model_key(cell)
        train_len = self.seq_len(cell, cell.train_level)
        if train_len not in self.train_at.get(key, {}) or any(
                self.seq_len(cell, lv) not in self.eval_at[key] for lv in cell.eval_levels):
            self.prepare([cell])
        start = time.perf_counter()
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            step = self._interpolated(self.step, self.train_at[key], key, train_len, self._measure_step, "step")
            train_forward = self._forward(key, train_len)
            levels = (*cell.eval_levels, cell.train_level)
            forwards = {lv_key: self._forward(key, self.seq_len(cell, lv))
                        for lv_key, lv in {level_key(lv): lv for lv in levels}.items()}
            for level in levels:
                self._generate(cell, level)
            if key not in self.build:  # every shape read from the timings: the build too, or built here
                stored = _numbers(self.timings.get("build", *key), 2) if self.timings else None
                if stored:
                    self.build[key] = (stored[0], bool(stored[1]))
                else:
                    self._built(key, cell)
        finally:
            torch.set_num_threads(before)
            self._model = None
        self.seconds += time.perf_counter() - start
        build_s, gated = self.build[key]
        setup_s = (build_s + PROBE_FORWARDS * train_forward(min(PROBE_ROWS, max(train_len - 1, 1)))
                   + REACH_PASSES * step(REACH_ROWS))
        size = cell.train["eval_size"]
        chunk = eval_chunk(self.device)
        chunks = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])

        def evaluation(level: dict, passes: int) -> float:
            generate = self.generate[(cell.task, _options_key(cell.task_options), level_key(level))]
            return size * generate + passes * sum(forwards[level_key(level)](n) for n in chunks)

        # A gated memory is evaluated again switched off; the validation set (at the training level,
        # where a learning rate is chosen) once.
        eval_s = sum(evaluation(level, 2 if gated else 1) for level in cell.eval_levels)
        eval_s += evaluation(cell.train_level, 1)
        check_s = sum(forwards[level_key(cell.train_level)](n) for n in chunks)
        return Cost(setup_s, step(cell.train["batch_size"]), eval_s, check_s)

    def _forward(self, key: tuple, length: int) -> Affine:
        return self._interpolated(self.forward, {n: c for n, (c, _) in self.eval_at[key].items()}, key, length,
                                  self._measure_forward, "forward")

    def _interpolated(self, table: dict, at: dict[int, Cell], key: tuple, length: int, measure, kind: str) -> Affine:
        """The fit at `length`: measured (or read from the timings) at the shortest and longest of
        `at`, interpolated between."""
        if (*key, length) in table:
            return table[(*key, length)]
        lo, hi = min(at), max(at)
        for end in {lo, hi, length} if length in (lo, hi) else (lo, hi):
            if (*key, end) not in table:
                # The sizes timed follow the batch and evaluation set sizes, so they are part of the shape.
                shape = (kind, *key, end, at[end].train["batch_size"], at[end].train["eval_size"])
                stored = _numbers(self.timings.get(*shape), 2) if self.timings else None
                if stored:
                    table[(*key, end)] = Affine(*stored)
                    continue
                table[(*key, end)] = measure(key, end)
                self.measured += 1
                if self.timings:
                    self.timings.put([table[(*key, end)].fixed, table[(*key, end)].per_example], *shape)
        if (*key, length) not in table:
            table[(*key, length)] = Affine.between(length, lo, table[(*key, lo)], hi, table[(*key, hi)])
        return table[(*key, length)]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _built(self, key: tuple, cell: Cell):
        """The model of `key`, built once per cost() call (its build time is recorded once)."""
        from .train import build_model

        if self._model is None or self._model[0] != key:
            start = time.perf_counter()
            model = build_model(cell).to(self.device)
            self._sync()
            self.build.setdefault(key, (time.perf_counter() - start, model.gated))
            if self.timings:
                self.timings.put(list(self.build[key]), "build", *key)
            self._model = (key, model)
        return self._model[1]

    def _generate(self, cell: Cell, level: dict) -> None:
        key = (cell.task, _options_key(cell.task_options), level_key(level))
        stored = _numbers(self.timings.get("generate", *key), 1) if self.timings and key not in self.generate else None
        if stored:
            self.generate[key] = stored[0]
        elif key not in self.generate:
            task = cell.task_object()
            n = min(cell.train["eval_size"], GENERATE_SAMPLE)
            start = time.perf_counter()
            batch = task.sample(level, n, torch.Generator().manual_seed(0))
            task.ceiling(level, batch)
            self.generate[key] = (time.perf_counter() - start) / n
            if self.timings:
                self.timings.put(self.generate[key], "generate", *key)

    def _measure_step(self, key: tuple, length: int) -> Affine:
        from ..contracts.device import to_device
        from .train import loss_and_accuracy

        cell = self.train_at[key][length]
        task = cell.task_object()
        model = self._built(key, cell)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cell.train["lr"], weight_decay=cell.train["weight_decay"])
        generator = torch.Generator().manual_seed(cell.seed)
        model.train()

        def step(n: int) -> float:
            t = time.perf_counter()
            batch = to_device(task.sample(cell.train_level, n, generator), self.device)
            loss, _ = loss_and_accuracy(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cell.train["grad_clip"])
            optimizer.step()
            self._sync()
            return time.perf_counter() - t

        return self._fit(step, self._sizes(cell.train["batch_size"]))

    @torch.no_grad()
    def _measure_forward(self, key: tuple, length: int) -> Affine:
        from ..contracts.device import to_device

        cell, level = self.eval_at[key][length]
        task = cell.task_object()
        model = self._built(key, cell).eval()
        sizes = self._sizes(min(cell.train["eval_size"], eval_chunk(self.device)))
        batches = {n: to_device(task.sample(level, n, torch.Generator().manual_seed(0)), self.device) for n in sizes}

        def forward(n: int) -> float:
            t = time.perf_counter()
            model(batches[n])
            self._sync()
            return time.perf_counter() - t

        return self._fit(forward, sizes)

    def _fit(self, call, sizes: tuple[int, int]) -> Affine:
        """Time `call(n)` at both sizes, each after warming up at it (the first call at a new shape
        allocates, or compiles, and took up to ten steady calls here), and fit a + b * n."""
        points = []
        for i, n in enumerate(dict.fromkeys(sizes)):
            warm = [call(n) for _ in range(self.warmup)]
            timed = 1 if i == 0 or (warm and warm[-1] > SLOW_STEP_S) else self.steps
            # The fastest: another process on the machine, or a late warm-up, only ever adds time.
            points.append((n, min(call(n) for _ in range(timed))))
        return Affine.fit(points)


def _numbers(value, n: int) -> tuple | None:
    """A stored value as `n` finite non-negative numbers (a bare number for one), or None where the
    file holds anything else (an edit, another schema): that shape is measured again."""
    values = [value] if n == 1 else value
    if not isinstance(values, list) or len(values) != n:
        return None
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
        return None
    return tuple(values)


@dataclass
class Row:
    """One line of the printed plan: cells of one task, variant and model that share their
    training settings, at one or more training levels."""
    task: str
    variant: str
    label: str
    kind: str  # "cells", "trials" (a learning-rate selection), "second" (a second selection seed where the
    # best two lrs are close) or "finals" (its other seeds, at the chosen lr)
    levels: dict[str, dict]  # training levels by their keys
    steps: int  # with early stopping, the cap
    early_stop: bool
    batch_size: int
    lrs: list[float]
    seeds: list[int]
    cells: list[Cell] = field(default_factory=list)  # finals: those at the first lr of the grid stand in
    finished: int = 0
    seconds: list[float] = field(default_factory=list)  # per cell of `cells`


def plan_rows(cells: list[Cell], searches=(), run_dir: Path | None = None, keep_weightless: bool = False) -> list[Row]:
    """The plan grouped for printing, with the cells already finished in `run_dir` counted as the run
    counts them (RunDir.stored_problem: a cell whose weights are missing is trained again unless `keep_weightless`).

    `searches` are learning-rate selections (plan.LRSearch): their trials are among `cells` and
    become "trials" rows; their remaining seeds, trained once the lr is chosen, become "finals"
    rows, counted finished when they are, at whichever lr of the grid was chosen. A search with a
    second selection seed adds a "second" row: the cells of that seed it may need (the runner-up's
    where the seed is also a final one, else both of the best two), whichever lrs they turn out at."""
    trial_ids = {c.id for s in searches for c in s.trials}
    stored = RunDir(run_dir) if run_dir is not None else None

    def _finished(cell: Cell) -> bool:
        return stored is not None and stored.stored_problem(cell.id, keep_weightless)[0] is None

    groups: list[tuple[str, list[Cell], dict]] = [("cells", [c for c in cells if c.id not in trial_ids], {})]
    groups.append(("trials", [c for s in searches for c in s.trials], {}))
    second, done_second, finals, done_finals = [], {}, [], {}
    for search in searches:
        lrs = sorted({t.train["lr"] for t in search.trials})
        if search.second_seed is not None:
            shared = search.second_seed in search.seeds
            stand_in = search.second_trials(lrs[1:2] if shared else lrs[:2])
            second += stand_in
            done = sum(_finished(c) for c in search.second_trials(lrs)) - shared
            for i, c in enumerate(stand_in):
                done_second[c.id] = i < done
        stand_in = list(search.finals(lrs[0]))
        finals += stand_in
        by_lr = [search.finals(lr) for lr in lrs]
        done = max(sum(_finished(c) for c in cs) for cs in by_lr) if by_lr else 0
        for i, c in enumerate(stand_in):
            done_finals[c.id] = i < done
    groups += [("second", second, done_second), ("finals", finals, done_finals)]

    rows: dict[tuple, Row] = {}
    for kind, group, done in groups:
        # Per training level first: a level's seeds and settings decide which row it joins.
        per_level: dict[tuple, list[Cell]] = {}
        for c in group:
            per_level.setdefault((c.task, c.variant, c.label, level_key(c.train_level)), []).append(c)
        for (task, variant, label, lv_key), level_cells in per_level.items():
            first = level_cells[0]
            seeds = sorted({c.seed for c in level_cells})
            lrs = sorted({c.train["lr"] for c in level_cells})
            early_stop = bool(first.train.get("early_stop"))
            key = (kind, task, variant, label, first.train["steps"], early_stop, first.train["batch_size"],
                   tuple(lrs), tuple(seeds))
            row = rows.get(key)
            if row is None:
                row = rows[key] = Row(task, variant, label, kind, {}, first.train["steps"], early_stop,
                                      first.train["batch_size"], lrs, seeds)
            row.levels[lv_key] = first.train_level
            row.cells += level_cells
            row.finished += sum(done[c.id] if c.id in done else _finished(c) for c in level_cells)
    order = {"cells": 0, "trials": 1, "second": 2, "finals": 3}
    tasks = list(dict.fromkeys(c.task for c in cells))
    return sorted(rows.values(), key=lambda r: (tasks.index(r.task) if r.task in tasks else len(tasks),
                                                order[r.kind]))


@dataclass
class Estimate:
    rows: list[Row]
    total_s: float  # cell-seconds of every cell not yet finished
    wall_s: float | None  # wall time on the executor; None where a cluster decides how many cells run at once
    remaining: int
    longest_s: float


def estimate(rows: list[Row], meter: Meter, workers: int | None) -> Estimate:
    """Fill in each row's seconds per cell and schedule the unfinished cells: one after another
    (workers=1), on `workers` slots in plan order, each cell to the first slot free (a process pool),
    or not at all (workers=None). Second selection seeds start after every trial and finals after
    them, as each waits for the results before it."""
    phases: list[list[float]] = [[], [], []]
    for row in rows:
        row.seconds = [meter.cost(c).seconds(*budget(c)) for c in row.cells]
        # The cells of a row differ in cost only by their evaluation and setup, so which of them are
        # finished matters little: the first ones are taken as those.
        phases[{"second": 1, "finals": 2}.get(row.kind, 0)] += row.seconds[row.finished:]
    remaining = [s for phase in phases for s in phase]
    wall = None
    if workers is not None:
        wall = 0.0
        for phase in phases:
            slots = [0.0] * workers
            for seconds in phase:
                i = slots.index(min(slots))
                slots[i] += seconds
            wall += max(slots)
    return Estimate(rows, sum(remaining), wall, len(remaining), max(remaining, default=0.0))
