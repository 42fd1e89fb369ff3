"""A model back from any leaderboard entry: `tmem_bench.load_entry(path)`.

    import tmem_bench
    entry = tmem_bench.load_entry("leaderboard/entries/tmem-bench-suite-tensor")
    print(entry.table()[["cell_id", "task", "level", "accuracy"]])  # its cells and their stored numbers
    model = entry.model("25adba95c4e7f774")  # a TaskModel built from the cell's settings, with its weights
    print(entry.reevaluate("25adba95c4e7f774"))  # stored and recomputed accuracy and loss per level (and return)

The entry is read as it is, not validated (`tmem-bench leaderboard validate` judges it); weights an
entry references are read from the local cache (`tmem-bench leaderboard fetch`), and every weights
file is checked against the hash its entry records before it is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingExtra, UsageError
from ..harness.results import read_cell, results_table
from ..registry import TASKS, module_names
from .guard import cell_path, read_entry_json, size_problem
from .names import refusal
from .weights import Unreachable, locate


@dataclass
class LoadedEntry:
    path: Path
    entry: dict  # entry.json
    cells: dict[str, dict]  # cell id -> its stored result (cells/<id>.json), in the entry's order
    # An entry is someone else's: the `module:attribute` names it gives are imported only when asked.
    allow_module_names: bool = False

    def result(self, cell_id: str) -> dict:
        if cell_id not in self.cells:
            raise UsageError(f"{cell_id!r} is not a cell of the entry {self.path.name}; its cells: "
                             f"{', '.join(self.cells)}")
        return self.cells[cell_id]

    def table(self):
        """One row per cell and evaluation level (a pandas DataFrame), as a run's results.csv."""
        return results_table(list(self.cells.values()))

    def weights(self, cell_id: str) -> Path:
        """The cell's weights file, held by the entry or fetched, checked against its recorded hash."""
        self.result(cell_id)
        try:
            return locate(self.path, self.entry, cell_id)
        except Unreachable as e:
            raise UsageError(f"{e}; run `tmem-bench leaderboard fetch {self.path}`") from None
        except ValueError as e:
            raise UsageError(f"{self.path.name}: {e}") from None

    def task(self, cell_id: str):
        """The cell's task with its options (its eval_set(level, n) is the evaluation set)."""
        from ..registry import get_task

        cell = self.result(cell_id)["cell"]
        with module_names(self.allow_module_names):
            return get_task(cell["task"], **cell["task_options"])

    def model(self, cell_id: str):
        """The cell's model (a TaskModel: task adapter and backbone) with its trained weights, in eval mode."""
        from ..harness.plan import cell_from_dict
        from ..harness.results import load_weights
        from .reeval import build_within

        weights = self.weights(cell_id)
        try:
            with module_names(self.allow_module_names):
                model = build_within(cell_from_dict(self.result(cell_id)["cell"]), weights)
            load_weights(weights, model)
        except ValueError as e:
            raise UsageError(f"{self.path.name}: {e}") from None
        return model.eval()

    def reevaluate(self, cell_id: str | None = None):
        """Each cell (or `cell_id` alone) evaluated again from its weights: a pandas DataFrame with a
        row per cell, level (and "validation", the set its lr was chosen on) and metric, holding the
        stored and the recomputed value; what the re-evaluation rejects is in its attrs["rejections"]."""
        import pandas as pd

        from .reeval import reevaluate

        rows, rejections = [], []
        for cid in [cell_id] if cell_id is not None else list(self.cells):
            result = self.result(cid)
            with module_names(self.allow_module_names):
                recomputed = reevaluate(result, self.weights(cid),
                                        lambda where, why: rejections.append(f"{where}: {why}"))
            if recomputed is None:
                continue
            stored = {ev["level_key"]: ev for ev in result["eval"]}
            for ev in recomputed["eval"]:
                for metric in ("accuracy", "loss"):
                    rows.append({"cell_id": cid, "level": ev["level_key"], "metric": metric,
                                 "stored": stored[ev["level_key"]].get(metric), "recomputed": ev[metric]})
                if "mean_return" in ev:  # the model acting in the task's environment (harness.closed_loop)
                    rows.append({"cell_id": cid, "level": ev["level_key"], "metric": "return",
                                 "stored": stored[ev["level_key"]]["closed_loop"]["mean_return"],
                                 "recomputed": ev["mean_return"]})
            if recomputed["validation"] is not None:
                rows.append({"cell_id": cid, "level": "validation", "metric": "accuracy",
                             "stored": result["validation"]["accuracy"],
                             "recomputed": recomputed["validation"]["accuracy"]})
        table = pd.DataFrame(rows, columns=["cell_id", "level", "metric", "stored", "recomputed"])
        table.attrs["rejections"] = rejections
        return table


def load_entry(path, allow_module_names: bool = False) -> LoadedEntry:
    """An entry folder (leaderboard/entries/<slug>): its entry.json, its cells, a model with its
    weights for any cell, and its re-evaluation; UsageError names what cannot be read. Its files are
    read as validation reads them (guard.py): no link, no special file, nothing outside the entry,
    nothing past the size limit. A task or model the entry names as `module:attribute` is refused
    unless `allow_module_names` (importing it runs its code), and so is an option its factory does
    not declare."""
    path = Path(path)
    try:
        entry = read_entry_json(path)
    except ValueError as e:
        raise UsageError(f"{path} is not a readable leaderboard entry ({e})") from None
    if not isinstance(entry.get("cells"), list):
        raise UsageError(f"{path}/entry.json is not a leaderboard entry (it lists no cells)")
    cells = {}
    for cell_id in entry["cells"]:
        try:
            cells[cell_id] = read_cell(cell_path(path, cell_id))
        except (TypeError, ValueError) as e:
            raise UsageError(f"{path.name}: {e}") from None
    for cell_id, result in cells.items():
        cell = result["cell"]
        extra = TASKS.extra_of(cell["task"])
        if extra is not None:  # POPGym's tasks without the popgym extra: not a fault of the entry
            raise MissingExtra(extra, f"{path.name}: ")
        with module_names(allow_module_names):  # a factory's signature is read from its imported module
            problem = (refusal("task", cell["task"], cell["task_options"], allow_module_names)
                       or refusal("model", cell["model"], cell["model_options"], allow_module_names)
                       or size_problem(cell["model_options"]))
        if problem:
            raise UsageError(f"{path.name}: cells/{cell_id}.json: {problem}")
    return LoadedEntry(path, entry, cells, allow_module_names)


def show(path, cell_id: str | None = None, allow_module_names: bool = False) -> int:
    """`tmem-bench leaderboard show`: each cell's stored and recomputed numbers, per level; exit
    status 1 when the re-evaluation rejects one (MissingExtra, exit 3, where the entry's tasks need an
    extra not installed here)."""
    import sys

    import pandas as pd

    loaded = load_entry(path, allow_module_names)
    entry = loaded.entry
    if cell_id is not None:
        loaded.result(cell_id)
    print(f"{entry.get('name')}: model {entry.get('model', {}).get('name')!r} (label "
          f"{entry.get('model', {}).get('label')!r}), profile {entry.get('profile', {}).get('id')}, "
          f"{len(loaded.cells)} cells; re-evaluating {cell_id or 'every cell'} from its weights")
    table = loaded.reevaluate(cell_id)
    rejections = table.attrs["rejections"]
    if not table.empty:
        cells = pd.DataFrame([{"cell_id": cid, "task": r["cell"]["task"], "variant": r["cell"]["variant"],
                               "seed": r["cell"]["seed"]} for cid, r in loaded.cells.items()])
        table = cells.merge(table, on="cell_id")
        table["difference"] = table["recomputed"] - table["stored"]
        print(table.to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.6g}"))
    for line in rejections:
        print(f"rejected: {line}", file=sys.stderr)
    return 1 if rejections else 0
