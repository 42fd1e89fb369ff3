"""A hostile leaderboard entry: validation imports and calls no code the entry names, reads nothing
outside the board, refuses a huge weights file before reading it, and one bad entry is that entry's
one rejection line while the rest of the board validates.

Each attack is crafted as an attacker would: the edit, then cell ids, the profile id and every
aggregate recomputed with the suite's own functions, so that nothing but the check under test
stands between the entry and the code it names (trusting module names shows the code is reached).
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import empty_board
from tests.profiles import TESTS_ONLY
from tmem_bench.cli import main
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import cell_from_dict
from tmem_bench.files import write_json
from tmem_bench.harness.results import read_cell
from tmem_bench.leaderboard import validate
from tmem_bench.leaderboard.entry import derived, profile_id
from tmem_bench.registry import task_names

NO_HARM_MODELS = '["base", "lstm"]'
MODELS = f"models = {NO_HARM_MODELS}"  # the profile's line that the crafted entries edit


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_profile) -> Path:
    """A board with two honest entries, t-base and t-lstm, from one tiny run (base and lstm on no_harm)."""
    folder = tmp_path_factory.mktemp("security")
    (folder / "tiny.toml").write_text(tiny_profile(description=TESTS_ONLY, tasks={
        "coordinate_binding": None, "no_harm": {"models": NO_HARM_MODELS, "levels": "{}"}}))
    run = folder / "run"
    assert main(["run", "no_harm", "--profile", str(folder / "tiny.toml"), "--out", str(run), "--no-report"]) == 0
    board = empty_board(folder)
    assert main(["leaderboard", "submit", str(run), "--name", "T", "--leaderboard", str(board)]) == 0
    return board


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """(a module on sys.path whose import writes a marker file, that marker)."""
    name = "evil_" + re.sub(r"\W", "_", tmp_path.name)
    marker = tmp_path / "imported"
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / f"{name}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
                                       "Task = base = None\n")
    monkeypatch.syspath_prepend(str(folder))
    yield name, marker
    sys.modules.pop(name, None)


def craft(board: Path, cell=None, entry=None, toml=None, slug: str = "t-base") -> None:
    """Edit an entry's cells (`cell(cell_dict)`), profile text (`toml(text) -> text`) and entry
    (`entry(dict)`), then make it consistent: cell ids, the profile id and every aggregate."""
    folder = board / "entries" / slug
    originals, ids, renamed = [], [], {}
    for path in sorted((folder / "cells").glob("*.json")):
        result = read_cell(path)
        originals.append(copy.deepcopy(result))
        if cell:
            cell(result["cell"])
        renamed[originals[-1]["cell"]["task"]] = result["cell"]["task"]
        result["cell_id"] = cell_from_dict(result["cell"]).id
        ids.append(result["cell_id"])
        path.unlink()
        write_json(folder / "cells" / f"{result['cell_id']}.json", result)
        path.with_suffix(".safetensors").rename(folder / "cells" / f"{result['cell_id']}.safetensors")
    data = json.loads((folder / "entry.json").read_text())
    # From the cells as trained, then renamed: derived() on an edited cell would build what it names here.
    facts = derived(originals)
    for row in (*facts["settings"], *facts["results"], *facts["scores"]):
        row["task"] = renamed.get(row["task"], row["task"])
    data.update(facts, cells=sorted(ids))
    if toml:
        data["profile"]["toml"] = toml(data["profile"]["toml"])
    if entry:
        entry(data)
    data["profile"]["id"] = profile_id(data["profile"]["name"], data["profile"]["toml"], data["run"]["overrides"],
                                       data["run"]["task"])
    write_json(folder / "entry.json", data)


def _model_everywhere(e):
    return {"cell": lambda c: c.update(model=f"{e}:base"), "entry": lambda d: d["model"].update(name=f"{e}:base"),
            "toml": lambda t: t.replace(MODELS, f'models = [{{ name = "{e}:base", label = "base" }}, "lstm"]')}


# name site -> (the edits for an evil module `e`, where the rejection is, whether trusting module names reaches it)
SITES = {
    "model.name": (lambda e: {"entry": lambda d: d["model"].update(name=f"{e}:base")}, "model.name", False),
    "run.task": (lambda e: {"entry": lambda d: d["run"].update(task=f"{e}:Task")}, "run.task", True),
    "run.overrides.models": (lambda e: {"entry": lambda d: d["run"]["overrides"].update(models=["base", f"{e}:base"])},
                             "run.overrides.models[1]", True),
    "profile task section": (lambda e: {"toml": lambda t: t + f'\n[tasks."{e}:Task"]\nmodels = ["base"]\n'},
                             "profile: tasks.", False),
    "profile model table": (lambda e: {"toml": lambda t: t.replace(
        MODELS, f'models = ["base", "lstm", {{ name = "{e}:base", label = "x", cmd = "true" }}]')},
        "profile: tasks.no_harm.models[2]", True),
    "profile variant model": (lambda e: {"toml": lambda t: t + f'variants = [{{ models = ["base", "{e}:base"] }}]\n'},
                              "profile: tasks.no_harm.variants[0].models[1]", True),
    "cell task": (lambda e: {"cell": lambda c: c.update(task=f"{e}:Task")}, "cells/", True),
    "cell model": (lambda e: {"cell": lambda c: c.update(model=f"{e}:base")}, "cells/", True),
    "model everywhere": (_model_everywhere, "model.name", True),
    "settings task": (lambda e: {"entry": lambda d: d["settings"][0].update(task=f"{e}:Task")}, "settings[0].task",
                      True),
}


@pytest.mark.parametrize("site", SITES)
def test_a_module_name_is_refused_before_it_is_imported(board, evil, site):
    edits, where, reached = SITES[site]
    module, marker = evil
    craft(board, **edits(module))
    result = validate(board)
    assert not marker.exists(), f"validation imported {module}"
    lines = [line for line in result.rejections if line.startswith("t-base: ")]
    assert lines and all("\n" not in line for line in lines), result.rejections
    assert any(line.startswith(f"t-base: {where}") and f"{module}:" in line and "--allow-module-names" in line
               for line in lines), lines
    assert [p.name for p, _ in result.accepted] == ["t-lstm"]
    # The same entry, module names trusted: the crafted entry does reach the module it names.
    validate(board, allow_module_names=True)
    assert marker.exists() == reached


def test_an_unknown_task_in_the_settings_rejects_that_entry_alone(board, capsys):
    craft(board, entry=lambda d: d["settings"][0].update(task="nope"))
    result = validate(board)
    # The known tasks are the built-ins, and POPGym's where its extra is installed.
    assert result.rejections == [f"t-base: settings[0].task: unknown task 'nope'; known: {', '.join(task_names())}"]
    assert task_names()[:4] == ["coordinate_binding", "map_building", "no_harm", "occlusion"]
    assert [p.name for p, _ in result.accepted] == ["t-lstm"]
    assert main(["leaderboard", "validate", str(board)]) == 1
    assert "1 entry valid, 1 rejected" in capsys.readouterr().out


def test_any_failure_while_validating_an_entry_is_its_rejection(board, monkeypatch):
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    real = checks.planned_cells

    def planned_cells(run, profile, results=None):
        if any(r["cell"]["label"] == "base" for r in (results or {}).values()):
            raise MemoryError("out of memory")
        return real(run, profile, results)

    monkeypatch.setattr(checks, "planned_cells", planned_cells)
    result = validate(board)
    assert result.rejections == ["t-base: cannot be validated: MemoryError: out of memory"]
    assert [p.name for p, _ in result.accepted] == ["t-lstm"]


@pytest.fixture
def spy(tmp_path, monkeypatch):
    """An installed task plug-in, "spy", whose constructor (seq_len, vocab) writes a marker when called."""
    from importlib import metadata

    from tmem_bench.registry import TASKS

    folder = tmp_path / "spy"
    folder.mkdir()
    marker = tmp_path / "constructed"
    (folder / "spy_task.py").write_text(
        "import pathlib\nfrom tmem_bench.tasks.no_harm import NoHarm\n\n\nclass Spy(NoHarm):\n"
        "    def __init__(self, seq_len=32, vocab=16):\n"
        f"        pathlib.Path({str(marker)!r}).write_text('called')\n        super().__init__(seq_len, vocab)\n")
    monkeypatch.syspath_prepend(str(folder))
    point = metadata.EntryPoint("spy", "spy_task:Spy", "tmem_bench.tasks")
    monkeypatch.setattr(TASKS, "_entry_points", {**TASKS._plugins(), "spy": point})
    yield marker
    sys.modules.pop("spy_task", None)


def test_an_option_the_factory_does_not_declare_is_refused_before_it_is_called(board, spy):
    craft(board, cell=lambda c: c.update(task="spy", task_options={**c["task_options"], "cmd": "rm -rf /"}))
    lines = validate(board).rejections
    assert not spy.exists(), "the task's constructor was called with an option it does not declare"
    assert any(re.match(r"t-base: cells/[0-9a-f]{16}\.json: task: task 'spy' takes no option 'cmd'; "
                        r"it takes: seq_len, vocab$", line) for line in lines), lines


def test_a_profile_variant_option_the_task_does_not_declare_is_refused(board):
    craft(board, toml=lambda t: t + 'variants = [{ command = "touch pwned" }]\n')
    lines = validate(board).rejections
    assert ("t-base: profile: tasks.no_harm.variants[0]: task 'no_harm' takes no option 'command'; "
            "it takes: seq_len, vocab, positions") in lines


def test_the_cli_refuses_module_names_unless_trusted(board, evil, capsys):
    module, marker = evil
    craft(board, entry=lambda d: d["settings"][0].update(task=f"{module}:Task"))
    assert main(["leaderboard", "validate", str(board)]) == 1
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 1
    err = capsys.readouterr().err
    assert not marker.exists() and "rejected: t-base: settings[0].task:" in err
    assert not (board / "index.html").exists()
    main(["leaderboard", "validate", "--allow-module-names", str(board)])
    assert marker.exists()


def test_the_schema_comes_from_the_board_never_from_an_entry(board, capsys):
    folder = board / "entries" / "t-base"
    data = json.loads((folder / "entry.json").read_text())
    del data["seeds"]
    write_json(folder / "entry.json", data)
    (folder / "entry.schema.json").write_text("{}")  # a schema that admits anything
    (board / "entries" / "entry.schema.json").write_text("{}")
    for path in (folder, board / "entries", board):
        assert any("schema: 'seeds' is a required property" in line for line in validate(path).rejections), path


# ---- files: nothing outside the board is read, nothing it holds is echoed

@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside the board holding a secret JSON file."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "secret.json").write_text(json.dumps({"password": "hunter2"}))
    return folder


def _first_cell(board: Path, suffix: str) -> Path:
    return sorted((board / "entries" / "t-base" / "cells").glob(f"*{suffix}"))[0]


def _link(path: Path, target: Path, relative: bool) -> None:
    path.unlink() if path.is_file() else shutil.rmtree(path)
    path.symlink_to(os.path.relpath(target, path.parent) if relative else target)


LINKS = {  # what is linked -> (the path in the board, the rejection's field)
    "weights": (lambda b: _first_cell(b, ".safetensors"), "cells/"),
    "cell file": (lambda b: _first_cell(b, ".json"), "cells/"),
    "entry.json": (lambda b: b / "entries" / "t-base" / "entry.json", "entry.json"),
    "cells folder": (lambda b: b / "entries" / "t-base" / "cells", "cells"),
    "entry folder": (lambda b: b / "entries" / "t-base", "entry folder"),
}


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "dotdot"])
@pytest.mark.parametrize("what", LINKS)
def test_a_link_out_of_the_board_is_refused_and_its_target_never_shown(board, outside, what, relative, capsys):
    path, field = LINKS[what]
    path = path(board)
    target = outside / path.name
    if what in ("cell file", "entry.json"):
        target = outside / "secret.json"  # any JSON file of the machine
    elif path.is_dir():
        shutil.copytree(path, target)
    else:
        shutil.copy(path, target)  # an exact copy: only its place is wrong
    _link(path, target, relative)
    result = validate(board)
    mine = [line for line in result.rejections if line.startswith("t-base: ")]
    assert any(line.startswith(f"t-base: {field}") and "symbolic link" in line for line in mine), result.rejections
    assert [p.name for p, _ in result.accepted] == ["t-lstm"]
    assert main(["leaderboard", "validate", str(board)]) == 1
    captured = capsys.readouterr()
    assert "hunter2" not in captured.err + captured.out and "password" not in captured.err + captured.out
    if what == "entry folder":
        assert any("symbolic link" in line for line in validate(path).rejections)


def test_an_entries_folder_that_is_a_link_is_refused(board, outside, capsys):
    shutil.move(board / "entries", outside / "entries")
    (board / "entries").symlink_to(outside / "entries")
    assert main(["leaderboard", "validate", str(board)]) == 2
    assert "entries is a symbolic link" in capsys.readouterr().err


def test_a_fifo_in_place_of_a_cell_file_is_refused_without_blocking(board):
    path = _first_cell(board, ".json")
    path.unlink()
    os.mkfifo(path)
    assert any("is not a regular file" in line for line in validate(board).rejections)


def validate_in_a_capped_process(board: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`leaderboard validate` in a process whose address space is capped below 16 GiB, so that
    reading a 16 GiB file whole fails (a MemoryError) instead of exhausting the machine."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, 12 * 2**30));"
            "from tmem_bench.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, "leaderboard", "validate", str(board)],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("suffix", [".safetensors", ".json"])
def test_a_sparse_16_gib_file_is_refused_before_it_is_read(board, tmp_path, suffix):
    path = _first_cell(board, suffix)
    with open(path, "r+b") as f:
        f.truncate(16 * 2**30)
    proc = validate_in_a_capped_process(board, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    where = f"weights: weights file cells/{path.name}" if suffix == ".safetensors" else f"cells/{path.name}:"
    assert f"rejected: t-base: {where} is 17,179,869,184 bytes" in proc.stderr, proc.stderr
    assert "1 entry valid, 1 rejected" in proc.stdout


def test_show_and_load_entry_import_no_module_an_entry_names(board, evil, capsys):
    from tmem_bench import load_entry

    module, marker = evil
    craft(board, cell=lambda c: c.update(task=f"{module}:Task"))
    assert main(["leaderboard", "show", str(board / "entries" / "t-base")]) == 2
    assert not marker.exists() and "--allow-module-names" not in capsys.readouterr().out
    with pytest.raises(UsageError, match="is a module:attribute name"):  # refused as it is read
        load_entry(board / "entries" / "t-base")
    assert not marker.exists()
    # Trusted on request: the name is reached.
    with pytest.raises(Exception) as raised:
        entry = load_entry(board / "entries" / "t-base", allow_module_names=True)
        entry.task(next(iter(entry.cells)))
    assert marker.exists(), raised.value


def test_a_label_the_run_names_is_checked_as_its_profile_table():
    from tmem_bench.leaderboard.names import refused_names

    entry = {"model": {"name": "base"}, "run": {"task": "no_harm", "overrides": {"models": ["wide", "nope"]}},
             "profile": {"toml": '[tasks.no_harm]\nmodels = [{ name = "base", label = "wide", d_model = 32 }]\n'},
             "settings": []}
    assert [where for where, _ in refused_names(entry, {}, False)] == ["run.overrides.models[1]"]
    entry["profile"]["toml"] = entry["profile"]["toml"].replace('"base", label', '"nope2", label')
    assert [where for where, _ in refused_names(entry, {}, False)] == ["run.overrides.models[1]",
                                                                       "profile: tasks.no_harm.models[0]"]
    entry["run"]["overrides"]["models"] = ["wide", {"label": "wide"}]
    assert refused_names(entry, {}, False)[0] == ("run.overrides.models[1]", "{'label': 'wide'} is not a model name")
