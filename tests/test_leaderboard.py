"""Leaderboard: submit, validate and build from a real (tiny) run; every way of tampering is caught."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from tmem_bench.cli import main
from tmem_bench.harness.results import read_cell, write_json
from tmem_bench.leaderboard import validate
from tmem_bench.leaderboard.entry import builtin_profile_text, derived, profile_id
from tmem_bench.leaderboard.page import render_page

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "leaderboard" / "entry.schema.json"

TINY = """
description = "two training steps, small evaluation sets: tests only"

[train]
steps = 2
batch_size = 8
lr = 1e-3
weight_decay = 0.0
grad_clip = 1.0
log_every = 1
eval_size = 32
seeds = [0, 1, 2]

[tasks.coordinate_binding]
models = ["base", "lstm"]
model = { d_model = 16, n_layers = 1, n_heads = 2, dropout = 0.0 }
levels = { n_writes = [2, 4], noise = [0.05] }
train_at = { n_writes = 2 }

[tasks.no_harm]
models = ["base", "lstm"]
model = { d_model = 16, n_layers = 1, n_heads = 2, dropout = 0.0 }
levels = {}
"""


def tiny_run(folder: Path, task: str = "all", *extra: str) -> Path:
    profile = folder / "tiny.toml"
    profile.write_text(TINY)
    run_dir = folder / "run"
    assert main(["run", task, "--profile", str(profile), "--out", str(run_dir), "--no-report", *extra]) == 0
    return run_dir


def empty_board(folder: Path) -> Path:
    board = folder / "leaderboard"
    board.mkdir(parents=True)
    shutil.copy(SCHEMA, board / SCHEMA.name)
    return board


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A leaderboard with two entries (base and lstm on two tasks, three seeds each) submitted from a real run."""
    folder = tmp_path_factory.mktemp("lb")
    run_dir = tiny_run(folder)
    board = empty_board(folder)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Tiny", "--leaderboard", str(board),
                 "--url", "https://example.org/tiny", "--description", "a test"]) == 0
    return board


@pytest.fixture
def board(pristine, tmp_path) -> Path:
    copy = tmp_path / "leaderboard"
    shutil.copytree(pristine, copy)
    return copy


def entry_path(board: Path, slug: str = "tiny-base") -> Path:
    return board / "entries" / slug


def load(board: Path, slug: str = "tiny-base") -> dict:
    return json.loads((entry_path(board, slug) / "entry.json").read_text())


def cells(board: Path, slug: str = "tiny-base") -> list[Path]:
    return sorted((entry_path(board, slug) / "cells").glob("*.json"))


def test_submit_validate_build_round_trip(pristine, tmp_path, capsys):
    assert sorted(p.name for p in (pristine / "entries").iterdir()) == ["tiny-base", "tiny-lstm"]
    entry = load(pristine)
    jsonschema.validate(entry, json.loads(SCHEMA.read_text()))
    assert entry["name"] == "Tiny (base)" and entry["seeds"] == [0, 1, 2] and entry["ranked"]
    assert entry["profile"]["id"].startswith("tiny~") and entry["causality"] == "causal"
    assert len(entry["cells"]) == len(cells(pristine)) == 2 * 3  # two tasks (one variant each), three seeds
    assert {(s["task"], s["variant"]) for s in entry["scores"]} == {("coordinate_binding", "standard"),
                                                                    ("no_harm", "standard")}
    assert entry["run"]["cpu"] and entry["run"]["platform"] and entry["devices"] == ["cpu"]

    board = tmp_path / "leaderboard"
    shutil.copytree(pristine, board)
    assert main(["leaderboard", "validate", str(board)]) == 0
    assert "2 entries valid, 0 rejection(s)" in capsys.readouterr().out
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
    readme = (board / "README.md").read_text()
    assert "## coordinate_binding (profile tiny~" in readme and "## no_harm (profile tiny~" in readme
    row = next(line for line in readme.splitlines() if line.startswith("| 1 | [Tiny"))
    best = max(load(board, s)["scores"][0]["score"] for s in ("tiny-base", "tiny-lstm"))
    assert f"| {100 * best:.1f} |" in row
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
    assert "| unranked (1 seed) | One seed |" in (board / "README.md").read_text()


def tamper_accuracy(board):
    entry = load(board)
    entry["results"][0]["mean"] += 0.1
    write_json(entry_path(board) / "entry.json", entry)


def tamper_remove_cell(board):
    cells(board)[0].unlink()


def tamper_fingerprint(board):
    path = cells(board)[0]
    result = read_cell(path)
    result["eval"][0]["fingerprint"] = "0" * 64
    write_json(path, result)


def tamper_drop_seed(board):
    # A careful forger: seed 2's cells removed and every aggregate recomputed to match.
    entry = load(board)
    kept = []
    for path in cells(board):
        result = read_cell(path)
        if result["cell"]["seed"] == 2:
            path.unlink()
        else:
            kept.append(result)
    entry.update(derived(kept), cells=sorted(r["cell_id"] for r in kept))
    write_json(entry_path(board) / "entry.json", entry)


def tamper_leaking(board):
    for path in cells(board):
        result = read_cell(path)
        result["causality"]["verdict"] = "leaking"
        write_json(path, result)


def tamper_rename_cell(board):
    path = cells(board)[0]
    path.rename(path.with_name("0123456789abcdef.json"))


def tamper_cell_settings(board):
    path = cells(board)[0]
    result = read_cell(path)
    result["cell"]["train"]["steps"] = 2000
    write_json(path, result)


def tamper_duplicate(board):
    shutil.copytree(entry_path(board), entry_path(board, "tiny-base-again"))


def tamper_accuracy_range(board):
    path = cells(board)[0]
    result = read_cell(path)
    result["eval"][0]["accuracy"] = 1.5
    write_json(path, result)


def tamper_suite_version(board):
    entry = load(board)
    entry["suite"]["tmem_bench_version"] = "9.0.0"
    write_json(entry_path(board) / "entry.json", entry)


def tamper_task_version(board):
    entry = load(board)
    entry["settings"][0]["task_version"] = 7
    write_json(entry_path(board) / "entry.json", entry)


def tamper_ranked(board):
    entry = load(board)
    entry["profile"]["id"] = "quick"
    write_json(entry_path(board) / "entry.json", entry)


def tamper_schema(board):
    entry = load(board)
    del entry["seeds"]
    write_json(entry_path(board) / "entry.json", entry)


TAMPERING = {
    "an accuracy edited": (tamper_accuracy, "results[0].mean: claims"),
    "a cell removed": (tamper_remove_cell, "is listed but its cell file is missing"),
    "a fingerprint changed": (tamper_fingerprint, "fingerprint: 000000000000... is not the installed suite's"),
    "a seed dropped": (tamper_drop_seed, "cells: missing coordinate_binding base @ n_writes=2,noise=0.05 seed 2"),
    "a leaking model": (tamper_leaking, "causality: the probe found the model 'leaking'"),
    "a renamed cell file": (tamper_rename_cell, "tiny-base: cells/0123456789abcdef.json: "),
    "cell settings edited": (tamper_cell_settings, "the file name is not the hash of the cell's settings"),
    "a duplicate": (tamper_duplicate, "tiny-base-again: cells: duplicate of tiny-base"),
    "an accuracy out of range": (tamper_accuracy_range, "accuracy", "1.5"),
    "an unknown suite version": (tamper_suite_version, "suite.tmem_bench_version: 9.0.0 is not a version"),
    "an unknown task version": (tamper_task_version, "task_version: 7 is not the installed task's version 1"),
    "a profile passed off as quick": (tamper_ranked, "profile.id: claims 'quick'"),
    "a field missing": (tamper_schema, "entry.json: schema: 'seeds' is a required property"),
}


@pytest.mark.parametrize("case", TAMPERING)
def test_validation_rejects_tampering(board, case, capsys):
    tamper, *expected = TAMPERING[case]
    tamper(board)
    result = validate(board)
    assert any(all(e in line for e in expected) for line in result.rejections), result.rejections
    rejected = {line.split(": ")[0] for line in result.rejections}
    assert rejected == {"tiny-base-again" if case == "a duplicate" else "tiny-base"}
    assert all("\n" not in line for line in result.rejections)
    assert "tiny-lstm" in [p.name for p, _ in result.accepted] and not rejected & {p.name for p, _ in result.accepted}
    assert main(["leaderboard", "validate", str(board)]) == 1
    assert expected[0] in capsys.readouterr().err
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 1
    assert not (board / "index.html").exists()


def test_a_leaking_plugin_is_refused_and_a_forged_verdict_is_caught(tmp_path, capsys):
    run_dir = tiny_run(tmp_path, "no_harm", "--models", "tests.diagnostics.test_conformance:leaky")
    board = empty_board(tmp_path)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Leaky", "--leaderboard", str(board)]) == 2
    assert "only causal models can be submitted" in capsys.readouterr().err
    for path in (run_dir / "cells").glob("*.json"):  # the forger edits the run's verdicts before submitting
        result = read_cell(path)
        for probe in (result["causality"], *result["causality_trained"].values()):
            probe["verdict"] = "causal"
        write_json(path, result)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Leaky", "--leaderboard", str(board)]) == 0
    assert "module:attribute" in validate(board).rejections[0]  # a plug-in's entry validates where it is trusted
    result = validate(board, allow_module_names=True)
    assert result.rejections[0] == ("leaky: model (no_harm standard): the causality probe, run again here, finds "
                                    "the model 'leaking'; only causal models are admitted")
    # and on every cell's trained weights, in both modes
    assert sum("on the trained weights" in line for line in result.rejections) == 2 * len(load(board, "leaky")["cells"])


def chromium():
    from shutil import which

    browser = which("chromium") or which("chromium-browser")
    driver = which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None
    return (browser, driver) if browser and driver else None


def test_board_page_in_a_real_browser(pristine, tmp_path):
    found = chromium()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but Chromium, chromedriver or selenium is missing (apt-get install -y chromium "
                        "chromium-driver; pip install selenium)")
        pytest.skip("needs Chromium: apt-get install -y chromium chromium-driver, and pip install selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    board = tmp_path / "lb"
    shutil.copytree(pristine, board)
    source = tmp_path / "src"
    source.mkdir()
    # A second profile (one seed, unranked) so that the profile filter has something to hide.
    run_dir = tiny_run(source, "no_harm", "--models", "lstm", "--seeds", "1", "--steps", "1")
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Other profile", "--leaderboard", str(board)]) == 0
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.binary_location = found[0]
    driver = webdriver.Chrome(service=Service(found[1]), options=options)
    try:
        driver.get((board / "index.html").as_uri())
        sections = driver.find_elements(By.CSS_SELECTOR, "section.group")
        assert len(sections) == 3  # tiny profile: two tasks; the other profile: no_harm
        shown = {(s.get_attribute("data-task"), tuple(r.get_attribute("data-slug") for r in
                  s.find_elements(By.CSS_SELECTOR, "tbody tr"))) for s in sections}
        assert ("coordinate_binding", ("tiny-base", "tiny-lstm")) in {(t, tuple(sorted(r))) for t, r in shown}
        assert ("no_harm", ("other-profile",)) in shown
        assert all(s.find_element(By.TAG_NAME, "svg").find_elements(By.TAG_NAME, "path") for s in sections)

        binding = next(s for s in sections if s.get_attribute("data-task") == "coordinate_binding")
        table = binding.find_element(By.TAG_NAME, "table")

        def slugs():
            return [r.get_attribute("data-slug") for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]

        def names():
            return [td.text for td in table.find_elements(By.CSS_SELECTOR, "tbody tr td:nth-child(2)")]

        ranked = slugs()  # best score first
        table.find_element(By.CSS_SELECTOR, "th[data-key=score]").click()
        assert slugs() == list(reversed(ranked)) and len(ranked) == 2
        header = table.find_element(By.CSS_SELECTOR, "th[data-key=name]")
        header.click()
        assert names() == sorted(names(), key=str.lower)
        header.click()
        assert names() == sorted(names(), key=str.lower, reverse=True)

        # Keyboard: the score header is reached with Tab from the top of the page and sorts with Enter and Space.
        driver.refresh()
        sections = driver.find_elements(By.CSS_SELECTOR, "section.group")
        binding = next(s for s in sections if s.get_attribute("data-task") == "coordinate_binding")
        table = binding.find_element(By.TAG_NAME, "table")
        score = table.find_element(By.CSS_SELECTOR, "th[data-key=score]")
        assert slugs() == ranked and score.get_attribute("aria-sort") == "none"
        assert table.find_element(By.CSS_SELECTOR, "th[data-key=rank]").get_attribute("aria-sort") == "ascending"
        target = score.find_element(By.TAG_NAME, "button")
        for _ in range(60):
            ActionChains(driver).send_keys(Keys.TAB).perform()
            if driver.switch_to.active_element == target:
                break
        assert driver.switch_to.active_element == target, "the score header cannot be reached with Tab"
        ActionChains(driver).send_keys(Keys.ENTER).perform()
        assert slugs() == list(reversed(ranked)) and score.get_attribute("aria-sort") == "ascending"
        ActionChains(driver).send_keys(Keys.SPACE).perform()
        assert slugs() == ranked and score.get_attribute("aria-sort") == "descending"
        assert table.find_element(By.CSS_SELECTOR, "th[data-key=rank]").get_attribute("aria-sort") == "none"
        assert "unranked (1 seed)" in driver.find_element(By.TAG_NAME, "body").text

        Select(driver.find_element(By.ID, "filter-task")).select_by_value("no_harm")
        visible = [s for s in sections if s.is_displayed()]
        assert {s.get_attribute("data-task") for s in visible} == {"no_harm"} and len(visible) == 2
        profile = binding.get_attribute("data-profile")
        Select(driver.find_element(By.ID, "filter-profile")).select_by_value(profile)
        visible = [s for s in sections if s.is_displayed()]
        shown = [(s.get_attribute("data-profile"), s.get_attribute("data-task")) for s in visible]
        assert shown == [(profile, "no_harm")]

        # The page fits the screen: the document never scrolls sideways (a phone's 400 px, with the
        # viewport meta read as a phone reads it, and two desktop widths); a table wider than the
        # screen scrolls inside its own box.
        widths = {}
        for width, mobile in ((400, True), (1024, False), (1400, False)):
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile})
            driver.refresh()
            document, boxes, figures = driver.execute_script(
                "const d = document.documentElement;"
                "return [d.scrollWidth, Array.from(document.querySelectorAll('.scroll'), b => [b.clientWidth, "
                "b.scrollWidth]), Array.from(document.querySelectorAll('svg.figure'), f => "
                "f.getBoundingClientRect().right)];")
            widths[width] = document
            assert document <= width, f"at {width} px the document is {document} px wide"
            assert all(inner <= width for inner, _ in boxes) and all(right <= width for right in figures)
            if width == 400:
                assert any(outer > inner for inner, outer in boxes)  # the wide table scrolls in its box
        print("document widths:", widths)
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

        # A level an entry lacks is a gap in its line, not a straight line across it.
        page = (board / "index.html").read_text()
        data = json.loads(page.split('id="board-data">')[1].split("</script>")[0])
        group = next(g for g in data if g["task"] == "coordinate_binding")
        first, last = group["levels"]
        group["levels"] = [first, "gap", last]
        group["labels"]["gap"], group["chance"]["gap"], group["ceiling"]["gap"] = "gap", 0.5, 1.0
        holes, whole = group["rows"]
        whole["cells"]["gap"] = whole["cells"][first]
        gap = tmp_path / "gap.html"
        gap.write_text(render_page(json.dumps(data)))
        driver.get(gap.as_uri())
        path = {slug: driver.find_element(By.CSS_SELECTOR, f"section[data-task=coordinate_binding] "
                                                           f"g[data-slug='{slug}'] path").get_attribute("d")
                for slug in (holes["slug"], whole["slug"])}
        assert path[holes["slug"]].count("M") == 2 and "L" not in path[holes["slug"]], path
        assert path[whole["slug"]].count("M") == 1 and path[whole["slug"]].count("L") == 2, path
    finally:
        driver.quit()


def _rebuilds_to_the_committed_files(tmp_path) -> None:
    committed = ROOT / "leaderboard"
    if not list((committed / "entries").glob("*/entry.json")):
        pytest.skip("no entries committed yet")
    copy = tmp_path / "leaderboard"
    shutil.copytree(committed, copy)
    # build validates every entry first and writes nothing when one is rejected: one pass, not two;
    # --full: this machine's validation records may hold the committed entries, which are re-evaluated whole
    assert main(["leaderboard", "build", "--leaderboard", str(copy), "--full"]) == 0
    for name in ("README.md", "index.html"):
        stale = f"leaderboard/{name} is stale: run tmem-bench leaderboard build"
        assert (copy / name).read_text() == (committed / name).read_text(), stale


@pytest.mark.slow
def test_the_committed_board_validates_and_rebuilds_to_the_same_files(tmp_path):
    _rebuilds_to_the_committed_files(tmp_path)


def test_the_committed_board_rebuilds_to_the_same_files_from_its_cells(tmp_path, monkeypatch):
    """Every check of validate but the re-evaluation from weights and the probe on trained weights
    (minutes for the whole board: the slow test above; test_reeval covers both on small runs)."""
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    monkeypatch.setattr(checks, "reevaluate", lambda result, weights, reject: None)
    monkeypatch.setattr(checks, "_probe_again", lambda results, reject: None)
    _rebuilds_to_the_committed_files(tmp_path)


def test_a_committed_cell_still_evaluates_to_its_accuracy():
    """The board's cheapest cell, re-evaluated from its weights by the installed suite: a change to a
    model or task that moves published numbers fails here, not first in the slow test."""
    cells = sorted((ROOT / "leaderboard" / "entries").glob("*/cells/*.json"))
    if not cells:
        pytest.skip("no entries committed yet")
    results = [read_cell(path) for path in cells]
    result = min(results, key=lambda r: (r["wall_time_s"], r["cell_id"]))
    weights = next(p for p in cells if p.stem == result["cell_id"]).with_suffix(".safetensors")
    found = []
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    checks.reevaluate(result, weights, lambda where, reason: found.append(f"{where}: {reason}"))
    assert found == []
    result["eval"][0]["accuracy"] += 0.01
    checks.reevaluate(result, weights, lambda where, reason: found.append(f"{where}: {reason}"))
    assert found, "an accuracy 1 point off the weights' must be rejected"


def test_a_profile_id_counts_only_what_plans_the_runs_task():
    quick = builtin_profile_text("quick")
    other_section = quick.replace("[tasks.no_harm]\n", "[tasks.no_harm]\n# edited\n").replace(
        'levels = {}\ntrain = { steps = 100', 'levels = {}\ntrain = { steps = 101')
    assert other_section != quick
    assert profile_id("quick", other_section, {}, "coordinate_binding") == "quick"
    assert profile_id("quick", other_section, {}, "no_harm").startswith("quick~")
    assert profile_id("quick", other_section, {}, "all").startswith("quick~")
    described = quick.replace('description = "', 'description = "Edited: ')
    assert described != quick and profile_id("quick", described, {}, "all") == "quick"
    own_section = quick.replace("train = { steps = 500, lr = 1e-3 }", "train = { steps = 501, lr = 1e-3 }")
    assert own_section != quick and profile_id("quick", own_section, {}, "coordinate_binding").startswith("quick~")


@pytest.mark.parametrize("label", ["tensor", "slots"])
def test_settings_do_not_depend_on_the_order_of_the_cells(label):
    """A profile that trains at several levels (capacity: steps and length grow with W) gives one
    entry's settings from its smallest level, in whatever order submit and validate read the cells."""
    from tmem_bench.leaderboard.entry import settings

    cells = Path(__file__).resolve().parents[1] / "docs" / "runs" / "capacity" / "cells"
    results = [r for r in (json.loads(p.read_text()) for p in sorted(cells.glob("*.json")))
               if r["cell"]["label"] == label]
    assert len({r["cell"]["train_level"]["n_writes"] for r in results}) == 4
    (first,) = settings(results)
    assert settings(results[::-1]) == [first] == settings(sorted(results, key=lambda r: r["cell"]["seed"]))
    smallest = [r for r in results if r["cell"]["train_level"]["n_writes"] == 5]
    assert first["train"]["steps"] == smallest[0]["cell"]["train"]["steps"] == 500
    assert first["state_size"]["seq_len"] == smallest[0]["causality"]["seq_len"]


def test_the_board_orders_levels_by_value():
    """The committed capacity entries: W=5, 10, 20, 40 in that order, not as strings sort."""
    from tmem_bench.leaderboard.board import board_data

    entries = Path(__file__).resolve().parents[1] / "leaderboard" / "entries"
    accepted = [(d, json.loads((d / "entry.json").read_text())) for d in sorted(entries.glob("tmem-bench-capacity-*"))]
    assert accepted
    (group,) = [g for g in board_data(accepted) if g["kind"] == "capacity"]
    assert [group["values"][lv]["n_writes"] for lv in group["levels"]] == [5, 10, 20, 40]
