"""What the harness's test modules share: small plans and the profiles they are planned from (each
derived from tests.profiles.TINY_PROFILE), and finished cells written without training."""
from __future__ import annotations

from dataclasses import asdict, replace

from tests.profiles import NO_DROPOUT, tiny_profile
from tmem_bench.harness.plan import Overrides, make_plan
from tmem_bench.files import write_atomic, write_json
from tmem_bench.harness.rundir import RunDir, sha256

TINY = Overrides(models=["base"], levels={"n_writes": [3, 5]}, steps=4, batch_size=8)


def tiny_cells(**kw):
    overrides = Overrides(**{**TINY.__dict__, **kw})
    cells = [c for c in make_plan("coordinate_binding", "quick", overrides) if c.variant == "standard"]
    return [c.__class__(**{**c.__dict__, "train": {**c.train, "eval_size": 64, "log_every": 2}}) for c in cells]


def write_profile(tmp_path, text: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return str(path)


def selection_profile(lr: str, extra: str = "") -> str:
    """base and linear on coordinate_binding at n_writes 3 and 5, six steps, seeds 0 and 1, at `lr`
    (one or a grid), `extra` appended to the task's section."""
    return tiny_profile(train={"steps": 6, "lr": lr, "weight_decay": "0.01", "log_every": 2, "seeds": [0, 1]},
                        tasks={"coordinate_binding": {"models": '["base", "linear"]', "model": NO_DROPOUT,
                                                      "levels": "{ n_writes = [3, 5], noise = [0.05] }",
                                                      "train_at": None}},
                        append=extra)


def second_seed_text(second_seed: bool = True) -> str:
    """A grid of three lrs for base on coordinate_binding at n_writes=3, seeds 0 to 2; a second seed
    for close choices (`selection_second_seed`) unless told not to."""
    return tiny_profile(train={"steps": 4, "lr": "[1e-3, 3e-3, 1e-2]", "weight_decay": "0.01", "log_every": 2,
                               "seeds": [0, 1, 2], **({"selection_second_seed": "true"} if second_seed else {})},
                        tasks={"coordinate_binding": {"model": NO_DROPOUT, "train_at": None,
                                                      "levels": "{ n_writes = [3], noise = [0.05] }"}})


def second_seed_profile(tmp_path, second_seed: bool = True, name: str = "p.toml") -> str:
    path = tmp_path / name
    path.write_text(second_seed_text(second_seed))
    return str(path)


def result(cell, accuracy, loss=1.0, status="finished"):
    return {"cell_id": cell.id, "status": status, "validation": {"accuracy": accuracy, "loss": loss}}


def early_stop_text(steps: int, early_stop: bool) -> str:
    """base on no_harm (dropout 0.1), up to `steps` steps, trained to convergence if `early_stop`."""
    return tiny_profile(train={"steps": steps, "batch_size": 16, "lr": "3e-3", "weight_decay": "0.01", "log_every": 10,
                               "eval_size": 64, "early_stop": early_stop},
                        tasks={"coordinate_binding": None,
                               "no_harm": {"model": "{ d_model = 16, n_layers = 1, n_heads = 2, dropout = 0.1 }",
                                           "levels": "{}"}})


EVERY = 10  # thresholds.toml's `every` is sized for real runs; these cells check more often


def tiny_cell(tmp_path, steps=300, early_stop=True):
    path = tmp_path / f"tiny-{steps}-{early_stop}.toml"
    path.write_text(early_stop_text(steps, early_stop))
    (cell,) = make_plan("no_harm", str(path))
    if early_stop:
        cell = replace(cell, train={**cell.train, "early_stop": {**cell.train["early_stop"], "every": EVERY}})
    return cell


def finish(run_dir, cell, weights=True):
    """A finished cell's result file (valid against the cell schema) for `cell`, with a stand-in weights
    file whose hash it keeps, or (not `weights`) without one, as a run committed without them."""
    level = cell.train_level
    run_dir = RunDir(run_dir)
    result = {"cell_id": cell.id, "cell": asdict(cell), "status": "finished",
              "eval": [{"level": level, "level_key": "-", "accuracy": 0.5, "chance": 0.1, "ceiling": 1.0, "n": 10,
                        "fingerprint": "0" * 64}]}
    if weights:
        write_atomic(run_dir.weights_path(cell.id), cell.id.encode())
        result["weights_sha256"] = sha256(run_dir.weights_path(cell.id))
    write_json(run_dir.cell_path(cell.id), result)


def killed_on(n: int, train_cell, calls: list):
    """A stand-in for runner.train_cell that records each cell's id in `calls` and dies (as a killed
    process does, KeyboardInterrupt) midway through the n-th cell; the others train as `train_cell` does."""
    def train(cell, *args, **kwargs):
        calls.append(cell.id)
        if len(calls) == n:
            raise KeyboardInterrupt
        return train_cell(cell, *args, **kwargs)
    return train
