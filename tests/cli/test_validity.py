"""`tmem-bench validity TOY_RUN... EXTERNAL_RUN`: the table, its files and its one-line refusals."""
import pandas as pd
import pytest

from tests.helpers import ROOT, cli, one_line_error

STUDY = ROOT / "docs/runs/study_converge"


def test_one_run_is_refused_in_one_line(capsys):
    one_line_error(*cli(["validity", STUDY], capsys)[::2], "at least one toy run and the external run")


def test_a_toy_run_given_as_the_external_one_is_refused_in_one_line(capsys, tmp_path):
    one_line_error(*cli(["validity", STUDY, STUDY, "--out", tmp_path], capsys)[::2], "no closed-loop returns")


def test_validity_of_a_tiny_external_run_writes_its_table_figure_and_markdown(tmp_path, capsys, monkeypatch):
    pytest.importorskip("popgym")
    from tmem_bench.harness.plan import Overrides, plan_run
    from tmem_bench.harness.runner import run_plan

    plan = plan_run("popgym_repeat_first", "external",
                    Overrides(models=["lstm", "base", "linear"], steps=2, seeds=[0, 1]))
    run_plan([c for c in plan.cells if c.train["lr"] == 1e-3], tmp_path / "ext", device="cpu")
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["validity", STUDY, ROOT / "docs/runs/capacity_converge", tmp_path / "ext",
                          "--resamples", "100"], capsys)
    assert code == 0, err
    # By default a new folder under runs/, never the external run's own (a committed table there stays).
    assert not (tmp_path / "ext" / "validity").exists()
    table = pd.read_csv(tmp_path / "runs/validity-ext/validity.csv")
    # 3 study scores and 4 capacity scores, against accuracy, return and the mean return over all levels
    # and over those kept (2 steps leave every model below +1 and one above chance: RepeatFirst is kept)
    assert len(table) == 7 * 4 and set(table["n_models"]) == {3}
    assert set(table["models"]) == {"base linear lstm"}
    assert table["tau"].between(-1, 1).all()
    for name in ("validity.md", "validity.png", "validity.svg"):
        assert (tmp_path / "runs/validity-ext" / name).is_file()
    assert "written:" in out and "strongest relation" in out


@pytest.mark.parametrize("where, said", [
    ("file", "--out {out} is a file; give a folder, new or existing"),
    ("file/under", "--out {out}: {tmp}/file is a file; give a folder, new or existing"),
    ("/proc/tmem-bench/validity", "--out {out}: cannot create /proc/tmem-bench (No such file or directory)"),
])
def test_an_out_that_cannot_be_written_is_one_line_before_anything_is_computed(capsys, tmp_path, where, said):
    """Issue 57: FileExistsError and FileNotFoundError tracebacks, after the resampling."""
    (tmp_path / "file").write_text("kept")
    out = tmp_path / where
    one_line_error(*cli(["validity", STUDY, STUDY, "--out", out], capsys)[::2],
                   said.format(out=out, tmp=tmp_path))
    assert (tmp_path / "file").read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_new_out_folder_made_to_check_it_is_removed_when_the_runs_are_refused(capsys, tmp_path):
    one_line_error(*cli(["validity", STUDY, STUDY, "--out", tmp_path / "new" / "deeper"], capsys)[::2],
                   "no closed-loop returns")
    assert list(tmp_path.iterdir()) == []


def test_the_committed_runs_summary_says_every_pair_is_exploratory_and_why(capsys, tmp_path):
    code, out, err = cli(["validity", STUDY, ROOT / "docs/runs/capacity_converge", ROOT / "docs/runs/external",
                          "--out", tmp_path, "--resamples", "200"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("no confirmatory pair: the hypothesis in ") and "Every pair is exploratory." in lines[0]
    assert "is not among these runs' scores" in lines[0] and "does not record when its first cell started" in lines[0]
    assert lines[1].startswith("strongest relation (exploratory): ")
    assert "exploratory pairs reach p <= 0.05 after Holm's correction" in lines[2] and "7 models" in lines[2]
    assert "blank heatmap columns: repeat_first @ difficulty=1 accuracy" in lines[3]
    assert any(line.startswith("left out: capacity_converge: 10 cell(s) of tensor_grid4") for line in lines)
    assert set(pd.read_csv(tmp_path / "validity.csv")["role"]) == {"exploratory"}


def test_a_hypothesis_file_that_is_missing_or_malformed_is_one_line(capsys, tmp_path):
    one_line_error(*cli(["validity", STUDY, STUDY, "--hypothesis", tmp_path / "none.toml"], capsys)[::2],
                   "--hypothesis", "is not a file")
    (tmp_path / "h.toml").write_text("stated = [")
    one_line_error(*cli(["validity", STUDY, ROOT / "docs/runs/external", "--out", tmp_path / "o",
                         "--hypothesis", tmp_path / "h.toml"], capsys)[::2], "is not TOML")


def test_a_nan_return_in_a_run_is_one_line_naming_the_cell(capsys, tmp_path):
    import json
    import shutil

    external = tmp_path / "ext"
    shutil.copytree(ROOT / "docs/runs/external", external, ignore=shutil.ignore_patterns("*.safetensors", "validity"))
    cell = sorted((external / "cells").glob("*.json"))[0]
    doc = json.loads(cell.read_text())
    doc["eval"][0]["closed_loop"]["mean_return"] = float("nan")
    cell.write_text(json.dumps(doc))
    one_line_error(*cli(["validity", STUDY, external, "--out", tmp_path / "o"], capsys)[::2],
                   f"cell {cell.stem}", "has normalised_return nan, which is not finite")
