"""A user's report leads with the user's models: their diagnosis first, then the paper's claims only
where the run holds what a claim needs, one line each naming the profile that checks the others."""
from __future__ import annotations

import json

from tests.report.helpers import write_cell
from tmem_bench.report import write_report
from tmem_bench.report.claims import load_claims


def _sections(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def test_a_run_without_tensor_memory_opens_with_its_own_models(tmp_path):
    run = tmp_path / "plugin-run"
    for label in ("base", "lstm"):
        for seed in (0, 1):
            write_cell(run, "coordinate_binding", "standard", label, seed, (("n_writes", 5), ("noise", 0.0)),
                       {(("n_writes", w), ("noise", 0.0)): 0.5 for w in (5, 10)})
    write_cell(run, "no_harm", "standard", "lstm", 0, (), {(): 1.0})
    text = write_report(run).path.read_text()
    sections = _sections(text)
    assert sections.index("Diagnostic power") < sections.index("The paper's claims") < sections.index("Summary")
    claims = text.split("## The paper's claims\n")[1].split("\n## ")[0]
    lines = [line for line in claims.splitlines() if line.strip()]
    specs = load_claims()
    # No verdict table: the claims that need Tensor Memory get one line each naming what is missing and
    # the profile that checks them; no-harm needs only the no_harm task, which this run has.
    not_checked = [line for line in lines if "not checked here" in line]
    assert len(not_checked) == len(specs) - 1 and all("a tensor model" in line for line in not_checked)
    assert all("profile" in line for line in not_checked)
    assert any("capacity" in line and "checked by the capacity, capacity_converge, paper, paper_protocol profiles" in line for line in not_checked)
    assert "no-harm control" in claims and "| claim | verdict | why |" in claims
    assert text.count("### coordinate binding") == 0


def test_the_state_probe_is_shown_where_the_run_has_one(tmp_path):
    run = tmp_path / "probed"
    write_cell(run, "coordinate_binding", "standard", "lstm", 0, (("n_writes", 5), ("noise", 0.0)),
               {(("n_writes", 5), ("noise", 0.0)): 0.5})
    assert "## State probe" not in write_report(run).path.read_text()
    (run / "state_probe.json").write_text(json.dumps(
        {"readout": "mlp", "rows": [{"label": "lstm", "n_writes": 5, "probe_accuracy": 0.75, "accuracy": 0.5}]}))
    text = write_report(run).path.read_text()
    sections = _sections(text)
    assert sections.index("Diagnostic power") < sections.index("State probe") < sections.index("The paper's claims")
    probe = text.split("## State probe\n")[1].split("\n## ")[0]
    assert "- readout: mlp" in probe and "| label | n_writes | probe_accuracy | accuracy |" in probe
    assert "| lstm | 5 | 0.75 | 0.5 |" in probe
