"""The checks every task must pass before its numbers mean anything, beside the backbones' in
conformance.py and in the same form: `check_task_x(factory, spec) -> CheckResult`, run by
`tmem-bench check --task` and by the tests over every registered task, over every variant the
task names and every level of its own grid (`Task.levels`). A check never raises: a crash in the
task's code is a failed check whose detail names the exception.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from ..contracts.environment import acts
from ..contracts.model import TaskModel
from ..contracts.task import MAX_TRAIN_SEED, SEED_BITS, Task, fingerprint
from ..levels import level_key
from .conformance import CheckResult, guarded
from .conformance_acting import environment_problem
from .reach import reach_probe

ATTENTION_REFERENCE = "base"  # attention and nothing else: what memory forcing must leave blind
TASK_WIDTH = 16  # d_model of the adapters and the attention reference the task checks build


@dataclass(frozen=True)
class TaskSpec:
    """How the task checks build a task: every named variant with `options` too; `eval_size`
    samples per evaluation set; `name` loads the task again in a fresh process (a registered
    name or module:attribute; by default the factory's own module and name)."""

    options: dict = field(default_factory=dict)
    eval_size: int = 2048
    name: str | None = None


def task_variants(factory: Callable, options: dict) -> list[tuple[str, Task]]:
    """(name, task) of every variant the task names, each built with `options` under its own."""
    return [(name, factory(**{**options, **own})) for name, own in factory(**options).variants.items()]


def task_levels(task: Task) -> list[dict]:
    """Every level of the task's own grid, validated."""
    combos = itertools.product(*(task.levels[axis] for axis in task.axes))
    return [task.validate_level(dict(zip(task.axes, combo))) for combo in combos]


def _tolerance(n: int, p: float) -> float:
    """Five binomial standard deviations of an accuracy over n samples."""
    return 5 * math.sqrt(max(p * (1 - p), 1e-12) / n)


def _each(factory: Callable, spec: TaskSpec, body: Callable[[str, Task, dict], str | None],
          what: str) -> tuple[bool, str]:
    """`body` at every variant and level; the first message it returns is the failure."""
    n = 0
    for name, task in task_variants(factory, spec.options):
        for level in task_levels(task):
            problem = body(name, task, level)
            if problem:
                return False, f"{name} at {level_key(level)}: {problem}"
            n += 1
    return True, f"{what} at {n} (variant, level) pairs"


def _json(value):
    """`value` as a cell records it: through JSON and back (a TypeError where it is not JSON)."""
    return json.loads(json.dumps(value))


def check_task_declarations(factory: Callable, spec: TaskSpec) -> CheckResult:
    """A Task with a name, axes, classes and version; its levels cover its axes; every variant
    builds, is memory-forcing exactly when it says so (by the task and by the registered factory,
    which the report and the board ask without building a task), and what a cell records of it
    (its options and levels, as JSON) rebuilds it."""
    def body():
        task = factory(**spec.options)
        if not isinstance(task, Task):
            return False, f"the factory returned {type(task).__name__}, not a tmem_bench.contracts.task.Task"
        if not callable(getattr(factory, "forces_memory", None)):
            return False, (f"the registered factory {getattr(factory, '__qualname__', factory)!r} has no forces_memory "
                           "(the report and the board call it on what is registered, without building a task): "
                           "register the Task class itself")
        if not (isinstance(task.name, str) and task.name and isinstance(task.version, int) and task.version >= 1):
            return False, (f"name {task.name!r} and version {task.version!r} must be a non-empty string and "
                           "an integer >= 1")
        if not (isinstance(task.n_classes, int) and task.n_classes >= 2):
            return False, f"n_classes must be an integer >= 2, got {task.n_classes!r}"
        if set(task.levels) != set(task.axes) or not all(task.levels[a] for a in task.axes):
            return False, f"levels {task.levels} must give values for exactly the axes {list(task.axes)}"
        unknown = [v for v in task.memory_forcing if v not in task.variants]
        if unknown:
            return False, f"memory_forcing names {unknown}, not among the variants {list(task.variants)}"
        if task.forces_memory(task.options()):
            return False, "the default options (the standard variant) are memory-forcing; name that a variant instead"
        for name, variant in task_variants(factory, spec.options):
            forcing = name in task.memory_forcing
            if variant.forces_memory(variant.options()) != forcing:
                return False, (f"variant {name} {'is' if not forcing else 'is not'} memory-forcing "
                               f"by its options {variant.options()}, but memory_forcing says otherwise")
            if factory.forces_memory(variant.options()) != forcing:
                return False, (f"variant {name}: the registered factory's forces_memory says {not forcing}, the task "
                               f"says {forcing} (declare variants and memory_forcing on the class)")
            try:
                recorded = _json(variant.options())
            except (TypeError, ValueError) as e:
                return False, f"variant {name}: its options {variant.options()} are not JSON, as every cell records them ({e})"
            again = factory(**recorded)
            for level in task_levels(variant):
                try:
                    back = variant.validate_level(_json(level))
                except Exception as e:  # noqa: BLE001 - not JSON, or refused once it is: this check's failure
                    back = f"{type(e).__name__}: {e}"
                if back != level:
                    return False, (f"variant {name}: the level {level} comes back from JSON as {back} "
                                   "(a cell records its levels as JSON)")
            level = task_levels(variant)[-1]
            # Data that a seed does not fix is the fingerprints check's failure, not this one's.
            a, a2, b = (fingerprint(t.sample(level, 4, torch.Generator().manual_seed(0)))
                        for t in (variant, variant, again))
            if _json(again.options()) != recorded or a == a2 != b:
                return False, f"variant {name}: its recorded options {recorded} do not rebuild it"
        forcing = ", ".join(task.memory_forcing) or "none"
        return True, (f"{task.name} v{task.version}: axes {', '.join(task.axes) or 'none'}, {task.n_classes} classes, "
                      f"variants {', '.join(task.variants)} (memory-forcing: {forcing})")
    return guarded("declarations", body)


def check_task_batches(factory: Callable, spec: TaskSpec) -> CheckResult:
    """Batches, tokens, logits and masks have the contract's shapes and types."""
    def at(name, task, level):
        batch = task.sample(level, 5, torch.Generator().manual_seed(0))
        target = batch["target"]
        if target.dtype != torch.int64 or target.ndim != 2 or target.shape[0] != 5:
            return f"target is {target.dtype} {tuple(target.shape)}, expected int64 (5, n_scored)"
        if target.min() < 0 or target.max() >= task.n_classes:
            return f"a target lies outside 0..{task.n_classes - 1}"
        if any(v.shape[0] != 5 for v in batch.values()):
            return "a batch tensor does not have the batch size first"
        adapter = task.make_adapter(TASK_WIDTH)
        x = adapter(batch)
        if x.dtype != torch.float32 or x.ndim != 3 or x.shape[::2] != (5, TASK_WIDTH):
            return f"the adapter gives {x.dtype} {tuple(x.shape)}, expected float32 (5, S, {TASK_WIDTH})"
        logits = adapter.head(torch.randn_like(x), batch)
        if tuple(logits.shape) != (5, target.shape[1], task.n_classes):
            return f"the head gives {tuple(logits.shape)}, expected {(5, target.shape[1], task.n_classes)}"
        blocked = adapter.blocked(batch)
        if blocked is not None and (blocked.dtype != torch.bool or tuple(blocked.shape) != (x.shape[1],) * 2):
            return f"blocked is {blocked.dtype} {tuple(blocked.shape)}, expected bool {(x.shape[1],) * 2}"
        return None
    return guarded("batches", lambda: _each(factory, spec, at, "shapes and types"))


def check_task_oracle(factory: Callable, spec: TaskSpec) -> CheckResult:
    """The oracle reaches the ceiling (exactly where it is 1), and chance <= ceiling <= 1."""
    def at(name, task, level):
        batch, _ = task.eval_set(level, spec.eval_size)
        ceiling, chance = task.ceiling(level, batch), task.chance(level)
        accuracy = (task.oracle(level, batch) == batch["target"]).float().mean().item()
        if not chance <= ceiling <= 1.0:
            return f"ceiling {ceiling:.4f} is not between chance {chance:.4f} and 1"
        # A ceiling below 1 is an expectation; the oracle's guesses on this set scatter around it.
        if (accuracy != 1.0) if ceiling == 1.0 else abs(accuracy - ceiling) >= _tolerance(batch["target"].numel(), 0.5):
            return f"the oracle scores {accuracy:.4f}, the ceiling is {ceiling:.4f}"
        return None
    return guarded("oracle", lambda: _each(factory, spec, at, "the oracle reaches the ceiling"))


def check_task_chance(factory: Callable, spec: TaskSpec) -> CheckResult:
    """chance() is the accuracy of the best constant predictor on the evaluation set."""
    def at(name, task, level):
        target = task.eval_set(level, spec.eval_size)[0]["target"]
        best = max((target == c).float().mean().item() for c in range(task.n_classes))
        chance = task.chance(level)
        # Targets within one sample may be dependent, so the tolerance counts samples, not targets.
        if abs(best - chance) >= _tolerance(target.shape[0], chance):
            return f"the best constant predictor scores {best:.4f}, chance() says {chance:.4f}"
        return None
    return guarded("chance", lambda: _each(factory, spec, at, "chance is the best constant predictor"))


# The caller handed this process the task's factory, so its module has already run here: the fresh
# process may import it by name too.
_FINGERPRINTS = ("import json, sys\nfrom tmem_bench.diagnostics.conformance_tasks import eval_fingerprints\n"
                 "from tmem_bench.registry import TASKS, module_names\nwith module_names(True):\n"
                 "    print(json.dumps(eval_fingerprints(TASKS.get(sys.argv[1]), json.loads(sys.argv[2]), 64)))")


def eval_fingerprints(factory: Callable, options: dict, size: int) -> dict[str, str]:
    """The fingerprint of every variant's evaluation set at every level, by "variant|level"."""
    return {f"{variant}|{level_key(level)}": task.eval_set(level, size)[1]
            for variant, task in task_variants(factory, options) for level in task_levels(task)}


def check_task_fingerprints(factory: Callable, spec: TaskSpec) -> CheckResult:
    """Batches are a function of the generator alone; evaluation seeds are apart from training seeds
    and from each other; a fresh process draws evaluation sets with the same fingerprints."""
    def at(name, task, level):
        a, b, c = (fingerprint(task.sample(level, 16, torch.Generator().manual_seed(s))) for s in (3, 3, 4))
        if a != b:
            return "the same generator seed gives different batches (a draw outside the generator?)"
        if a == c:
            return "generator seeds 3 and 4 give the same batch"
        if not MAX_TRAIN_SEED <= task.validation_seed(level) < SEED_BITS or task.eval_seed(level) < MAX_TRAIN_SEED:
            return "an evaluation or validation seed lies among the training seeds"
        return None

    def body():
        passed, detail = _each(factory, spec, at, "seeded batches")
        if not passed:
            return passed, detail
        for name, task in task_variants(factory, spec.options):
            seeds = [task.eval_seed(level) for level in task_levels(task)]
            if len(set(seeds)) != len(seeds):
                return False, f"{name}: two levels share an evaluation set seed"
        where = spec.name or f"{factory.__module__}:{factory.__qualname__}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # where the task was found
        out = subprocess.run([sys.executable, "-c", _FINGERPRINTS, where, json.dumps(spec.options)],
                             capture_output=True, text=True, env=env, timeout=600)
        if out.returncode != 0:
            lines = out.stderr.strip().splitlines() or ["no output"]
            return False, f"a fresh process could not load the task as {where!r}: {lines[-1]}"
        here = eval_fingerprints(factory, spec.options, 64)
        there = json.loads(out.stdout.strip().splitlines()[-1])
        differ = [k for k in here if here[k] != there.get(k)]
        if differ or set(there) != set(here):
            return False, f"a fresh process draws other evaluation sets: {', '.join(differ) or 'other levels'}"
        return True, f"{detail}; {len(here)} evaluation sets equal in a fresh process"
    return guarded("fingerprints", body)



def _attention_reference(n_layers: int = 2) -> nn.Module:
    from ..registry import get_backbone

    torch.manual_seed(0)
    return get_backbone(ATTENTION_REFERENCE, d_model=TASK_WIDTH, n_layers=n_layers, n_heads=2, dropout=0.0).eval()


def _tokens(task: Task, level: dict, n: int) -> tuple[nn.Module, dict, torch.Tensor, torch.Tensor | None]:
    torch.manual_seed(0)
    adapter = task.make_adapter(TASK_WIDTH).eval()
    batch = task.sample(level, n, torch.Generator().manual_seed(0)) if n <= 16 else task.eval_set(level, n)[0]
    with torch.no_grad():
        return adapter, batch, adapter(batch), adapter.blocked(batch)


def check_task_blocked(factory: Callable, spec: TaskSpec) -> CheckResult:
    """Blocked edges remove exactly the attention paths they name: through the attention reference
    (two layers) each output moves with exactly the inputs that unblocked edges reach, in one step
    or two; no token is cut from itself; and in a memory-forcing variant some level blocks edges
    and no path at all, however indirect, joins the two ends of a blocked edge."""
    n_layers = 2

    def body():
        model, n_checked = _attention_reference(n_layers), 0
        for name, task in task_variants(factory, spec.options):
            cuts = 0
            for level in task_levels(task):
                _, _, x, blocked = _tokens(task, level, 1)
                if blocked is None:
                    continue
                S = x.shape[1]
                if blocked.diagonal().any():
                    return False, f"{name} at {level_key(level)}: a token is blocked from itself"
                allowed = torch.ones(S, S, dtype=torch.bool).tril() & ~blocked
                reach = allowed
                for _ in range(n_layers - 1):
                    reach = (reach.float() @ allowed.float()) > 0
                moved = torch.zeros(S, S, dtype=torch.bool)  # [i, j]: output i moves when input j does
                with torch.no_grad():
                    y = model(x, blocked)
                    for j in range(S):
                        x2 = x.clone()
                        x2[:, j] += torch.randn(TASK_WIDTH, generator=torch.Generator().manual_seed(j))
                        moved[:, j] = (model(x2, blocked) != y)[0].any(-1)
                if not torch.equal(moved, reach):
                    i, j = (moved ^ reach).nonzero()[0].tolist()
                    moves = moved[i, j].item()
                    return False, (f"{name} at {level_key(level)}: output {i} {'moves' if moves else 'does not move'} "
                                   f"with input {j}, which blocked says it {'cannot' if moves else 'can'} reach")
                if name in task.memory_forcing and (reach & blocked).any():
                    i, j = (reach & blocked).nonzero()[0].tolist()
                    return False, (f"{name} at {level_key(level)}: the edge {i} -> {j} is blocked, but attention "
                                   f"reaches {j} from {i} through other tokens")
                cuts += bool(blocked.any())
                n_checked += 1
            if name in task.memory_forcing and not cuts:
                return False, f"memory-forcing variant {name} blocks no edge at any level"
        if not n_checked:
            return True, "no variant blocks an edge"
        return True, f"exact at {n_checked} (variant, level) pairs with blocked edges"
    return guarded("blocked", body)


def check_task_blind(factory: Callable, spec: TaskSpec) -> CheckResult:
    """A memory-forcing variant leaves attention alone at chance: the attention reference's answer
    does not move when the blocked tokens are swapped between samples (and does without the
    mask), and what attention still sees says nothing of the target (a nearest-neighbour reader
    of those tokens scores at chance)."""
    def body():
        model, n_checked = _attention_reference(), 0
        for name, task in task_variants(factory, spec.options):
            if name not in task.memory_forcing:
                continue
            for level in task_levels(task):
                _, batch, x, blocked = _tokens(task, level, spec.eval_size)
                if blocked is None or not blocked.any():
                    continue
                where = f"{name} at {level_key(level)}"
                moved = _moves_with_blocked(model, x, blocked)
                if moved:
                    return False, f"{where}: {moved}"
                seen = x[:, ~blocked.any(0)].flatten(1)  # the tokens every answer may attend to
                distance = torch.cdist(seen, seen).fill_diagonal_(float("inf"))
                target = batch["target"]
                accuracy = (target[distance.argmin(1)] == target).float().mean().item()
                chance = task.chance(level)
                if accuracy > chance + _tolerance(target.shape[0], chance):
                    return False, (f"{where}: the tokens attention still sees tell the target (a nearest-neighbour "
                                   f"reader scores {accuracy:.3f}, chance is {chance:.3f})")
                n_checked += 1
        if not n_checked:
            return True, "no memory-forcing variant"
        return True, f"attention alone at chance at {n_checked} (variant, level) pairs"
    return guarded("blind", body)


MAX_PATTERNS = 4  # groups of rows the blind check swaps for (check_task_blocked checks every edge)


def _moves_with_blocked(model, x: torch.Tensor, blocked: torch.Tensor) -> str | None:
    """What is wrong where the attention reference's output at a row moves when the tokens that row
    may not attend to are swapped between samples, or stays when the mask is lifted; rows grouped by
    their blocked tokens (a step that sees only its own observation has a pattern of its own)."""
    groups: dict[tuple, list[int]] = {}
    for i in blocked.any(1).nonzero().flatten().tolist():
        groups.setdefault(tuple(blocked[i].tolist()), []).append(i)
    patterns = list(groups.items())
    if len(patterns) > MAX_PATTERNS:
        patterns = [patterns[round(k * (len(patterns) - 1) / (MAX_PATTERNS - 1))] for k in range(MAX_PATTERNS)]
    with torch.no_grad():
        masked, free = model(x, blocked), model(x, None)
        for pattern, rows in patterns:
            hidden = torch.tensor(pattern)
            swapped = x.clone()
            swapped[:, hidden] = x.roll(1, 0)[:, hidden]
            if not torch.equal(masked[:, rows], model(swapped, blocked)[:, rows]):
                return f"the attention reference's answer moves with the blocked tokens (at token {rows[0]})"
            if torch.equal(free[:, rows], model(swapped, None)[:, rows]):
                return f"the answer does not read the blocked tokens even without the mask (at token {rows[0]})"
    return None

def _positions(positions, S: int) -> tuple[torch.Tensor, torch.Tensor] | str:
    """reach_positions' answer as (evidence, answer), or what is wrong with it."""
    if not (isinstance(positions, (tuple, list)) and len(positions) == 2
            and all(isinstance(p, torch.Tensor) for p in positions)):
        return f"reach_positions gives {type(positions).__name__}, not a pair of tensors (evidence, answer)"
    shapes = [f"{p.dtype} {tuple(p.shape)}" for p in positions]
    if any(p.dtype != torch.bool or tuple(p.shape) != (S,) for p in positions):
        return f"reach_positions gives {' and '.join(shapes)}, expected two bool ({S},) masks over the adapter's tokens"
    evidence, answer = (p.cpu() for p in positions)
    if not answer.any():
        return "reach_positions marks no answer token"
    if (evidence & answer).any():
        return f"token {int((evidence & answer).nonzero()[0])} is marked both evidence and answer"
    if evidence.any() and int(evidence.nonzero().max()) > int(answer.nonzero().min()):
        return (f"evidence token {int(evidence.nonzero().max())} comes after answer token {int(answer.nonzero().min())}: "
                "the answer can only be read from earlier tokens (the state probe reads the state after the last "
                "evidence token)")
    return evidence, answer


def check_task_reach(factory: Callable, spec: TaskSpec) -> CheckResult:
    """Where a variant marks reach positions (`Task.reach_positions`: the reach probe of every cell
    and the state probe read them), they are two bool masks over its adapter's tokens, disjoint,
    with some answer tokens and every evidence token before every answer token; every
    memory-forcing variant marks them, and at every level where it blocks edges, some evidence
    that the blocked edges cut from the answer: the reach probe on the attention reference finds
    an evidence gradient of exactly 0 there."""
    def body():
        reference, marked, unmarked = _attention_reference(), 0, []
        for name, task in task_variants(factory, spec.options):
            forcing = name in task.memory_forcing
            for level in task_levels(task):
                where = f"{name} at {level_key(level)}"
                adapter, batch, x, blocked = _tokens(task, level, 4)
                positions = task.reach_positions(level, batch)
                if positions is None:
                    if forcing:
                        return False, (f"{where}: a memory-forcing variant marks no evidence and answer tokens "
                                       "(reach_positions gives None); the reach and state probes read them")
                    unmarked.append(name)
                    continue
                found = _positions(positions, x.shape[1])
                if isinstance(found, str):
                    return False, f"{where}: {found}"
                marked += 1
                if not (forcing and blocked is not None and blocked.any()):
                    continue
                if not found[0].any():
                    return False, f"{where}: the memory-forcing variant blocks edges but marks no evidence"
                reach = reach_probe(TaskModel(adapter, reference), task, level, batch)
                if reach["evidence_grad"] != 0:
                    return False, (f"{where}: attention still carries the marked evidence to the marked answer (the reach "
                                   f"probe's evidence gradient is {reach['evidence_grad']:.3g}, not 0): the blocked "
                                   "edges do not cut what reach_positions marks")
        if not marked:
            return True, "no variant marks evidence and answer tokens (none is memory-forcing)"
        without = f"; none marked in {', '.join(dict.fromkeys(unmarked))}" if unmarked else ""
        return True, f"evidence and answer marked at {marked} (variant, level) pairs{without}"
    return guarded("reach", body)


def check_task_environment(factory: Callable, spec: TaskSpec) -> CheckResult:
    """A task that declares an environment keeps the contract of contracts/environment.py at every
    variant and level, as the closed loop needs (conformance_acting.environment_problem)."""
    def body():
        if not acts(factory(**spec.options)):
            return True, "no environment: the task does not act"
        return _each(factory, spec, lambda name, task, level: environment_problem(task, level), "acts in its environment")
    return guarded("environment", body)


TASK_CHECKS = (
    check_task_declarations, check_task_batches, check_task_oracle, check_task_chance, check_task_fingerprints,
    check_task_blocked, check_task_blind, check_task_reach, check_task_environment,
)


def task_check_name(check: Callable) -> str:
    return check.__name__.removeprefix("check_task_")


def run_task_checks(factory: Callable, spec: TaskSpec | None = None) -> list[CheckResult]:
    """Every task check in turn; when the declarations fail the rest are reported as not run."""
    spec = spec or TaskSpec()
    first = check_task_declarations(factory, spec)
    if not first.passed:
        return [first] + [CheckResult(task_check_name(c), False, "not run: the task's declarations fail")
                          for c in TASK_CHECKS[1:]]
    return [first] + [check(factory, spec) for check in TASK_CHECKS[1:]]
