"""What the report's test modules share: cell files in the schema of tmem_bench.harness.train.run_cell
with chosen accuracies (nothing is trained), a full synthetic run, and runs for the power check."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from tmem_bench.harness.plan import LRSearch, cell_from_dict
from tmem_bench.files import write_json
from tmem_bench.harness.results import read_cell
from tmem_bench.report import load_run, power_rows

AXES = {"coordinate_binding": ("n_writes", "noise"), "occlusion": ("occlusion_len",),
        "map_building": ("horizon",), "no_harm": ()}
CHANCE = {"coordinate_binding": 1 / 32, "occlusion": 0.25, "map_building": 0.5, "no_harm": 1 / 16}
GATE_INIT = {"layer0": 0.5, "layer1": 0.5}
MARGIN = 0.05  # claims.toml's margin


def options_of(variant: str) -> dict:
    """The task options a variant label stands for (the planner names a variant by its changed options)."""
    if variant == "standard":
        return {}
    return {k: json.loads(v.lower()) for k, v in (part.split("=") for part in variant.split(","))}


def trained(converged):
    """A cell's validation checks that the convergence rule reads as `converged`: a plateau (True), a
    loss falling 10% a check to the cap (False), or none, where the default history is too short to
    tell (None)."""
    if converged is None:
        return {"validation_checks": None}
    losses = [3.4, 1.0, 0.6, 0.5, 0.5, 0.5, 0.5] if converged else [3.4 * 0.9 ** i for i in range(7)]
    return {"validation_checks": [{"step": 100 * i, "loss": loss, "accuracy": 0.5} for i, loss in enumerate(losses)]}


class RunBuilder:
    """Writes cell JSONs in the schema of tmem_bench.harness.train.run_cell, with chosen accuracies."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.ids = []

    def cell(self, task, model, seed, train_level, accuracies, variant="standard", memory_off=None, gates=None,
             probe="causal", steps_per_s=None, ceiling=1.0, task_options=None):
        """accuracies: {level tuple: accuracy}; memory_off likewise; gates: final {layer: value};
        task_options: those the variant label stands for unless given."""
        axes = AXES[task]
        cell_id = f"{task}-{variant}-{model}-{seed}-{'_'.join(map(str, train_level))}"
        cell_id = cell_id.replace("=", "").replace(".", "p")
        gated = gates is not None
        steps_per_s = steps_per_s or (2.0 if gated else 20.0)
        evals = []
        for level, acc in accuracies.items():
            level_d = dict(zip(axes, level))
            evals.append({
                "level": level_d, "level_key": ",".join(f"{k}={v}" for k, v in level_d.items()) or "-",
                "accuracy": acc, "accuracy_memory_off": (memory_off or {}).get(level) if gated else None,
                "loss": 1.0, "chance": CHANCE[task], "ceiling": ceiling, "n": 1000, "fingerprint": "f" * 64,
            })
        history = []
        for k, step in enumerate((50, 100, 150)):
            frac = (k + 1) / 3
            history.append({
                "step": step, "loss": 3.0 - frac, "train_acc": 0.2 * frac + 0.01 * seed, "steps_per_s": steps_per_s,
                "gates": {n: GATE_INIT[n] + frac * (gates[n] - GATE_INIT[n]) for n in GATE_INIT} if gated else None,
            })
        result = {
            "schema": 1, "cell_id": cell_id,
            "cell": {"task": task, "task_options": options_of(variant) if task_options is None else task_options,
                     "variant": variant, "train_level": dict(zip(axes, train_level)),
                     "eval_levels": [e["level"] for e in evals], "model": model, "label": model,
                     "model_options": {"d_model": 64, "n_layers": 2, "n_heads": 4}, "seed": seed,
                     "train": {"steps": 150, "batch_size": 64, "lr": 3e-4, "weight_decay": 0.01, "grad_clip": 1.0,
                               "log_every": 50, "eval_size": 256}},
            "tmem_bench_version": "0.1.0", "torch_version": "test", "device": "cpu",
            "n_params": 1000 + 10 * len(model), "n_backbone_params": 900, "wall_time_s": 15.0, "train_time_s": 14.0,
            "steps_per_s": steps_per_s, "causality": {"verdict": probe},
            "gate_init": dict(GATE_INIT) if gated else None, "gates_final": dict(gates) if gated else None,
            "history": history, "eval": evals,
        }
        write_json(self.run_dir / "cells" / f"{cell_id}.json", result)
        self.ids.append(cell_id)
        return cell_id

    def manifest(self, extra=(), described=True):
        """extra: planned cells that were never written, as (id, description); described=False writes
        the bare ids of manifests from before descriptions were stored."""
        planned = [(cid, f"described {cid}") for cid in self.ids] + list(extra)
        write_json(self.run_dir / "manifest.json", {
            "tmem_bench_version": "0.1.0", "torch_version": "test", "command": ["tmem-bench", "run", "all"],
            "device": "cpu", "started": "2026-01-01T00:00:00+00:00", "settings": {},
            "cells": [{"id": cid, "describe": d} for cid, d in planned] if described else [cid for cid, _ in planned],
        })


# Per-seed accuracies of the supporting coordinate-binding run: (W, model) -> three seeds.
CB_SUPPORT = {
    (5, "tensor"): [0.95, 0.93, 0.97], (20, "tensor"): [0.88, 0.86, 0.90], (50, "tensor"): [0.80, 0.78, 0.84],
    (5, "base"): [0.60, 0.58, 0.62], (20, "base"): [0.20, 0.25, 0.15], (50, "base"): [0.08, 0.10, 0.06],
    (5, "slots"): [0.65, 0.60, 0.70], (20, "slots"): [0.30, 0.28, 0.26], (50, "slots"): [0.12, 0.11, 0.13],
}


NOISES = (0.0, 0.05)


def coordinate_binding_per_level(b: RunBuilder, table: dict, variant="standard", offset=0.0, gate_final=0.7):
    """Each model trained at each W (and noise), evaluated where trained: the per-level training sweep."""
    for (w, model), accs in table.items():
        for noise in NOISES:
            for seed, acc in enumerate(accs):
                acc = acc - offset * (noise > 0)
                gated = model == "tensor"
                b.cell("coordinate_binding", model, seed, (w, noise), {(w, noise): acc}, variant=variant,
                       memory_off={(w, noise): CHANCE["coordinate_binding"]} if gated else None,
                       gates={"layer0": gate_final, "layer1": gate_final - 0.1} if gated else None)


def full_run(run_dir: Path) -> RunBuilder:
    b = RunBuilder(run_dir)
    coordinate_binding_per_level(b, CB_SUPPORT)
    # Memory-forcing variant: base at chance, tensor holds.
    forced = {k: ([CHANCE["coordinate_binding"]] * 3 if k[1] != "tensor" else v) for k, v in CB_SUPPORT.items()
              if k[0] != 20}
    coordinate_binding_per_level(b, forced, variant="block_queries=True", gate_final=0.9)
    for seed in range(3):
        # Generalisation view: trained at horizon 32, evaluated at every horizon.
        for model, accs in {"base": (0.80, 0.70, 0.60), "tensor": (0.85, 0.83, 0.82)}.items():
            gated = model == "tensor"
            b.cell("map_building", model, seed, (32,), dict(zip([(16,), (32,), (64,)], np.add(accs, 0.01 * seed))),
                   memory_off={(h,): 0.5 for h in (16, 32, 64)} if gated else None,
                   gates={"layer0": 0.6, "layer1": 0.6} if gated else None, ceiling=0.9)
        for model, accs in {"base": (0.95, 0.60), "tensor": (0.95, 0.85)}.items():
            gated = model == "tensor"
            b.cell("occlusion", model, seed, (0,), dict(zip([(0,), (6,)], np.add(accs, 0.01 * seed))),
                   memory_off={(0,): 0.9, (6,): 0.4} if gated else None,
                   gates={"layer0": 0.55, "layer1": 0.45} if gated else None)
        b.cell("no_harm", "base", seed, (), {(): 1.0})
        b.cell("no_harm", "tensor", seed, (), {(): 0.998}, memory_off={(): 0.97},
               gates={"layer0": 0.52, "layer1": 0.50})
    b.manifest()
    return b


ABLATION = "tensor_grid4"  # a label that names no registered model (a model run with its own options)


GATED = {"tensor", "tensor_local", ABLATION}


def write_cell(run_dir: Path, task, variant, label, seed, train_level, accuracies, memory_off=None):
    model = "tensor" if label == ABLATION else label
    cell_id = hashlib.sha256(json.dumps([task, variant, label, seed, train_level]).encode()).hexdigest()[:16]
    gated = label in GATED
    evals = [{"level": dict(level), "level_key": ",".join(f"{k}={v}" for k, v in level) or "-", "accuracy": acc,
              "accuracy_memory_off": (memory_off or {}).get(level, acc) if gated else None, "loss": 1.0,
              "chance": 0.25, "ceiling": 1.0, "n": 100, "fingerprint": "f" * 64}
             for level, acc in accuracies.items()]
    gates = {"layer0": 0.5, "layer1": 0.5}
    write_json(run_dir / "cells" / f"{cell_id}.json", {
        "schema": 1, "cell_id": cell_id, "status": "finished",
        "cell": {"task": task, "task_options": {}, "variant": variant, "train_level": dict(train_level),
                 "eval_levels": [e["level"] for e in evals], "model": model, "label": label,
                 "model_options": {}, "seed": seed, "train": {"steps": 100}},
        "n_params": 1000, "wall_time_s": 1.0, "steps_per_s": 10.0, "causality": {"verdict": "causal"},
        "gate_init": gates if gated else None, "gates_final": gates if gated else None,
        "history": [{"step": s, "loss": 2.0 - s / 100, "train_acc": s / 200, "steps_per_s": 10.0,
                     **({"gates": {k: 0.5 + s / 1000 for k in gates}} if gated else {})} for s in (50, 100)],
        "eval": evals,
    })
    read_cell(run_dir / "cells" / f"{cell_id}.json")  # the cell schema accepts it


GATES = {"layer0": 0.6, "layer1": 0.6}


def build(run_dir, accuracies, memory_off=None, task="occlusion", level=(6,), seeds=2, variant="standard"):
    """Every model trained and evaluated at `level`; accuracies: model -> accuracy; memory_off: model ->
    accuracy with its memory off (those models are gated)."""
    b = RunBuilder(run_dir)
    memory_off = memory_off or {}
    for seed in range(seeds):
        for model, acc in accuracies.items():
            gated = model in memory_off
            b.cell(task, model, seed, level, {level: acc}, variant=variant,
                   memory_off={level: memory_off[model]} if gated else None, gates=GATES if gated else None)
    return b


def power_of(run_dir, accuracies, memory_off=None, **kwargs) -> dict:
    build(run_dir, accuracies, memory_off, **kwargs)
    [row] = power_rows(load_run(run_dir))
    return row


def as_planned(run_dir: Path, cell_id: str, accuracy: float, lr: float | None = None, keep: bool = False):
    """Cell `cell_id` given a validation accuracy (and another lr) and the id a plan gives its settings,
    as the report's check of selection.json against the cells needs: (its Cell, its result). `keep`
    leaves the original, to make a trial at another lr of it."""
    path = run_dir / "cells" / f"{cell_id}.json"
    result = json.loads(path.read_text())
    result["cell"]["train"]["lr"] = lr or result["cell"]["train"]["lr"]
    result["validation"] = {"accuracy": accuracy, "loss": 1.0}
    cell = cell_from_dict(result["cell"])
    result["cell_id"] = cell.id
    if not keep:
        path.unlink()
    (run_dir / "cells" / f"{cell.id}.json").write_text(json.dumps(result))
    return cell, result


def write_selection(run_dir: Path, trials: list, seeds: tuple, results: dict) -> None:
    from tmem_bench.harness.selection import choose

    record = choose(LRSearch(tuple(trials), seeds), {r["cell_id"]: r for r in results})
    (run_dir / "selection.json").write_text(json.dumps({"searches": [record]}))
