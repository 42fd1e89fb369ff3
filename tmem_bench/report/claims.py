"""The paper's claims as data (claims.toml), the verdict a rule fills in for each, and the
thresholds of the diagnostic-power check ([power])."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from .stats import BUDGET, EPS, INCONCLUSIVE

# Rules that read no accuracy, so no point of theirs can be the training budget's (budget.py).
TIMING_RULES = ("throughput",)


@dataclass(frozen=True)
class ClaimSpec:
    id: str
    name: str
    statement: str  # the claim as the paper (arXiv 2605.27686, docs/models.md) states it
    paper: str  # the paper's numbers
    rule: str  # the name of the generic rule that decides it (rules.RULES)
    explain: str  # the decision rule as printed, with {parameter} fields
    task: str | None = None
    memory: str | None = None
    baselines: tuple[str, ...] = ()
    references: tuple[str, ...] = ()  # growing-state models a drop must exceed to be a fixed state's (saturation)
    margin: float | None = None
    accuracy_tolerance: float | None = None
    gate_tolerance: float | None = None
    reference: str | None = None
    supported_ratio: float | None = None
    refuted_ratio: float | None = None
    keeps: float | None = None  # the accuracy the memory must keep at every W (capacity)
    state_ratio: float | None = None  # models within this factor of each other's state bytes are matched
    # A figure the paper states (rule "figure"): the models it is about, its range (a floor, a
    # ceiling or both, as fractions) and the level it names, e.g. {"n_writes": 50}.
    models: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    at: dict = field(default_factory=dict)

    def figure(self) -> str:
        """The stated figure, e.g. "7-14%", "at least 75%"."""
        if self.low is not None and self.high is not None:
            return f"{100 * self.low:g}-{100 * self.high:g}%"
        return f"at least {100 * self.low:g}%" if self.low is not None else f"at most {100 * self.high:g}%"

    def explained(self) -> str:
        """`explain` with the entry's values filled in (margins and accuracy tolerances in points),
        and the budget rule every rule that reads accuracy applies."""
        def number(x, scale=1):
            return None if x is None else f"{scale * x:g}"

        return self.explain.format(
            memory=self.memory, task=self.task, baselines=", ".join(self.baselines), reference=self.reference,
            references=", ".join(self.references), attention_reference=load_power().attention_reference,
            halfway=number(load_power().halfway, 100),
            margin=number(self.margin, 100), accuracy_tolerance=number(self.accuracy_tolerance, 100),
            gate_tolerance=number(self.gate_tolerance), supported_ratio=number(self.supported_ratio),
            refuted_ratio=number(self.refuted_ratio), keeps=number(self.keeps, 100),
            state_ratio=number(self.state_ratio), models=", ".join(self.models),
            at=", ".join(f"{k}={v}" for k, v in self.at.items()),
            figure=self.figure() if self.rule == "figure" else None,
        ) + ("" if self.rule in TIMING_RULES else " " + load_power().budget_rule())


@dataclass
class Claim:
    id: str
    name: str
    statement: str
    paper: str
    rule: str  # the decision rule applied here, as printed
    verdict: str = INCONCLUSIVE
    reason: str = ""
    evidence: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PowerSpec:
    """When a variant tells a memory from no memory (power.py applies it; margins as fractions)."""
    attention_reference: str
    chance_margin: float
    halfway: float
    memory_off_margin: float
    learned_margin: float

    def halfway_mark(self, chance: float, ceiling: float) -> float:
        """The accuracy `halfway` of the way from chance to ceiling."""
        return chance + self.halfway * (ceiling - chance)

    def nothing_learned(self, accuracy: float, chance: float) -> bool:
        """At most `learned_margin` above chance (inclusive up to stats.EPS)."""
        return accuracy <= chance + self.learned_margin + EPS

    def budget_rule(self) -> str:
        """How every verdict on accuracy treats a point of the training budget (budget.py), as printed."""
        return (f"A point (a model at a level) that learned nothing (within {100 * self.learned_margin:g} points of "
                f"chance) or had a seed whose training had not converged (the convergence rule) shows the "
                f"training budget, not the model: it neither supports nor refutes, and a verdict resting on one "
                f"is {BUDGET}; but a point that learned and is still learning is a lower bound, read by the "
                f"direction more steps can move it: it may support a verdict that its rising could only "
                f"strengthen (a floor it already passes) and refute one that its rising could only weaken (a "
                f"ceiling it already exceeds). A model at chance with no path from the evidence to the answer (its information "
                f"reach) is blind by construction, and counts.")


@dataclass(frozen=True)
class ReachSpec:
    """How the information-reach ratio is read (claims.toml's [reach])."""
    no_path: float
    vanishing: float


@cache
def _claims_toml() -> dict:
    return tomllib.loads(resources.files(__package__).joinpath("claims.toml").read_text())


@dataclass(frozen=True)
class ProbeSpec:
    """How the state probe's accuracy is read beside the model's own (claims.toml's [state_probe])."""
    answers_margin: float

    def read_not_learned(self, probe: float, accuracy: float) -> bool:
        """The state holds what the model does not read: the probe at least `answers_margin` above it."""
        return probe >= accuracy + self.answers_margin - EPS

    def under_reads(self, probe: float, accuracy: float) -> bool:
        """The probe reads at least `answers_margin` less than the model reads from the same state:
        the model shows the state holds more than the probe found, so the probe cannot say it is full."""
        return probe <= accuracy - self.answers_margin + EPS


@cache
def load_probe() -> ProbeSpec:
    return ProbeSpec(**_claims_toml()["state_probe"])


@cache
def load_reach() -> ReachSpec:
    return ReachSpec(**_claims_toml()["reach"])


def load_power() -> PowerSpec:
    return PowerSpec(**_claims_toml()["power"])


@cache
def load_claims() -> tuple[ClaimSpec, ...]:
    table = _claims_toml()
    specs = []
    for entry in table["claims"]:
        values = {**table.get("defaults", {}), **entry}
        values["baselines"] = tuple(values.get("baselines", ()))
        values["references"] = tuple(values.get("references", ()))
        values["models"] = tuple(values.get("models", ()))
        specs.append(ClaimSpec(**values))
    return tuple(specs)


def claim_spec(claim_id: str) -> ClaimSpec:
    specs = {s.id: s for s in load_claims()}
    if claim_id not in specs:
        raise KeyError(f"no claim {claim_id!r} in claims.toml; known: {', '.join(specs)}")
    return specs[claim_id]
