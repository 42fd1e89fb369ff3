"""The report's learning-rate selection table: per search, the validation accuracy at every lr of the
grid and the lr chosen, so a reader can see whether the grid bracketed each optimum. It draws the
records report/selection_recomputed.py makes from the cells by harness/selection.py's rule."""
from __future__ import annotations

from .data import MODEL_ORDER, RunData, ordered
from .tables import fmt_pct, md_table


def lr_note(search: dict) -> str:
    """' (edge)' where the chosen lr ends the grid; ' (every lr ties)' where every trial has the same
    validation accuracy, so the choice fell to the validation loss and an edge says nothing."""
    accuracies = {t["accuracy"] for t in search.get("trials") or [] if t.get("status") != "diverged"}
    if len(search.get("trials") or []) > 1 and len(accuracies) == 1:
        return " (every lr ties)"
    return " (edge)" if search.get("at_edge") else ""


def selection_lines(data: RunData) -> list[str]:
    if not data.selection:
        return []
    out = ["", "## Learning-rate selection", "",
           "Each model was trained with its first seed at every learning rate of the grid and scored on the "
           "validation set of its training level (generated from its own seeds, never the evaluation sets); the "
           "best validation accuracy chose the lr (a diverged trial ranks last; ties go to the lower validation "
           "loss, then the smaller lr), and the remaining seeds were trained at it. Only the chosen cells appear in "
           "the rest of this report. **bold**: chosen; 'edge': the chosen lr is the smallest or largest of the grid, "
           "so the optimum may lie outside it; 'every lr ties': every trial scored the same (the validation loss "
           "chose), so the grid says nothing of an optimum.", ""]
    groups: dict[tuple, list[dict]] = {}
    for search in data.selection:
        groups.setdefault((search["task"], search["variant"], search["train_level"]), []).append(search)
    for (task, variant, level), searches in groups.items():
        grid = sorted({lr for s in searches for lr in s["grid"]})
        by_label = {s["label"]: s for s in searches}
        body = []
        for label in ordered(by_label, MODEL_ORDER):
            s = by_label[label]
            accuracy = {t["lr"]: t for t in s["trials"]}
            cells = []
            for lr in grid:
                t = accuracy.get(lr)
                diverged = t is not None and t["status"] == "diverged"
                text = "-" if t is None else fmt_pct(t["accuracy"]) + (" (diverged)" if diverged else "")
                cells.append(f"**{text}**" if lr == s["chosen_lr"] else text)
            chosen = "none yet" if s["chosen_lr"] is None else f"{s['chosen_lr']:g}" + lr_note(s)
            body.append([label, *cells, chosen])
        variant_text = "" if variant == "standard" else f" [{variant}]"
        out += [f"### {task}{variant_text} @ {level}", "",
                md_table(["model", *(f"lr {lr:g}" for lr in grid), "chosen"], body), ""]
    return out
