"""Submit: a run's models as entries, refused where the run is incomplete, diverged, already published
or its weights are bad or missing; an entry validates and builds, unranked with one seed; slugs keep
the letters of their names."""
from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from tests.helpers import BOARD_SCHEMA, empty_board, new_board, selection
from tests.leaderboard.helpers import cells, load, tiny_run
from tests.profiles import grid_profile
from tmem_bench.cli import main
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import make_plan
from tmem_bench.harness.rundir import RunDir


def test_a_missing_weights_file_at_submit_names_a_rerun_that_trains_it(run):
    from tmem_bench.leaderboard.submit import make_entries

    [final] = selection(run)["searches"][0]["final_cells"]
    RunDir(run).weights_path(final).unlink()
    with pytest.raises(UsageError) as error:
        make_entries(run, "X")
    assert "rerun the run's command" in str(error.value) and "rerun the cell" not in str(error.value)


def test_submit_validate_build_round_trip(pristine, tmp_path, capsys):
    assert sorted(p.name for p in (pristine / "entries").iterdir()) == ["tiny-base", "tiny-lstm"]
    entry = load(pristine)
    jsonschema.validate(entry, json.loads(BOARD_SCHEMA.read_text()))
    assert entry["name"] == "Tiny (base)" and entry["seeds"] == [0, 1, 2] and entry["ranked"]
    assert entry["profile"]["id"].startswith("tiny~") and entry["causality"] == "causal"
    assert len(entry["cells"]) == len(cells(pristine)) == 2 * 3  # two tasks (one variant each), three seeds
    assert {(s["task"], s["variant"]) for s in entry["scores"]} == {("coordinate_binding", "standard"),
                                                                    ("no_harm", "standard")}
    assert entry["run"]["cpu"] and entry["run"]["platform"] and entry["devices"] == ["cpu"]

    board = tmp_path / "leaderboard"
    shutil.copytree(pristine, board)
    assert main(["leaderboard", "validate", str(board)]) == 0
    assert "2 entries valid, 0 rejected" in capsys.readouterr().out
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
    readme = (board / "README.md").read_text()
    assert "## coordinate_binding (profile tiny~" in readme and "## no_harm (profile tiny~" in readme
    # A few steps leave both at chance, so unranked with that reason: the score is shown all the same.
    section = readme.split("## coordinate_binding (profile tiny~")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if "[Tiny (" in line]
    best = max(load(board, s)["scores"][0]["score"] for s in ("tiny-base", "tiny-lstm"))
    assert rows and any(f"| {100 * best:.1f} |" in row for row in rows), rows
    page = (board / "index.html").read_text()
    assert '<script type="application/json" id="board-data">' in page
    assert "http" not in page.replace("https://example.org/tiny", "").replace("http://www.w3.org/2000/svg", "")


def test_submit_refuses_an_existing_entry_an_unknown_model_and_a_bad_url(pristine, tmp_path, capsys):
    board = tmp_path / "lb"
    shutil.copytree(pristine, board)
    source = tmp_path / "src"
    source.mkdir()
    run_dir = tiny_run(source, "no_harm", "--models", "base", "--seeds", "1")
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Tiny (base)", "--leaderboard", str(board)]) == 2
    assert "exist already" in capsys.readouterr().err
    submit = ["leaderboard", "submit", str(run_dir), "--name", "X", "--leaderboard", str(board)]
    assert main([*submit, "--model", "nope"]) == 2
    assert "not a model of this run; its models: base" in capsys.readouterr().err
    assert main([*submit, "--url", "ftp://x"]) == 2
    next(iter((run_dir / "cells").glob("*.json"))).unlink()
    assert main(["leaderboard", "submit", str(run_dir), "--name", "X", "--leaderboard", str(board)]) == 2
    assert "is incomplete" in capsys.readouterr().err
    assert not (board / "entries" / "x").exists()


def test_an_entry_with_one_seed_is_valid_but_unranked(pristine, tmp_path, capsys):
    board = tmp_path / "lb"
    shutil.copytree(pristine, board)
    source = tmp_path / "src"
    source.mkdir()
    run_dir = tiny_run(source, "no_harm", "--models", "lstm", "--seeds", "1", "--steps", "3")
    assert main(["leaderboard", "submit", str(run_dir), "--name", "One seed", "--leaderboard", str(board)]) == 0
    assert load(board, "one-seed")["ranked"] is False
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
    # Unranked with its reason where its rank would be (3 steps may also leave it at chance, said first).
    row = next(line for line in (board / "README.md").read_text().splitlines() if "| One seed |" in line)
    assert row.startswith(("| unranked (1 seed) |", "| unranked (at chance) |")), row


def test_a_diverged_cell_is_refused_at_submit_and_rejected_at_validate(tmp_path):
    from tmem_bench.cli import main
    from tmem_bench.leaderboard import validate

    (tmp_path / "p.toml").write_text(grid_profile("1e-2"))
    copy = tmp_path / "run"
    assert main(["run", "coordinate_binding", "--profile", str(tmp_path / "p.toml"), "--out", str(copy),
                 "--no-report"]) == 0
    cells = make_plan("coordinate_binding", str(tmp_path / "p.toml"))
    board = empty_board(tmp_path)
    assert main(["leaderboard", "submit", str(copy), "--name", "Base", "--model", "base",
                 "--leaderboard", str(board)]) == 0
    assert validate(board).rejections == []
    for folder in (copy / "cells", board / "entries" / "base" / "cells"):
        path = folder / f"{cells[0].id}.json"
        result = json.loads(path.read_text())
        result.update(status="diverged", diverged_at_step=3)
        path.write_text(json.dumps(result))
    assert any("status: 'diverged'" in line for line in validate(board).rejections)
    shutil.rmtree(board / "entries" / "base")
    assert main(["leaderboard", "submit", str(copy), "--name", "Base", "--model", "base",
                 "--leaderboard", str(board)]) == 2
    assert not (board / "entries" / "base").exists()


@pytest.mark.parametrize("name, slug", [("日本語", "日本語"), ("Ünïcödé ☃", "unicode"), ("KV memory (v2)", "kv-memory-v2")])
def test_entry_names_keep_their_letters_in_the_slug(submittable, tmp_path, name, slug, capsys):
    from tmem_bench.cli import main

    board = new_board(tmp_path / "board")
    assert main(["leaderboard", "submit", str(submittable / "run"), "--name", name, "--leaderboard", str(board)]) == 0
    assert [p.name for p in (board / "entries").iterdir()] == [slug]
    assert json.loads((board / "entries" / slug / "entry.json").read_text())["name"] == name
