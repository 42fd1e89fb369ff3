"""A user's report leads with the user's models: one line per model (its accuracy at the level it was
trained at and what it learned), their diagnosis, then the paper's claims only where the run holds
what a claim needs; sections that do not apply to the run are left out."""
from __future__ import annotations

import json

from tests.report.helpers import write_cell
from tmem_bench.report import write_report


def _sections(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def _plugin_run(tmp_path):
    """base and a plug-in memory, kv_memory, on coordinate binding; kv_memory alone on no_harm (ungated)."""
    run = tmp_path / "plugin-run"
    for label, accuracy in (("base", 0.5), ("kv_memory", 0.9)):
        for seed in (0, 1):
            write_cell(run, "coordinate_binding", "standard", label, seed, (("n_writes", 5), ("noise", 0.0)),
                       {(("n_writes", w), ("noise", 0.0)): accuracy for w in (5, 10)})
    write_cell(run, "no_harm", "standard", "kv_memory", 0, (), {(): 1.0})
    return run


def test_a_plugin_run_opens_with_one_line_per_model_at_its_trained_level(tmp_path):
    text = write_report(_plugin_run(tmp_path)).path.read_text()
    sections = _sections(text)
    assert sections[0] == "The run's models" and sections.index("The run's models") < sections.index("Diagnostic power")
    opening = text.split("## The run's models\n")[1].split("\n## ")[0]
    lines = [line for line in opening.splitlines() if line.startswith("- ")]
    assert lines == [
        "- **base**: coordinate_binding at n_writes=5,noise=0.0: 50.0%, too weak",  # two equal seeds: no interval
        "- **kv_memory**: coordinate_binding at n_writes=5,noise=0.0: 90.0%, learned; no_harm: 100.0%, learned",
    ]


def test_sections_that_do_not_apply_to_the_run_are_left_out(tmp_path):
    text = write_report(_plugin_run(tmp_path)).path.read_text()
    sections = _sections(text)
    # Without Tensor Memory only the no-harm claim applies (it needs the no_harm task alone): no line
    # for each claim the run cannot check, no reliance or gate section, no no-harm verdict per gated model.
    claims = text.split("## The paper's claims\n")[1].split("\n## ")[0]
    table = [line for line in claims.splitlines() if line.startswith("| ")]
    assert "not checked here" not in text and table[1] == (
        "| no-harm control | **inconclusive** | no gated model in this run, so the gate part cannot be checked |")
    assert table[2].startswith("| label |")  # the verdict table's one row, then the claim's own evidence
    assert "No gated model" not in text and "no no_harm results" not in text and "No-harm verdict" not in text
    assert "Memory reliance" not in sections and "Gate values" not in sections
    assert sections.index("Diagnostic power") < sections.index("Summary")


def test_a_claim_the_run_can_check_keeps_its_section(tmp_path):
    run = tmp_path / "gated"
    for seed in (0, 1):
        write_cell(run, "no_harm", "standard", "tensor", seed, (), {(): 1.0})
    text = write_report(run).path.read_text()
    claims = text.split("## The paper's claims\n")[1].split("\n## ")[0]
    assert "no-harm control" in claims and "| claim | verdict | why |" in claims and "not checked here" not in claims


def test_the_state_probe_is_shown_where_the_run_has_one(tmp_path):
    run = tmp_path / "probed"
    write_cell(run, "coordinate_binding", "standard", "lstm", 0, (("n_writes", 5), ("noise", 0.0)),
               {(("n_writes", 5), ("noise", 0.0)): 0.5})
    assert "## State probe" not in write_report(run).path.read_text()
    (run / "state_probe.json").write_text(json.dumps(
        {"readout": "mlp", "rows": [{"label": "lstm", "n_writes": 5, "probe_accuracy": 0.75, "accuracy": 0.5}]}))
    text = write_report(run).path.read_text()
    sections = _sections(text)
    assert sections.index("Diagnostic power") < sections.index("State probe") < sections.index("Summary")
    probe = text.split("## State probe\n")[1].split("\n## ")[0]
    assert "- readout: mlp" in probe and "| label | n_writes | probe_accuracy | accuracy |" in probe
    assert "| lstm | 5 | 0.75 | 0.5 |" in probe


def test_the_probe_table_shows_the_best_uncalibrated_read_beside_the_number_marked(tmp_path):
    from tmem_bench.harness.probe_run import settle

    run = tmp_path / "probed"
    write_cell(run, "coordinate_binding", "standard", "lstm", 0, (("n_writes", 5), ("noise", 0.0)),
               {(("n_writes", 5), ("noise", 0.0)): 0.5})
    row = {"label": "lstm", "seed": 0, "n_writes": 5, "accuracy": 0.5, "status": "probed", "cell_id": "c",
           "readouts": {"attention": {"validation": 0.8, "evaluation": 0.79, "best_step": 100},
                        "rows_linear": {"validation": 0.6, "evaluation": 0.61, "best_step": 100}}}
    row = settle(row, {"format": "dense", "reference": "dense", "best": 1.0,
                       "readouts": {"attention": 0.2, "rows_linear": 0.95}})
    (run / "state_probe.json").write_text(json.dumps({"schema": 2, "rows": [row]}))
    probe = write_report(run).path.read_text().split("## State probe\n")[1].split("\n## ")[0]
    header = next(line for line in probe.splitlines() if line.startswith("| label"))
    assert "| probe_accuracy | uncalibrated |" in header  # side by side
    assert "| 0.61 | attention 0.790 (uncalibrated: reads dense at 20%; no verdict reads it) |" in probe
    assert "within the goal: rows_linear" in probe


def test_saturation_is_left_out_of_a_run_that_reads_one_number_of_writes(tmp_path):
    """A drop needs the fewest and the most writes: a run that trains and reads base and tensor at W=50
    alone cannot check saturation, so its report leaves the claim out rather than calling it inconclusive;
    the same cells read at two numbers of writes keep it."""
    def claims(run, ws):
        for label in ("base", "tensor"):
            for seed in (0, 1):
                write_cell(run, "coordinate_binding", "standard", label, seed, (("n_writes", 50), ("noise", 0.05)),
                           {(("n_writes", w), ("noise", 0.05)): 0.9 for w in ws})
        return write_report(run).path.read_text().split("## The paper's claims\n")[1].split("\n## ")[0]

    assert "### caveat: a fixed-size state saturates" not in claims(tmp_path / "one", (50,))
    assert "### caveat: a fixed-size state saturates" in claims(tmp_path / "two", (20, 50))
