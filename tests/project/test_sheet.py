"""The README's verdict sheet is the committed reports' verdicts, rebuilt by benchmarks/verdict_sheet.py:
no verdict on it is composed by hand."""
import re
import shutil

from benchmarks.verdict_sheet import COLUMNS, TRAINED_AT_EACH_W, sheet
from tests.helpers import ROOT

SECTION = "## What the committed runs say about the paper's claims"


def readme_sheet(text: str) -> str:
    """The first table of the README's verdict section."""
    section = text[text.index(SECTION):]
    return "\n".join(re.search(r"((?:^\|.*\|\n?)+)", section, re.M)[1].strip().splitlines())


def test_the_readme_sheet_is_rebuilt_from_the_committed_reports():
    assert readme_sheet((ROOT / "README.md").read_text()) == sheet(ROOT)


def test_a_report_whose_verdict_changes_changes_the_sheet(tmp_path):
    runs = {run for _, run, _ in COLUMNS} | {run for run, _ in TRAINED_AT_EACH_W.values()}
    for run in runs:
        (tmp_path / "docs" / "runs" / run).mkdir(parents=True)
        shutil.copy(ROOT / "docs" / "runs" / run / "report.md", tmp_path / "docs" / "runs" / run / "report.md")
    report = tmp_path / "docs" / "runs" / "paper_protocol" / "report.md"
    text = report.read_text()
    assert "### no-harm control: supported" in text
    report.write_text(text.replace("### no-harm control: supported", "### no-harm control: not supported"))
    rebuilt = sheet(tmp_path)
    assert rebuilt != sheet(ROOT)
    assert "| no-harm control | not supported ([paper_protocol](docs/runs/paper_protocol/report.md)) |" in rebuilt
