"""Points the training budget left undecided. A point is one model at one level, over its seeds.
Where it learned nothing (within the power rule's learned margin of chance) or a seed's training
had not converged (the convergence rule), its accuracy is what this many steps reached, not what
the model can do: a loss flat at chance may be a plateau more steps would leave, and a loss still
falling may fall further. A point that learned and is still learning is a lower bound on what its
model can do: it may support a verdict that its rising can only strengthen (a claim, a "learned",
a "discriminates" it already passes), never refute one. Otherwise such a point can neither support
nor refute, so a verdict resting on one is "inconclusive (budget)", naming the point, the steps it
ran and how many seeds converged.
A model at chance whose information reach finds no path from the evidence to the answer (at
initialisation and trained) is blind by construction, not short of steps: that point counts.
Where the state probe was run (state_probe.json), a point whose state answers clearly more than
the model does (claims.toml's [state_probe]) did not learn to read its state: it cannot say the
state is full, and is the budget's too; one where the probe reads clearly less than the model
under-reads that state and cannot tell; one where it does about as well says the state is full as
far as a readout of the probe's capacity can tell."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .claims import PowerSpec, load_power, load_probe, load_reach
from .data import per_seed
from .stats import BUDGET


@dataclass(frozen=True)
class Point:
    label: str
    where: str  # "at n_writes=40,noise=0.05", "on no_harm", with the training level where it differs
    steps: tuple[int, ...]  # the distinct steps its cells ran, ascending
    seeds: int
    converged: int  # seeds every cell of which met the convergence rule
    not_converged: int  # seeds with a cell that had not; the rest do not say
    nothing_learned: bool  # at chance, with a path from the evidence to the answer (or none measured)
    blind: bool = False  # no path from the evidence to the answer, at initialisation and trained
    # The state probe at this point, where it was run at the level the model was trained at: its
    # accuracy and the model's own over the probed seeds, and whether it answers clearly more.
    probe: float | None = None
    probe_own: float | None = None
    probe_seeds: int = 0
    read_not_learned: bool = False
    under_read: bool = False  # the probe reads clearly less than the model: it cannot tell either way
    # Seeds probed whose probe cannot tell: its readout reads the closest reference state below the
    # calibration goal (harness/probe_run.py), so no verdict reads its number.
    probe_cannot_tell: int = 0

    @property
    def limited(self) -> bool:
        return self.nothing_learned or self.not_converged > 0 or self.read_not_learned

    @property
    def lower_bound(self) -> bool:
        """Learned something and is still learning: more steps could only raise it."""
        return self.not_converged > 0 and not self.nothing_learned and not self.read_not_learned

    def probed_seeds(self) -> str:
        return f"{self.probe_seeds} seed{'s' * (self.probe_seeds != 1)}"

    def probe_note(self) -> str | None:
        """What the state probe says of this point, where it was run."""
        if self.probe is None:
            if self.probe_cannot_tell:
                return (f"the state probe cannot tell ({self.probe_cannot_tell} seed{'s' * (self.probe_cannot_tell != 1)} "
                        "probed; its readout reads the reference state closest to this memory's format below the "
                        "calibration goal)")
            return None
        numbers = (f"the state probe answers {100 * self.probe:.1f}%, the model {100 * self.probe_own:.1f}%, "
                   f"{self.probed_seeds()} probed")
        if self.read_not_learned:
            return f"did not learn to read its state ({numbers})"
        if self.nothing_learned:  # a state the model never learned to write says nothing of its capacity
            return f"the state probe finds nothing either ({numbers})"
        if self.under_read:
            return ("the state probe reads less than the model, so it under-reads this state and cannot tell "
                    f"({numbers})")
        return f"the state probe does no better: full as far as it can tell ({numbers})"

    def describe(self, named: bool = True) -> str:
        if self.read_not_learned:
            return f"{self.label + ' ' if named else ''}{self.where} {self.probe_note()}"
        what = "learned nothing" if self.nothing_learned else "had not converged"
        steps = "-".join(f"{s:,}" for s in dict.fromkeys((self.steps[0], self.steps[-1])))
        unknown = self.seeds - self.converged - self.not_converged
        seeds = (f"convergence of {self.seeds} seeds not recorded" if unknown == self.seeds else
                 f"{self.converged} of {self.seeds} seeds converged" + (f", {unknown} unknown" if unknown else ""))
        described = f"{self.label + ' ' if named else ''}{self.where} {what} in {steps} steps ({seeds})"
        # What the probe found, or that it cannot tell, is said where the point is, so that no reader
        # takes its silence for a state found empty or full.
        if self.probe is not None:
            return f"{described}; {self.probe_note()}"
        return described + ("; the state probe cannot tell (calibration below its goal)"
                            if self.probe_cannot_tell else "")


def converged_flag(value) -> bool | None:
    """A cell's `converged`: True or False, None where it does not say (None or NaN)."""
    return bool(value) if isinstance(value, (bool, np.bool_)) else None


def point(rows_: pd.DataFrame, spec: PowerSpec | None = None, judge_learning: bool = True,
          where: str | None = None) -> Point:
    """The point of rows_, one model's rows at one evaluation level, named `where` (by default its
    level). judge_learning=False for a model whose being at chance is what a rule asks of it (the
    power rule's blind reference)."""
    spec = spec or load_power()
    cells = rows_.drop_duplicates("cell_id")
    level, task = str(rows_["level"].iloc[0]), str(rows_["task"].iloc[0])
    where = where or (f"on {task}" if level == "-" else f"at {level}")
    if not rows_["trained_at_level"].astype(bool).all():
        where += f" (trained at {', '.join(sorted(set(rows_['train_level'])))})"
    flags = cells.groupby("seed")["converged"].agg(lambda c: [converged_flag(v) for v in c])
    accuracy, chance = float(per_seed(rows_).mean()), float(rows_["chance"].mean())
    reach = [rows_[c].mean() for c in ("reach_init", "reach_trained")]
    blind = not any(pd.isna(r) for r in reach) and max(reach) <= load_reach().no_path
    probe = {}
    if "probe_accuracy" in rows_:
        probed = rows_[rows_["probe_accuracy"].notna()]
        if not probed.empty:
            probe = {"probe": float(per_seed(probed, "probe_accuracy").mean()),
                     "probe_own": float(per_seed(probed).mean()), "probe_seeds": int(probed["seed"].nunique())}
            probe["read_not_learned"] = load_probe().read_not_learned(probe["probe"], probe["probe_own"])
            probe["under_read"] = load_probe().under_reads(probe["probe"], probe["probe_own"])
        elif "probe_cannot_tell" in rows_ and rows_["probe_cannot_tell"].any():
            probe = {"probe_cannot_tell": int(rows_.loc[rows_["probe_cannot_tell"].astype(bool), "seed"].nunique())}
    return Point(
        label=str(rows_["label"].iloc[0]), where=where,
        steps=tuple(sorted({int(s) for s in cells["steps_run"]})), seeds=len(flags),
        converged=sum(all(f is True for f in fs) for fs in flags),
        not_converged=sum(any(f is False for f in fs) for fs in flags),
        nothing_learned=judge_learning and not blind and spec.nothing_learned(accuracy, chance), blind=blind, **probe)


def lower_bounds(points: list[Point], rising: list[Point]) -> list[Point]:
    """The points of `rising` (those whose rising can only strengthen the verdict at hand) that are
    lower bounds; the caller passes `rising` only for a verdict that supports."""
    keys = {(p.label, p.where) for p in rising}
    return [p for p in points if p.lower_bound and (p.label, p.where) in keys]


def lower_bound_note(points: list[Point]) -> str | None:
    """What the verdict read as lower bounds, or None."""
    if not points:
        return None
    return "lower bound" + "s" * (len(points) > 1) + ", still learning: " + "; ".join(
        p.describe() for p in {(p.label, p.where): p for p in points}.values())


def budget_note(points: list[Point], rising: list[Point] = ()) -> str | None:
    """'inconclusive (budget): ...' naming every limited point (a model's further points after its
    first without its name again), or None when no point is limited. Lower bounds among `rising`
    (lower_bounds) do not limit."""
    bounds = {(p.label, p.where) for p in lower_bounds(points, list(rising))}
    limited = list({(p.label, p.where): p for p in points if p.limited and (p.label, p.where) not in bounds}.values())
    if not limited:
        return None
    parts, previous = [], None
    for p in limited:
        if p.label == previous:
            parts[-1] += ", " + p.describe(named=False)
        else:
            parts.append(p.describe())
        previous = p.label
    return f"{BUDGET}: " + "; ".join(parts)
