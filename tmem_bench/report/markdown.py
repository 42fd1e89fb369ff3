"""report.md, assembled section by section from what the other modules computed."""
from __future__ import annotations

import json

import pandas as pd

from .capacity import capacity_groups, capacity_section
from .claims import TIMING_RULES, Claim, ClaimSpec, PowerSpec, load_claims
from .data import RunData, model_order, slug, task_label, task_order, variant_order
from .external import external_section
from .power import model_rows, power_lines, power_rule
from .selection_table import selection_lines
from .stats import BOOTSTRAP_FROM, N_BOOT, interval_label
from .tables import final_gate_table, fmt_ci, fmt_pct, fmt_points, md_table, reliance_frame, summary_markdown
from .views import sweep_axis, train_level_rank


def _figure(figures: dict, stem: str) -> str:
    return f"![{figures[stem]['title']}](figures/{stem}.png)\n\n[SVG](figures/{stem}.svg)"


def _header(data: RunData) -> list[str]:
    m = data.manifest or {}
    facts = [
        ("command", " ".join(m["command"]) if isinstance(m.get("command"), list) else "-"),
        ("started", m.get("started", "-")), ("device", m.get("device", "-")),
        ("tmem-bench / torch", f"{m.get('tmem_bench_version', '-')} / {m.get('torch_version', '-')}"),
        ("cells", f"{data.n_cells} readable" + (f" of {len(m['cells'])} planned" if m.get("cells") else "")),
    ]
    if not data.table.empty:
        cells = data.table.drop_duplicates("cell_id")
        facts.append(("tasks", ", ".join(task_label(t, v) for t in task_order(data)
                                         for v in variant_order(cells[cells["task"] == t]))))
        facts.append(("models", ", ".join(model_order(cells))))
        facts.append(("seeds", ", ".join(map(str, sorted(cells["seed"].unique())))))
        facts.append(("training steps", ", ".join(map(str, sorted(cells["steps"].unique())))))
        machines = cells["hardware"].fillna("not recorded").value_counts()
        facts.append(("hardware", "; ".join(f"{h} ({n} cell{'' if n == 1 else 's'})"
                                            for h, n in sorted(machines.items(), key=lambda hn: (-hn[1], hn[0])))))
    out = [f"# tmem-bench report: {data.run_dir.name}", ""] + [f"- {k}: {v}" for k, v in facts]
    if data.problems:
        out += ["", "## Problems", "", "Left out of every table and figure below:", ""]
        out += [f"- {p}" for p in data.problems]
    diverged = data.table.drop_duplicates("cell_id").dropna(subset=["diverged_at_step"]) if not data.table.empty \
        else data.table
    if not diverged.empty:
        out += ["", "## Diverged training", "",
                "These cells stopped at a non-finite training loss; they were evaluated with the last finite "
                "weights, so their accuracies say how far training got, not what the model can learn:", ""]
        out += [f"- {r['task']} {r['label']} seed {r['seed']} at {r['train_level']}: "
                f"step {int(r['diverged_at_step'])} of {r['steps']}" for _, r in diverged.iterrows()]
    return out + _retired_stops(data)


def _retired_stops(data: RunData) -> list[str]:
    """The cells early stopping stopped under a rule since retired, where the current one would not
    have stopped yet: their points are read as still learning, and the reader should know why; the
    learning-rate trials among them chose their model's lr on a shortened run."""
    table = data.table
    early = table[table["stopped_too_early"].fillna(False).astype(bool)].drop_duplicates("cell_id") \
        if not table.empty else table
    trials = pd.DataFrame(data.trials_stopped_too_early)
    if early.empty and trials.empty:
        return []
    out = ["", "## Stopped by a retired rule", "",
           "Early stopping stopped these cells under a rule the suite has since retired: replayed on their "
           "stored validation checks, the current patience rule (thresholds.toml's [early_stop]) had not "
           "stopped them yet, so they would have trained on."]
    for frame, what in ((early, "cell{s} read in this report, whose points read as still learning"),
                        (trials, "learning-rate trial{s} at an lr not chosen, read by the selection only")):
        if frame.empty:
            continue
        frame = frame.sort_values(["task", "variant", "label", "train_level", "seed", "lr"])
        out += ["", f"{len(frame)} " + what.format(s="" if len(frame) == 1 else "s") + ":", ""] + [
            f"- {task_label(r['task'], r['variant'])} {r['label']} seed {r['seed']} lr {r['lr']:g} at "
            f"{r['train_level']}: stopped at step {r['steps_run']} of {r['steps']}" for _, r in frame.iterrows()]
    return out

def _models(data: RunData, spec: PowerSpec) -> list[str]:
    """One line per model of the run, first thing after the run's facts: at the level it was trained
    at, per task and variant, its accuracy with its interval and the power rule's reading of it."""
    rows = model_rows(data, spec)
    if not rows:
        return []
    out = ["", "## The run's models", "",
           "Each model at the level it was trained at: accuracy over seeds [95% interval], and what it learned "
           "by the thresholds of the diagnostic power below.", ""]
    for label in dict.fromkeys(r["label"] for r in rows):
        parts = [f"{task_label(r['task'], r['variant'])}{'' if r['level'] == '-' else ' at ' + r['level']}: "
                 f"{fmt_ci(r['accuracy'], r['low'], r['high'])}, {r['case']}" for r in rows if r["label"] == label]
        out.append(f"- **{label}**: " + "; ".join(parts))
    return out


def _how_to_read(data: RunData) -> list[str]:
    max_seeds = int(data.table.groupby(["task", "variant", "label", "train_level", "level"])["seed"].nunique().max())
    out = ["", "## How to read this report", "",
           f"Accuracy is measured on each level's fixed evaluation set. Means are over seeds; intervals are 95% "
           f"intervals of the mean over seeds: Student's t intervals (n-1 degrees of freedom; Welch's for a "
           f"difference) below {BOOTSTRAP_FROM} seeds, where a bootstrap cannot see the spread, and percentile-bootstrap "
           f"intervals ({N_BOOT:,} resamples, seeded, so the report is reproducible) from {BOOTSTRAP_FROM} up"
           + (f"; this run's are {interval_label([max_seeds])} intervals" if max_seeds > 1 else "")
           + ". Chance (best constant predictor) and ceiling (best accuracy the information in the evaluation set "
           "allows) are drawn as dashed and dotted lines.",
           ""]
    if max_seeds == 1:
        out.append("**This run has one seed per cell, so every interval collapses to its mean: the bands and "
                   "intervals show no seed-to-seed uncertainty, and claim verdicts rest on the margin alone.**")
    else:
        out.append(f"Cell groups have up to {max_seeds} seeds; a group with one seed has a zero-width interval.")
    if data.leaking:
        out += ["", "**Causality probe: " + "; ".join(
            f"'{m}' leaks the future (detected in {', '.join(w)}); every row of it is marked 'leaking', and its "
            f"accuracies on tasks that score every position are not to be trusted" for m, w in data.leaking.items())
            + ".**"]
    return out


def _missing(spec: ClaimSpec, data: RunData) -> list[str]:
    """What a claim needs that the run lacks: its task, its memory model, a baseline to compare with,
    its timing reference, (capacity) models trained at more than one number of writes, (saturation)
    the memory model read at more than one level of the sweep, or (a stated figure) one of its models
    read at the level it names."""
    models, tasks = set(data.table["model"]), set(data.table["task"])
    # A timing claim's task is only the one it lists first: it reads every task the run has.
    out = [f"the {spec.task} task"] if spec.task and spec.task not in tasks and spec.rule not in TIMING_RULES else []
    if spec.rule not in ("no_harm", "figure") and spec.memory not in models:  # a figure names its own models
        out.append(f"a {spec.memory} model")
    if spec.rule in ("memory_vs_baselines", "smaller_drop") and not models & set(spec.baselines):
        out.append(f"one of {', '.join(spec.baselines)}")
    if spec.reference and spec.reference not in models:
        out.append(spec.reference)
    if spec.rule == "figure" and not out:
        t = data.table[(data.table["task"] == spec.task) & data.table["label"].isin(spec.models)]
        for axis, value in spec.at.items():
            t = t[t[axis] == value] if axis in t else t.iloc[:0]
        if t.empty:
            out.append(f"one of {', '.join(spec.models)} read at {', '.join(f'{k}={v}' for k, v in spec.at.items())}")
    if spec.rule == "capacity" and not out and not any(g.task == spec.task for g in capacity_groups(data)):
        out.append("models trained at more than one number of writes")
    if spec.rule == "saturation" and not out:  # a drop needs the fewest and the most of the sweep
        axis = sweep_axis(data, spec.task)
        mem = data.table[(data.table["task"] == spec.task) & (data.table["label"] == spec.memory)]
        if axis is None or mem[axis].nunique() < 2:
            out.append(f"a {spec.memory} model read at more than one {axis or 'level'}")
    return out


def _claims(data: RunData, claims: list[Claim]) -> list[str]:
    """The paper's claims this run holds what they need for; one line for each of the others."""
    specs = {s.id: s for s in load_claims()}
    # A claim the run lacks what it needs for does not apply: left out (docs/results.md has every verdict).
    claims = [c for c in claims if not _missing(specs[c.id], data)]
    if not claims:
        return []
    out = ["", "## The paper's claims", ""]
    out += ["Each toy claim of the paper (Tensor Memory, arXiv 2605.27686; docs/models.md) this run can check, "
            "its numbers beside the paper's, and a verdict computed by the rule given with it. Where the "
            "memory-forcing variant was run, its verdict is given beside the paper's setting.", ""]
    out.append(md_table(["claim", "verdict", "why"], [[c.name, f"**{c.verdict}**", c.reason] for c in claims]))
    for c in claims:
        out += ["", f"### {c.name}: {c.verdict}", "", f"- Paper: {c.statement} ({c.paper})",
                f"- Rule: {c.rule}", f"- This run: {c.reason or '-'}"]
        out += [f"- {n}" for n in c.notes]
        if c.evidence:
            header = list(dict.fromkeys(k for e in c.evidence for k in e))
            out += ["", md_table(header, [[e.get(k, "-") for k in header] for e in c.evidence])]
    return out


def _power(data: RunData, power: list[dict], spec: PowerSpec) -> list[str]:
    out = ["", "## Diagnostic power", "", power_rule(spec), ""]
    if not power:
        return out + ["No cell was evaluated at the level it was trained at."]
    out += [f"- {task}: {line}" for task, line in power_lines(power).items()]
    # The best of the models other than the attention reference: "best model" would name a 34% model
    # beside a reference at 96%.
    header = ["task", "variant", "level", "seeds", f"{spec.attention_reference} (attention)",
              f"best model besides {spec.attention_reference}",
              "its accuracy", "its lead over the next (points)", "its memory off", "its reach (init, trained)",
              "still learning", "chance", "ceiling", "verdict", "why"]
    body = [[r["task"], r["variant"], r["level"], r["seeds"], fmt_pct(r["reference"]), r["best_model"] or "-",
             fmt_pct(r["best"]), _lead(r["lead"]), fmt_pct(r["memory_off"]),
             _reach(r["best_reach_init"], r["best_reach_trained"]), r.get("best_still_learning") or "no",
             fmt_pct(r["chance"]), fmt_pct(r["ceiling"]), f"**{r['verdict']}**", r["reason"]] for r in power]
    return out + ["", "Reach: the gradient of the answer tokens' outputs with respect to the evidence tokens, "
                  "relative to that with respect to the answer tokens (0: no path from the evidence to the answer). "
                  "Lead: that model's mean minus the next one's, with the 95% interval of the "
                  "difference. "
                  "Still learning: seeds whose train loss was still falling at the end (the convergence rule of "
                  "claims.toml).", "", md_table(header, body)] + _per_model(data, spec)


def _per_model(data: RunData, spec: PowerSpec) -> list[str]:
    rows = model_rows(data, spec)
    if not rows:
        return []
    header = ["task", "variant", "level", "model", "lr", "seeds", "accuracy [95% CI]", "memory off",
              "reach (init, trained)", "converged", "chance", "ceiling", "case"]
    body = [[r["task"], r["variant"], r["level"], r["label"],
             "-" if r["lr"] is None else f"{r['lr']:g}" + r["lr_note"], r["seeds"],
             fmt_ci(r["accuracy"], r["low"], r["high"]), fmt_pct(r["memory_off"]),
             _reach(r["reach_init"], r["reach_trained"]),
             f"{r['converged']} of {r['convergence_known']}" if r["convergence_known"] else "-",
             fmt_pct(r["chance"]), fmt_pct(r["ceiling"]), r["case"]] for r in rows]
    return ["", "### Every model at the level it was trained at", "",
            "Each model's own reading by the same thresholds: nothing learned (within "
            f"{100 * spec.learned_margin:g} points of chance, with the case its information reach is in), too weak "
            "(less than halfway from chance to ceiling) or learned. lr: the one it was trained at ('edge': chosen "
            "at the end of the learning-rate grid; 'every lr ties': every trial scored the same). Converged: "
            "seeds that met the convergence rule, of those whose history was long enough to tell.", "",
            md_table(header, body)]


def _state_probe(data: RunData) -> list[str]:
    """The state probe's results as stored in the run (state_probe.json), where it was run."""
    probe = data.state_probe
    if probe is None:
        return []
    out = ["", "## State probe", "",
           "A readout family trained on each memory's frozen final state to answer the queries from the state "
           "alone, beside the model's own accuracy, and the family's calibration: its best member's accuracy on the "
           "reference state of known content closest to the memory's format against that state's best possible "
           "read (and the chosen member's). The probe number is the member best on the probe's own validation "
           "sequences among those that read the reference within the calibration goal, and a verdict reads it only "
           "there (usable); the best read of the other members is beside it, marked uncalibrated, and no verdict "
           "reads it (state_probe.json):",
           ""]
    records = [{**r, **({"calibration": _calibration(r["calibration"])} if "calibration" in r else {}),
               **({"uncalibrated": _uncalibrated(r["uncalibrated"], r["calibration"])} if "uncalibrated" in r else {}),
                **({"readouts": ", ".join(f"{k} {v['evaluation']:.3f}" for k, v in r["readouts"].items())}
                   if isinstance(r.get("readouts"), dict) else {})} for r in probe["rows"]]
    facts = {k: v for k, v in probe.items() if not isinstance(v, (list, dict))}
    out += [f"- {k}: {_value(v)}" for k, v in facts.items()]
    if records:
        # The fields in a probed row's order; rows without a state have fewer.
        header = list(dict.fromkeys(k for r in sorted(records, key=len, reverse=True) for k in r))
        if "uncalibrated" in header and "probe_accuracy" in header:  # the number and what it is not, side by side
            header.remove("uncalibrated")
            header.insert(header.index("probe_accuracy") + 1, "uncalibrated")
        out += [""] * bool(facts) + [md_table(header, [[_value(r.get(k)) for k in header] for r in records])]
    return out


def _calibration(c: dict) -> str:
    if not c.get("reference"):
        return f"none: {c.get('why', '?')}"
    member = f"{c['member']} " if c.get("member") else ""
    chosen = f"; the chosen member {c['chosen_probe']:.3f}" if c.get("chosen_probe") is not None else ""
    chosen += f"; within the goal: {', '.join(c['calibrated']) or 'none'}" if "calibrated" in c else ""
    return (f"{c['reference']}: {member}{c['probe']:.3f} of {c['best']:.3f} ({c['ratio']:.0%}){chosen}: "
            f"{'usable' if c['usable'] else 'the probe cannot tell'}")


def _uncalibrated(u: dict, c: dict) -> str:
    ratio = "" if u.get("ratio") is None else f": reads {c['reference']} at {u['ratio']:.0%}"
    return f"{u['readout']} {u['probe_accuracy']:.3f} (uncalibrated{ratio}; no verdict reads it)"


def _value(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _lead(lead: dict | None) -> str:
    if lead is None:
        return "-"
    return f"{fmt_points(lead['diff'], lead['low'], lead['high'])} over {lead['over']}"


def _reach(init, trained) -> str:
    if init is None or trained is None:
        return "-"
    return f"{init:.2g}, {trained:.2g}"


def _summary(summary: pd.DataFrame) -> list[str]:
    return ["", "## Summary", "",
            "Per task, variant, model, training level and evaluation level. Where a model was trained at several "
            "levels only the trained-at rows are listed (results.csv holds the full grid). 'memory off': accuracy "
            "with the gated memory path switched off. Wall time is per cell (build, probe, training, evaluation); "
            "steps/s is the training loop's.", "",
            summary_markdown(summary)]


def _accuracy(data: RunData, figures: dict) -> list[str]:
    out = ["", "## Accuracy against the sweep axis", ""]
    for task in task_order(data):
        out += [f"### {task}", ""]
        if sweep_axis(data, task) is None:
            out += ["No sweep axis: see the summary table.", ""]
            continue
        if any(g.task == task for g in capacity_groups(data)):
            out += [f"Each model trained at each {sweep_axis(data, task)} and evaluated there: the Capacity "
                    f"section's figure; the generalisation views follow.", ""]
        elif f"accuracy_{slug(task)}_trained" not in figures:
            rank = train_level_rank(data, task)
            trained = sorted(set(data.table[data.table["task"] == task]["train_level"]), key=rank.get)
            out += [f"Each model (and variant) was trained at a single level ({'; '.join(trained)}), so the "
                    f"per-level training view would be one point per line; the generalisation view follows.", ""]
        for stem in figures:
            if stem.startswith(f"accuracy_{slug(task)}_"):
                out += [_figure(figures, stem), ""]
    return out


def _reliance(summary: pd.DataFrame, figures: dict) -> list[str]:
    reliance = reliance_frame(summary)
    out = ["## Memory reliance", "",
           "Accuracy minus accuracy with the memory path switched off (gate forced to zero), for gated models. A "
           "memory that matters costs accuracy when removed; on the no-harm task the drop is what removing an "
           "unneeded path costs by itself.", ""]
    if reliance.empty:
        return []  # no gated model: nothing to switch off
    out.append(md_table(
        ["task", "variant", "model", "trained at", "level", "seeds", "accuracy", "memory off", "drop (points)"],
        [[r["task"], r["variant"], r["label"], r["trained at"], r["level"], r["seeds"],
          fmt_ci(r["accuracy"], r["low"], r["high"]), fmt_pct(r["memory off"]),
          fmt_points(r["drop"], r["drop low"], r["drop high"])] for _, r in reliance.iterrows()]))
    return out + ["", _figure(figures, "memory_reliance")]


def _gates(data: RunData, figures: dict) -> list[str]:
    out = ["", "## Gate values", ""]
    header, body = final_gate_table(data)
    if not body:
        return []
    out += ["Final sigmoid(gamma) per layer, mean over seeds (and training levels, with the range when there "
            "are several cells), for every task side by side: a gate that also stays at its initial value "
            "where the task needs memory says little about no harm.", "", md_table(header, body), ""]
    for task in task_order(data):
        if f"gates_{slug(task)}" in figures:
            out += [_figure(figures, f"gates_{slug(task)}"), ""]
    return out


def _no_harm(data: RunData, no_harm: list[dict], spec: ClaimSpec) -> list[str]:
    if not no_harm:
        return []  # no gated model on the no-harm task in this run: the verdict does not apply
    out = ["", "### No-harm verdict", "",
           f"Per gated model and variant, by the rule of the no-harm claim: {spec.explained()}", ""]
    out.append(md_table(["variant", "model", "seeds", "verdict", "numbers"],
                        [[v["variant"], v["label"], v["seeds"], f"**{v['verdict']}**", v["reason"]]
                         for v in no_harm]))
    return out


def _training(data: RunData, figures: dict) -> list[str]:
    out = ["", "## Training curves", ""]
    for task in task_order(data):
        if f"training_{slug(task)}" in figures:
            out += [_figure(figures, f"training_{slug(task)}"), ""]
    return out


def render_markdown(data: RunData, figures: dict, summary: pd.DataFrame, claims: list[Claim],
                    no_harm: list[dict], no_harm_spec: ClaimSpec, power: list[dict], power_spec: PowerSpec) -> str:
    out = _header(data)
    if data.table.empty:
        out += ["", "No readable cell results: nothing to report yet."]
        return "\n".join(out) + "\n"
    # The run's own models first (their diagnosis), then the paper's claims where the run can check them.
    out += _models(data, power_spec) + _how_to_read(data) + _power(data, power, power_spec) + _state_probe(data) + _claims(data, claims)
    out += selection_lines(data)
    out += _summary(summary)
    out += _accuracy(data, figures) + capacity_section(data, figures) + external_section(data)
    out += _reliance(summary, figures) + _gates(data, figures) + _no_harm(data, no_harm, no_harm_spec)
    out += _training(data, figures)
    return "\n".join(out).rstrip() + "\n"
