"""The external-validity hypothesis, stated before the run it is tested on (docs/external-validity.md,
docs/external-validity-hypothesis.toml): reading it, and why a pair cannot be confirmatory."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path

from ..errors import UsageError
from .data import RunData

HYPOTHESIS = Path(__file__).resolve().parents[2] / "docs" / "external-validity-hypothesis.toml"
STATISTICS = {"kendall_tau_b": "tau", "spearman_rho": "rho"}
DIRECTIONS = {"positive": "greater", "negative": "less"}


@dataclass(frozen=True)
class Hypothesis:
    path: Path
    stated: datetime  # the latest instant the statement can have been made
    stated_text: str
    revision: str
    toy: tuple[str, str, str]  # task, variant, train_level
    external: str
    profile: str  # the profile of the one external run the pair is tested on
    direction: str
    statistic: str  # "tau" or "rho"
    alpha: float


def read_hypothesis(path: Path) -> Hypothesis | None:
    """The confirmatory pair a TOML file states; None where there is no such file. A file that
    does not state it in full is a UsageError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        doc = tomllib.loads(path.read_text())
        stated, toy, external = doc["stated"], doc["toy"], doc["external"]
        if isinstance(stated, datetime):
            if stated.tzinfo is None:
                raise ValueError("'stated' is a time with no offset; give one (2026-12-04T09:00:00Z) or a date")
            latest = stated
        elif isinstance(stated, date):
            # A date alone: its last instant anywhere on Earth (UTC-12), so the stated day never
            # counts as earlier than it can have been.
            latest = datetime.combine(stated, time.max, timezone(timedelta(hours=-12)))
        else:
            raise ValueError(f"'stated' must be a TOML date or offset date-time, got {stated!r}")
        if doc["statistic"] not in STATISTICS or doc["direction"] not in DIRECTIONS:
            raise ValueError(f"'statistic' must be one of {sorted(STATISTICS)} and 'direction' one of "
                             f"{sorted(DIRECTIONS)}; got {doc['statistic']!r}, {doc['direction']!r}")
        alpha = doc["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, float | int) or not 0 < alpha < 1:
            raise ValueError(f"'alpha' must be a number between 0 and 1, got {alpha!r}")
        return Hypothesis(path, latest, str(stated), str(doc["revision"]),
                          (str(toy["task"]), str(toy["variant"]), str(toy["level"])), str(external["score"]),
                          str(external["profile"]), doc["direction"], STATISTICS[doc["statistic"]], float(alpha))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"hypothesis {path} is not TOML ({e})") from None
    except KeyError as e:
        raise UsageError(f"hypothesis {path} lacks {e.args[0]!r}: it must state stated, revision, statistic, "
                         "direction, alpha, toy.task, toy.variant, toy.level, external.score and external.profile") from None
    except (ValueError, TypeError) as e:
        raise UsageError(f"hypothesis {path}: {e}") from None


def first_cell_time(data: RunData) -> datetime | None:
    """When the run's first cell can have started at the earliest: its manifest's first start
    (rundir.begin keeps it across resumes); None where the manifest does not record it (runs begun
    before issue 59 record only their latest start, which a resume moves past the first cell)."""
    value = (data.manifest or {}).get("first_started")
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


def exploratory_reasons(hypothesis: Hypothesis | None, external: RunData, found: bool) -> list[str]:
    """Why the hypothesis's pair cannot be confirmatory here (none: it is)."""
    if hypothesis is None:
        return [f"none is stated (no file at {shown(HYPOTHESIS)})"]
    reasons = [] if found else [f"its pair ({' '.join(hypothesis.toy)} with {hypothesis.external}) is not among "
                                "these runs' scores"]
    first = first_cell_time(external)
    if first is None:
        latest = (external.manifest or {}).get("started")
        reasons.append(f"run {external.run_dir} does not record when its first cell started"
                       + (f" (it was last started {latest}, before the statement)" if isinstance(latest, str)
                          and _before(latest, hypothesis.stated) else ""))
    elif not hypothesis.stated < first:
        reasons.append(f"it was stated ({hypothesis.stated_text}) after run {external.run_dir}'s first cell "
                       f"(started {first.isoformat()})")
    # One test of the pair: a later run under another profile (a longer cap, other levels) looks again.
    profile = ((external.manifest or {}).get("settings") or {}).get("profile")
    if profile != hypothesis.profile:
        reasons.append(f"it is tested on the run of profile {hypothesis.profile!r}, and run {external.run_dir} "
                       f"was made under {profile!r}")
    return reasons


def shown(path: Path) -> str:
    """A path relative to the working folder where it lies under it (the committed tables name no home folder)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _before(text: str, moment: datetime) -> bool:
    try:
        other = datetime.fromisoformat(text)
    except ValueError:
        return False
    return other.tzinfo is not None and other < moment
