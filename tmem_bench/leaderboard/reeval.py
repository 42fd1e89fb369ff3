"""Every number of an entry re-evaluated from the weights it ships: the model is rebuilt from the
cell's settings, its weights loaded, and it is evaluated again on the regenerated evaluation sets
and probed again for causality on the trained weights (eval and train mode).

On the machine that trained them the numbers come back to the last bit (also with another
thread count, and with PyTorch capped at AVX2). On another CPU a sum may run in another order
(another build of the native scan, another instruction set), so a logit may move in its last
bits and an argmax at a near tie may flip: the tolerances allow a few targets in a thousand and a
float32 mean's rounding in the loss. A forged accuracy, or weights swapped between cells (two
seeds of one model can have the same accuracy, not the same loss to four digits), fall outside.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

ACCURACY_TOLERANCE = 0.005  # absolute: 5 targets in 1,000
# A return in [-1, 1] moves by twice an accuracy (POPGym's rewards are +-1 over the scored steps).
RETURN_TOLERANCE = 2 * ACCURACY_TOLERANCE
LOSS_TOLERANCE = 1e-4  # relative to max(1, loss)
# A model up to this size is built and its weights' own check says whether they fit ("does not fit");
# past it, one whose parameters outgrow its weights file is refused before anything is allocated.
BUILD_FLOOR = 64 << 20


def reevaluate(result: dict, weights: Path, reject) -> dict | None:
    """Reject (through `reject(where, reason)`) an accuracy or loss that the cell's weights do not
    reproduce, weights that do not fit the cell's model, and a leak on the trained weights; returns
    what the weights gave ({"eval": [{level_key, accuracy, loss[, mean_return]}], "validation": {accuracy}
    or None}), or None when they could not be evaluated. Where a cell acted in its task's environment
    (harness.closed_loop), the model acts again on the same fixed episodes."""
    import torch

    from ..diagnostics.causality import causality_probe
    from ..harness.plan import cell_from_dict
    from ..harness.results import load_weights
    from ..harness.train import evaluate

    where = f"cells/{weights.name}"
    if weights.is_symlink():
        reject(where, "is a symbolic link; an entry's files are its own, and nothing outside the board is read")
        return
    if weights.exists() and not weights.is_file():
        reject(where, "is not a regular file")
        return
    if not weights.is_file():
        reject(where, "missing: an entry ships the trained weights of every cell, so that its numbers can be "
                      "re-evaluated")
        return None
    cell = cell_from_dict(result["cell"])
    try:
        model = build_within(cell, weights)
        load_weights(weights, model)
    except UsageError:
        raise  # a name the registry refuses: the validation of the whole entry stops on it, as it always did
    except ValueError as e:
        reject("weights", str(e))
        return None
    task = cell.task_object()
    device = torch.device("cpu")
    recomputed = {"eval": [], "validation": None}
    for ev in result["eval"]:
        batch, _ = task.eval_set(ev["level"], cell.train["eval_size"])
        accuracy, loss = evaluate(model, batch, device)
        recomputed["eval"].append({"level_key": ev["level_key"], "accuracy": accuracy, "loss": loss})
        field = f"cells/{result['cell_id']}.json: eval[{ev['level_key']}]"
        if abs(accuracy - ev["accuracy"]) > ACCURACY_TOLERANCE:
            reject(f"{field}.accuracy", f"claims {ev['accuracy']:.4f}; its weights give {accuracy:.4f} "
                                        f"(tolerance {ACCURACY_TOLERANCE})")
        if "loss" in ev and abs(loss - ev["loss"]) > LOSS_TOLERANCE * max(1.0, abs(loss)):
            reject(f"{field}.loss", f"claims {ev['loss']:.6f}; its weights give {loss:.6f}")
        if ev.get("closed_loop"):
            recomputed["eval"][-1]["mean_return"] = _act_again(task, model, ev, device, f"{field}.closed_loop", reject)
    validation = result.get("validation")
    if validation:
        batch, _ = task.validation_set(cell.train_level, cell.train["eval_size"])
        accuracy, _ = evaluate(model, batch, device)
        recomputed["validation"] = {"accuracy": accuracy}
        if abs(accuracy - validation["accuracy"]) > ACCURACY_TOLERANCE:
            reject(f"cells/{result['cell_id']}.json: validation.accuracy",
                   f"claims {validation['accuracy']:.4f}; its weights give {accuracy:.4f} (it chooses the lr)")
    probe_batch = task.sample(cell.train_level, 1, torch.Generator().manual_seed(cell.seed))
    seq_len = model.adapter(probe_batch).shape[1]
    for mode in ("eval", "train"):
        probe = causality_probe(model.backbone, cell.model_options["d_model"], seq_len,
                                blocked=model.adapter.blocked(probe_batch), seed=cell.seed, train_mode=mode == "train")
        if probe["verdict"] != "causal":
            reject(f"cells/{result['cell_id']}.json: causality", f"the probe on the trained weights in {mode} mode "
                                                                 f"finds the model {probe['verdict']!r}")
    return recomputed


def _act_again(task, model, ev: dict, device, field: str, reject) -> float | None:
    """The mean return of the model acting again on the episodes the cell claims, or None where the
    task (as installed here) has no environment or other episodes."""
    from ..harness.closed_loop import closed_loop_score

    claimed = ev["closed_loop"]
    again = closed_loop_score(task, model, ev["level"], device).get("closed_loop")
    if again is None:
        reject(field, "claims a return from acting in an environment; its task has none here")
        return None
    if again["seeds_fingerprint"] != claimed.get("seeds_fingerprint"):
        reject(f"{field}.seeds_fingerprint", "the episodes it claims to have acted on are not the task's fixed "
                                             "closed-loop episodes here")
        return None
    if abs(again["mean_return"] - claimed["mean_return"]) > RETURN_TOLERANCE:
        reject(f"{field}.mean_return", f"claims {claimed['mean_return']:.4f}; its weights acting in the "
                                       f"environment earn {again['mean_return']:.4f} (tolerance {RETURN_TOLERANCE})")
    return again["mean_return"]


def build_within(cell, weights: Path):
    """The cell's model, built only when its options name a model whose parameters fit in its weights
    file (or in BUILD_FLOOR): the model is first built on the meta device (no memory), so that a cell
    naming d_model 2^20 is refused in a line rather than allocating terabytes. ValueError says why not;
    a name the registry refuses raises its UsageError."""
    import torch

    from ..harness.train import build_model
    from .guard import size_problem

    problem = size_problem(cell.model_options)
    if problem:
        raise ValueError(f"the cell's {problem}")
    try:
        with torch.device("meta"):
            shape = build_model(cell)
    except TypeError as e:  # an option the factory does not take, or one it needs missing
        raise ValueError(f"the cell's model options do not build its model: {e}") from None
    needed = sum(t.numel() * t.element_size() for t in shape.state_dict().values())
    size = weights.stat().st_size
    if needed > max(size, BUILD_FLOOR):
        raise ValueError(f"the cell's options make a model of {needed:,} bytes of parameters, more than its "
                         f"{size:,}-byte weights file holds: not built")
    return build_model(cell)
