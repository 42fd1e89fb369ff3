"""Train and evaluate one Cell. A cell needs nothing but its own description."""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, is_dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..contracts.device import eval_chunk, hardware, matmul_precision, resolve_device, to_device
from ..contracts.model import TaskModel
from ..contracts.task import Batch, level_key, split_batch
from ..diagnostics.causality import causality_probe
from ..diagnostics.convergence import convergence, early_stop_rule, should_stop
from ..diagnostics.reach import reach_probe
from ..registry import get_backbone
from ..version import __version__
from .closed_loop import closed_loop_score
from .plan import Cell

# Offset of the seed of the generator that draws training levels under `mixed_levels`.
MIX_SEED = 1 << 20


def build_model(cell: Cell) -> TaskModel:
    torch.manual_seed(cell.seed)
    task = cell.task_object()
    backbone = get_backbone(cell.model, **cell.model_options)
    return TaskModel(task.make_adapter(cell.model_options["d_model"]), backbone)


def loss_and_accuracy(model: TaskModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(batch)  # (B, n_scored, n_classes)
    target = batch["target"]  # (B, n_scored)
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
    correct = (logits.argmax(-1) == target).float().mean()
    return loss, correct


@torch.no_grad()
def evaluate(model: TaskModel, batch: Batch, device: torch.device) -> tuple[float, float]:
    """Accuracy and loss on a whole evaluation set."""
    model.eval()
    n = total_loss = total_correct = 0.0
    for part in split_batch(batch, eval_chunk(device)):
        part = to_device(part, device)
        loss, acc = loss_and_accuracy(model, part)
        k = part["target"].numel()
        total_loss += loss.item() * k
        total_correct += acc.item() * k
        n += k
    return total_correct / n, total_loss / n


def validation_check(model: TaskModel, batch: Batch, device: torch.device) -> dict:
    """The validation set's loss and accuracy during training, in eval mode and with the random
    state put back, so that a cell draws the same numbers whether or not it is checked."""
    cuda = None if device.type != "cuda" else device.index if device.index is not None else torch.cuda.current_device()
    with torch.random.fork_rng(devices=[] if cuda is None else [cuda]):
        accuracy, loss = evaluate(model, batch, device)
    model.train()
    return {"loss": loss, "accuracy": accuracy}


def _convergence(history: list[dict], checks: list[dict], early, diverged: bool) -> dict:
    """The convergence rule's verdict: on the validation checks where training stopped early, else
    on the logged train loss."""
    if diverged:
        return {"converged": None, "diverged": True}
    return convergence(history, checks if early is not None else None)


def _save(model, optimizer, generators, window: dict, device: torch.device, step: int) -> dict:
    """Everything the next steps of training read, copied: weights, optimizer state, every random
    stream a step draws from, and the log window's sums."""
    return {"step": step, "model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
            "generators": [g.get_state() for g in generators], "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "window": {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in window.items()}}


def _restore(saved: dict, model, optimizer, generators, window: dict, device: torch.device) -> None:
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    for g, state in zip(generators, saved["generators"]):
        g.set_state(state)
    torch.set_rng_state(saved["rng"])
    if saved["cuda_rng"] is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"], device)
    window.update(saved["window"])


def _config(backbone) -> dict | None:
    """Every setting of the backbone, defaults included, so results record what actually ran."""
    config = getattr(backbone, "config", None)
    return asdict(config) if is_dataclass(config) else None


def _scan_kernel(backbone) -> str | None:
    """The implementation that ran, from a backbone that chooses one per machine (its
    `scan_kernel()`, e.g. Tensor Memory's "native (avx2)", "compiled", "eager"); else None."""
    scan_kernel = getattr(backbone, "scan_kernel", None)
    return scan_kernel() if callable(scan_kernel) else None


def _state_bytes(backbone, seq_len: int) -> int | None:
    state_size = getattr(backbone, "state_size", None)
    return int(state_size(seq_len)) if callable(state_size) else None


def run_cell(
    cell: Cell,
    device: str | torch.device = "cpu",
    on_step: Callable[[int, int], None] | None = None,
) -> dict:
    """Train one cell from scratch and return its JSON-ready result."""
    return train_cell(cell, device, on_step)[0]


def train_cell(
    cell: Cell,
    device: str | torch.device = "cpu",
    on_step: Callable[[int, int], None] | None = None,
) -> tuple[dict, TaskModel]:
    """Train one cell from scratch: its JSON-ready result and the trained model."""
    device = resolve_device(device) if isinstance(device, str) else device
    with matmul_precision(cell.train.get("tf32", False)):
        return _train_cell(cell, device, on_step)


def _train_cell(cell: Cell, device: torch.device, on_step) -> tuple[dict, TaskModel]:
    start = time.perf_counter()
    task = cell.task_object()
    model = build_model(cell).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_backbone_params = sum(p.numel() for p in model.backbone.parameters())
    train = cell.train

    generator = torch.Generator().manual_seed(cell.seed)
    probe_batch = to_device(task.sample(cell.train_level, 1, torch.Generator().manual_seed(cell.seed)), device)
    seq_len = model.adapter(probe_batch).shape[1]
    blocked = model.adapter.blocked(probe_batch)
    causality = causality_probe(
        model.backbone, cell.model_options["d_model"], seq_len, blocked=blocked, seed=cell.seed, device=device
    )
    # The reach probe's batch is drawn from its own generator, so training sees the same batches.
    reach_batch = to_device(task.sample(cell.train_level, 16, torch.Generator().manual_seed(cell.seed)), device)
    reach_init = reach_probe(model, task, cell.train_level, reach_batch, seed=cell.seed)

    optimizer = torch.optim.AdamW(model.parameters(), lr=train["lr"], weight_decay=train["weight_decay"])
    gate_init = model.gate_values()
    history = []
    # The validation set comes from its own seed, so drawing it first leaves training's batches alone.
    validation_batch, validation_fp = task.validation_set(cell.train_level, train["eval_size"])
    early = early_stop_rule(train["early_stop"]) if train.get("early_stop") else None
    checks: list[dict] = []

    def check(step: int) -> bool:
        """Measure the validation set; whether the early-stopping rule says to stop here."""
        checks.append({"step": step, **validation_check(model, validation_batch, device)})
        return should_stop(checks, task.chance(cell.train_level), early)

    mix = train.get("mixed_levels")
    # Levels are drawn from a generator of their own, so the batches' draws follow the same stream.
    mix_generator = torch.Generator().manual_seed(MIX_SEED + cell.seed) if mix else None

    def batch_level() -> dict:
        if mix is None:
            return cell.train_level
        top = cell.train_level[mix["axis"]]
        return {**cell.train_level, mix["axis"]: int(torch.randint(mix["low"], top + 1, (1,), generator=mix_generator))}

    if early is not None:
        check(0)
    model.train()
    window = {"start": time.perf_counter(), "steps": 0, "loss": 0.0, "acc": 0.0}

    def log(step: int) -> None:
        now = time.perf_counter()
        history.append({
            "step": step,
            "loss": (window["loss"] / window["steps"]).item(),
            "train_acc": (window["acc"] / window["steps"]).item(),
            "steps_per_s": window["steps"] / (now - window["start"]),
            "gates": model.gate_values(),
        })
        window.update(start=now, steps=0, loss=0.0, acc=0.0)

    def train_step(step: int) -> torch.Tensor:
        """One update; its loss, left on the device."""
        batch = to_device(task.sample(batch_level(), train["batch_size"], generator), device)
        loss, acc = loss_and_accuracy(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        optimizer.step()
        window["loss"] += loss.detach()
        window["acc"] += acc.detach()
        window["steps"] += 1
        return loss

    # The loss is read on the host only where training reads the device anyway (a log or a validation
    # check), so that the device never waits on Python between steps. A non-finite loss is found
    # there; training is then put back to the last read and replayed to the step before it, so the
    # weights evaluated are the last finite ones, as if every step had been read.
    generators = (generator, mix_generator) if mix_generator is not None else (generator,)
    first_bad = torch.zeros((), dtype=torch.long, device=device)
    saved = _save(model, optimizer, generators, window, device, 0)
    diverged_at = None
    stopped = "cap"
    step = 0
    while step < train["steps"]:
        step += 1
        loss = train_step(step)
        first_bad = torch.where((first_bad == 0) & ~torch.isfinite(loss), step, first_bad)
        last = step == train["steps"]
        checking = early is not None and (step % early.every == 0 or last)
        if checking or step % train["log_every"] == 0 or last:
            bad = int(first_bad)
            if bad:
                _restore(saved, model, optimizer, generators, window, device)
                for again in range(saved["step"] + 1, bad):
                    train_step(again)
                diverged_at, stopped = bad, "diverged"
                if window["steps"]:
                    log(bad - 1)
                break
            if checking and check(step):
                stopped = "converged"
            if step % train["log_every"] == 0 or last or stopped == "converged":
                log(step)
            saved = _save(model, optimizer, generators, window, device, step)
        if on_step is not None:
            on_step(step, train["steps"])
        if stopped == "converged":
            break
    train_time = time.perf_counter() - start
    steps_done = step if diverged_at is None else diverged_at - 1

    evals = []
    for level in cell.eval_levels:
        eval_batch, fp = task.eval_set(level, train["eval_size"])
        accuracy, eval_loss = evaluate(model, eval_batch, device)
        accuracy_off = None
        if model.gated:
            with model.memory_disabled():
                accuracy_off, _ = evaluate(model, eval_batch, device)
        evals.append({
            "level": level,
            "level_key": level_key(level),
            "accuracy": accuracy,
            "accuracy_memory_off": accuracy_off,
            "loss": eval_loss,
            "chance": task.chance(level),
            "ceiling": task.ceiling(level, eval_batch),
            "n": eval_batch["target"].numel(),
            "fingerprint": fp,
            **closed_loop_score(task, model, level, device),  # where the task has an environment to act in
        })

    validation_accuracy, validation_loss = evaluate(model, validation_batch, device)
    # Again on the trained weights: a leak may open during training, or only in train mode.
    causality_trained = {mode: causality_probe(model.backbone, cell.model_options["d_model"], seq_len,
                                               blocked=blocked, seed=cell.seed, device=device,
                                               train_mode=mode == "train")
                         for mode in ("eval", "train")}
    result = {
        "schema": 1,
        "cell_id": cell.id,
        "status": "finished" if diverged_at is None else "diverged",
        "diverged_at_step": diverged_at,
        "steps_run": steps_done,
        "stopped": stopped,
        "cell": asdict(cell),
        "tmem_bench_version": __version__,
        "torch_version": torch.__version__,
        "device": str(device),
        "hardware": hardware(device),
        "model_config": _config(model.backbone),
        "scan_kernel": _scan_kernel(model.backbone),
        "n_params": n_params,
        "n_backbone_params": n_backbone_params,
        "wall_time_s": time.perf_counter() - start,
        "train_time_s": train_time,
        "steps_per_s": steps_done / train_time,
        "causality": causality,
        "causality_trained": causality_trained,
        "reach": {"init": reach_init,
                  "trained": reach_probe(model, task, cell.train_level, reach_batch, seed=cell.seed)},
        "state_bytes": _state_bytes(model.backbone, seq_len),
        "validation": {
            "level_key": level_key(cell.train_level),
            "accuracy": validation_accuracy,
            "loss": validation_loss,
            "n": validation_batch["target"].numel(),
            "fingerprint": validation_fp,
        },
        "convergence": _convergence(history, checks, early, diverged_at is not None),
        "validation_checks": checks if early is not None else None,
        "gate_init": gate_init,
        "gates_final": model.gate_values(),
        "history": history,
        "eval": evals,
    }
    return result, model
