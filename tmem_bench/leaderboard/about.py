"""The paragraph each table of the board opens with: the task, what its variant changes, where the
models were trained, chance and ceiling, and what the ranking score is. Drawn from the task's own
documentation and variants, so that a plug-in task is described as it describes itself."""
from __future__ import annotations

import sys

from ..registry import get_task, variant_forces_memory

# What a memory-forcing variant does, for every task (see Task.memory_forcing).
FORCING = "the answer may not attend to the evidence, so only a state the backbone carries can pass it on"


def task_line(task: str) -> str:
    """The first paragraph of the task's module documentation, or its name."""
    try:
        doc = sys.modules[type(get_task(task)).__module__].__doc__ or ""
    except Exception:  # noqa: BLE001 - a plug-in task that is not installed here is named only
        doc = ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first if first else f"Task {task}."


def variant_line(task: str, variant: str, options: dict) -> str:
    """The variant as the task's named variant it is (the largest it has every option of), the options
    it changes beyond that, and, where it forces memory, what that means."""
    if variant == "standard":
        return "Variant standard: the task's default options."
    try:
        standard = get_task(task)
        cls, defaults = type(standard), standard.options()
        forcing = variant_forces_memory(task, variant, options)
        named = [(name, opts) for name, opts in cls.variants.items()
                 if opts and all(options.get(k) == v for k, v in opts.items())]
    except Exception:  # noqa: BLE001 - as task_line
        return f"Variant {variant}."
    name, opts = max(named, key=lambda item: len(item[1]), default=(None, {}))
    extra = [f"{k}={v} (default {defaults[k]})" for k, v in sorted(options.items())
             if k not in opts and k in defaults and defaults[k] != v]
    text = f"Variant {variant}" + (f", the task's {name} variant" if name else "")
    if extra:
        text += (" with " if name else ": ") + ", ".join(extra)
    return text + (f"; {FORCING}." if forcing else ".")


def levels_text(labels: list[str]) -> str:
    """Level labels said once per axis where they vary along one: n_writes=5, 10, 20."""
    parts = [label.split("=") for label in labels]
    if len(parts) > 1 and all(len(p) == 2 and p[0] == parts[0][0] for p in parts):
        return f"{parts[0][0]}={', '.join(p[1] for p in parts)}"
    return "; ".join(labels)


def paragraph(group: dict, options: dict) -> str:
    """The table's paragraph, from a group of board_data (levels labelled, rows ranked)."""
    labels = group["labels"]
    trained = sorted({t for row in group["rows"] for t in row["trained_at"]},
                     key=lambda lv: group["levels"].index(lv) if lv in group["levels"] else len(group["levels"]))
    named = levels_text([labels.get(lv, lv) for lv in trained])
    shown = levels_text([labels[lv] for lv in group["levels"]])
    fixed = f" ({group['fixed']} at every level)" if group["fixed"] else ""
    n = len(group["levels"])
    if n == 1 and trained == group["levels"]:
        where = f"Trained and evaluated at {'its one level' if group['levels'] == ['-'] else named}."
        score = "Ranked by the accuracy there"
    elif group["kind"] == "capacity":
        where = f"Each model was trained at each level, {shown}{fixed}, and is shown at its own."
        score = "Ranked by the trained-level score, the mean of those accuracies, which here is the all-level mean"
    elif group["rank_by"] == "mean":
        where = f"Trained at {named}, which is not among the evaluated levels, {shown}{fixed}."
        score = f"Ranked by the all-level mean of the {n} level columns"
    else:
        where = f"Trained at {named}; evaluated at {shown}{fixed}."
        score = (f"Ranked by the trained-level score, the accuracy at {named}; the all-level mean beside it "
                 f"averages the {n} level columns, untrained levels included")
    chance = f"{group['chance_note'][0].upper()}{group['chance_note'][1:]}."
    return (f"{task_line(group['task'])} {variant_line(group['task'], group['variant'], options)} {where} {chance} "
            f"{score}. Scores are raw accuracy, the mean over seeds; equal at one decimal, they share a rank.")


# The docs page's table of how well the toy diagnoses predict the external scores; relative to
# leaderboard/, where both pages of the board are written.
VALIDITY_LINK = "../docs/external-validity.md#validity-measured"


def external_paragraph(group: dict) -> str:
    """The paragraph of a profile's external table (board._external): the environments, how the models
    learnt and were scored in them, and what the return means (external_link follows it)."""
    tasks = ", ".join(dict.fromkeys(group["tasks"][col] for col in group["levels"]))
    return (f"POPGym's partially observable environments (Morad et al., ICLR 2023), here {tasks}: card games "
            "whose best action depends on cards dealt earlier. Each model learnt by imitating an oracle that "
            "acts from the observations so far, and is scored acting in the environment itself: closed loop, "
            "its greedy action at every step, on fixed episode seeds kept apart from its training and "
            "evaluation ones. A column is an environment at a difficulty, read from the models trained there; "
            "it shows POPGym's normalised return (1 is the oracle's, -1 always wrong), the mean over seeds "
            "with its 95% interval. Ranked by the mean normalised return over a model's columns, equal at two "
            "decimals sharing a rank; the mean oracle-action accuracy over the same columns is beside it."
            + (" A column marked [block_past=True] is the memory-forcing variant: each step's attention sees its "
               "own observation only, so earlier ones reach the answer through a memory alone (recurrent "
               "backbones are unchanged); the ranking's mean takes its columns and the standard ones alike."
               if "block_past=True" in group["variants"].values() else ""))


def external_link() -> dict:
    """The sentence after the external paragraph, a link on both pages (markdown, and an anchor the
    page's script draws, the paragraph being plain text there)."""
    return {"before": "How far the toy diagnoses predict these returns: ", "text": "the validity table",
            "href": VALIDITY_LINK}
