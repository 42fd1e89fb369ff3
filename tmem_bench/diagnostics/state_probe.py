"""The state probe: does a memory's state still hold the items where the model no longer answers?

A model that fails at many writes may have a state that is full, or a state that holds the items
and a read that never learned to find them; its accuracy cannot tell the two apart. The probe
freezes a trained model, runs it over the evidence of a sequence (the tokens up to the last one
`task.reach_positions` marks as evidence), takes the recurrent state it then holds through the
backbone's `memory_state` hook (`tmem_bench.contracts.model`), and trains a separate readout to answer the
sequence's queries from that state and the query tokens alone. Where the readout answers what the
model does not, the items are in the state and the read was not learned; where both fail, the
state is full only as far as this readout can tell, which is as far as it reads the states the
model does read (compare the two where the model answers).

No one readout reads every state format, so the probe trains a family of them
(probe_readouts.py), every member at the same budget on the same sequences, and keeps the one best
on its own validation sequences, reported with every member's accuracy. Each takes the state's
tensors flattened into one vector s and each query token q (the frozen adapter's embedding of it,
which for coordinate binding is a linear image of the noisy key), both standardised with statistics
of a calibration batch. Each step trains on fresh sequences, so a readout cannot memorise the states
it sees; the weights best on the probe's own validation sequences are scored on the cell's
evaluation set, the sequences the model's own accuracy was measured on. Data seeds come from the
task, level and the probe's name, apart from training, validation and evaluation seeds; every
readout's weights from `seed`. How far a number can be trusted is measured on states of known
content (probe_references.py).

This module probes one model; harness/probe_run.py probes a run directory's cells and writes
RUN_DIR/state_probe.json.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..contracts.device import eval_chunk, to_device
from ..contracts.model import TaskModel
from ..contracts.task import Batch, Task, split_batch
from ..errors import UsageError
from ..levels import Level
from .probe_readouts import DEFAULT_READOUTS, READOUTS, Layout, build_readout

NO_STATE = "no state to probe"
PROBED = "probed"


@dataclass(frozen=True)
class ReadoutConfig:
    readouts: tuple[str, ...] = DEFAULT_READOUTS  # the family trained; the best on validation is chosen
    width: int = 256  # gated: hidden units, learned features of the state, each gated by one of the query
    query_width: int = 128  # the query's network in gated, bilinear and attention
    mlp_width: int = 512
    bilinear_units: int = 64
    bilinear_query: int = 64  # rank of each bilinear unit: the query features it reads
    bilinear_rank: int = 1024  # the state's bottleneck before the units
    attention_width: int = 64
    attention_heads: int = 4
    learned_rows: int = 32  # rows a flat state is mapped to
    # The budget at which the family reads the mixed key-value matrix and the grids within the
    # calibration goal (docs/results.md#state-probe-calibration); fewer leave them "cannot tell".
    steps: int = 1500
    batch_size: int = 32  # fresh training sequences per step
    queries: int = 16  # queries per training sequence, where the task takes an `n_queries` option
    lr: float = 1e-3
    weight_decay: float = 0.01
    validation_size: int = 1024  # sequences
    validate_every: int = 200
    seed: int = 0

    def __post_init__(self):
        unknown = [r for r in self.readouts if r not in READOUTS]
        if unknown or not self.readouts:
            raise UsageError(f"readouts {', '.join(unknown) or '(none)'} unknown; known: {', '.join(READOUTS)}")


def describe_readout(config: ReadoutConfig = ReadoutConfig()) -> str:
    """One paragraph a report can print: the readout family, its capacity, seeds and steps."""
    c = config
    members = {
        "gated": f"gated, logits = W_o relu((W_s s + b_s) * g(q)) + b_o with {c.width} hidden units",
        "mlp": f"mlp, two hidden layers of {c.mlp_width} over [s, q]",
        "bilinear": f"bilinear, {c.bilinear_units} units each a rank-{c.bilinear_query} bilinear form of q and the "
                    f"state (through a rank-{c.bilinear_rank} bottleneck)",
        "attention": f"attention, {c.attention_heads}-head attention (width {c.attention_width}) of q over the "
                     f"state's rows (the last axis as features, channels first in a grid, a flat tensor mapped to "
                     f"{c.learned_rows} learned rows)",
        "rows_linear": "rows_linear, the same rows summed with weights of q alone, one per row position",
    }
    return (
        f"State probe: each trained model is frozen and run over the evidence tokens of a sequence; the "
        f"recurrent state it then holds (every tensor of its memory_state hook) and each query token q (the "
        f"model's input embedding of it) are standardised and read by each readout of a family: "
        f"{'; '.join(members[name] for name in c.readouts)}. Each is trained with AdamW (lr {c.lr:g}, weight decay "
        f"{c.weight_decay:g}) for {c.steps} steps of {c.batch_size} fresh sequences ({c.queries} queries each where "
        f"the task's n_queries can be set), from readout seed {c.seed} and data seeds of its own; the readout and "
        f"weights best on {c.validation_size} validation sequences of its own (checked every {c.validate_every} "
        f"steps) are chosen and scored on the cell's evaluation set, the sequences of the model's own accuracy. A "
        f"model whose backbone has no memory_state hook (attention alone) has no state to probe."
    )


def probe_problem(task: Task, level: Level, batch: Batch) -> str | None:
    """Why the probe cannot read this task at this level, or None: it needs evidence to stop the
    state after, and one answer token per target to put the query in."""
    evidence, answers = task.reach_positions(level, batch)
    if not bool(evidence.any()):
        return f"cannot probe: task {task.name!r} marks no evidence at this level"
    if int(answers.sum()) != batch["target"].shape[1]:
        return (f"cannot probe: task {task.name!r} marks {int(answers.sum())} answer tokens for "
                f"{batch['target'].shape[1]} targets; the probe needs one answer token per target")
    return None


class StateReader:
    """A frozen model's state after the evidence of a batch, and the batch's query tokens, on the
    model's device (batches are drawn on the CPU, so the same seed draws the same sequences anywhere)."""

    def __init__(self, model: TaskModel, task: Task, level: Level, device: torch.device):
        self.model, self.task, self.level, self.device = model.eval(), task, level, device

        self.layout: Layout | None = None  # the state tensors' shapes without the batch, once read

    @torch.no_grad()
    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(states (B, n), queries (B, Q, d), targets (B, Q)), or None without a state to probe."""
        evidence, answers = self.task.reach_positions(self.level, batch)
        length = int(evidence.nonzero().max()) + 1
        answers = answers.to(self.device)
        states, queries = [], []
        for part in split_batch(batch, eval_chunk(self.device)):
            part = to_device(part, self.device)
            state = self.model.memory_state(part, length)
            if not state:
                return None
            self.layout = [tuple(state[name].shape[1:]) for name in sorted(state)]
            # A plug-in may hand back its state where it built it rather than where the model runs.
            states.append(torch.cat([state[name].flatten(1).float().to(self.device) for name in sorted(state)], dim=1))
            queries.append(self.model.adapter(part)[:, answers])
        queries = torch.cat(queries)
        if queries.shape[1] != batch["target"].shape[1]:
            raise ValueError(f"task {self.task.name!r} marks {queries.shape[1]} answer tokens for "
                             f"{batch['target'].shape[1]} targets; the probe needs one answer token per target")
        return torch.cat(states), queries, batch["target"].to(self.device)


class Standardise:
    """Per-coordinate mean and spread of states and query tokens, from a calibration batch."""

    def __init__(self, states: torch.Tensor, queries: torch.Tensor):
        self.s_mean, self.s_std = states.mean(0), states.std(0).clamp_min(1e-6)
        flat = queries.flatten(0, 1)
        self.q_mean, self.q_std = flat.mean(0), flat.std(0).clamp_min(1e-6)

    def __call__(self, data):
        states, queries, target = data
        return (states - self.s_mean) / self.s_std, (queries - self.q_mean) / self.q_std, target


@torch.no_grad()
def accuracy(readout: nn.Module, data) -> float:
    states, queries, target = data
    n = eval_chunk(states.device)
    correct = sum((readout(s, q).argmax(-1) == t).sum().item()
                  for s, q, t in zip(states.split(n), queries.split(n), target.split(n)))
    return correct / target.numel()


def probe_model(model: TaskModel, task: Task, level: Level, eval_batch: Batch, config: ReadoutConfig,
                train_task: Task | None = None, device: torch.device = torch.device("cpu")) -> dict:
    """Train every readout of the family on `model`'s frozen states at `level`, choose the best on the
    probe's validation sequences and score it on `eval_batch`: {"status", "readout", "probe_accuracy",
    "probe_validation_accuracy", "best_step", "state_floats", "readouts"}, the last every member's
    {"validation", "evaluation", "best_step"}. `train_task` (default `task`) draws the training
    sequences, with more queries each where it can. The model is moved to `device`, where the
    readouts train; each readout is initialised on the CPU, so that its starting weights are the
    same on every device."""
    if task.reach_positions(level, eval_batch) is None:
        return {"status": f"not probed: task {task.name!r} marks no evidence and answer tokens"}
    train_task = train_task or task
    model.to(device)
    read = StateReader(model, task, level, device)
    evaluation = read(eval_batch)
    if evaluation is None:
        return {"status": NO_STATE}
    draw = StateReader(model, train_task, level, device)
    standardise = Standardise(*draw(train_task.sample(
        level, 1024, torch.Generator().manual_seed(task.reserved_seed("state_probe|calibration", level))))[:2])
    validation = standardise(read(task.sample(
        level, config.validation_size, torch.Generator().manual_seed(task.reserved_seed("state_probe|validation", level)))))
    evaluation = standardise(evaluation)

    names = list(config.readouts)
    members = {}
    for name in names:
        torch.manual_seed(config.seed)  # every member starts from the same seed, whichever others are trained
        readout = build_readout(name, read.layout, evaluation[1].shape[2], task.n_classes, config).to(device)
        optimizer = torch.optim.AdamW(readout.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        members[name] = [readout, optimizer, (-1.0, 0, None)]
    generator = torch.Generator().manual_seed(task.reserved_seed("state_probe|train", level))
    for step in range(1, config.steps + 1):
        # One draw of states per step, read by every member: the frozen model runs once, not once per readout.
        states, queries, target = standardise(draw(train_task.sample(level, config.batch_size, generator)))
        for member in members.values():
            readout, optimizer, best = member
            loss = F.cross_entropy(readout(states, queries).flatten(0, 1), target.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % config.validate_every == 0 or step == config.steps:
                score = accuracy(readout, validation)
                if score >= best[0]:  # on a tie, the longer trained
                    member[2] = (score, step, {k: v.clone() for k, v in readout.state_dict().items()})
    report = {}
    for name, (readout, _, (score, step, weights)) in members.items():
        readout.load_state_dict(weights)
        report[name] = {"validation": score, "evaluation": accuracy(readout, evaluation), "best_step": step}
    return {"status": PROBED, **chosen_readout(report), "state_floats": evaluation[0].shape[1], "readouts": report}


def chosen_readout(report: dict[str, dict]) -> dict:
    """The probe's number from its family's (`report`, member -> validation, evaluation, best_step,
    in the family's order): the member best on the probe's own validation sequences, the first in
    the family's order on a tie, so that the choice does not hang on which others were trained."""
    names = list(report)
    chosen = max(names, key=lambda n: (report[n]["validation"], -names.index(n)))
    return {"readout": chosen, "probe_accuracy": report[chosen]["evaluation"],
            "probe_validation_accuracy": report[chosen]["validation"], "best_step": report[chosen]["best_step"]}
