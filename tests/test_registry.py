"""Installed plug-ins that are broken: one that raises on import is one line in `list` (every other
task still listed) and a one-line error in `run` and `check`, like a module:attribute that cannot be
loaded; a task whose constructor raises is a one-line error in `run`. Which variants force memory,
asked by name (`variant_forces_memory`), as its four copies before it answered."""
from __future__ import annotations

import sys

import pytest

from tmem_bench.cli import main
from tmem_bench.diagnostics.conformance_tasks import task_variants
from tmem_bench.harness.plan import _variant_name
from tmem_bench.registry import BACKBONES, TASKS, get_task, task_names, variant_forces_memory

ENTRY_POINTS = """
[tmem_bench.tasks]
broken_task = broken_plugin:Task
raising_task = raising_plugin:Raising

[tmem_bench.models]
broken_model = broken_plugin:model
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A distribution installed on sys.path whose entry points name a module that raises on import
    and a task whose constructor raises."""
    site = tmp_path / "site"
    info = site / "broken_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "broken_plugin.py").write_text('raise RuntimeError("the plug-in author\'s bug")\n')
    (site / "raising_plugin.py").write_text(
        "from tmem_bench.tasks.no_harm import NoHarm\n\n\nclass Raising(NoHarm):\n"
        "    def __init__(self, seq_len=32, vocab=16):\n        raise RuntimeError('no data here')\n")
    monkeypatch.syspath_prepend(str(site))
    for registry in (TASKS, BACKBONES):
        monkeypatch.setattr(registry, "_entry_points", None)  # found again, with this distribution
    yield tmp_path
    for name in ("broken_plugin", "raising_plugin"):
        sys.modules.pop(name, None)


def one_line(capsys, needle: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err


def test_list_names_a_broken_plugin_and_lists_everything_else(plugins, capsys):
    assert {"broken_task", "raising_task"} <= set(TASKS.names()) and "broken_model" in BACKBONES.names()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    broken = [line for line in lines if "broken:" in line]
    assert any(line.startswith("  broken_task  broken: cannot load task 'broken_task' (entry point "
                               "broken_plugin:Task): RuntimeError: the plug-in author's bug") for line in broken), out
    assert any(line.startswith("  raising_task  broken: task 'raising_task': its constructor raised RuntimeError: "
                               "no data here") for line in broken), out
    assert any(line.startswith("  broken_model  broken: cannot load model 'broken_model'") for line in broken), out
    assert len(broken) == 3
    assert "coordinate_binding" in out and "map_building" in out and "profiles" in out


@pytest.mark.parametrize("args, needle", [
    (["run", "broken_task"], "cannot load task 'broken_task' (entry point broken_plugin:Task): RuntimeError"),
    (["run", "no_harm", "--models", "broken_model"], "cannot load model 'broken_model' (entry point"),
    (["check", "broken_model"], "cannot load model 'broken_model' (entry point broken_plugin:model): RuntimeError"),
    (["check", "--task", "broken_task"], "cannot load task 'broken_task'"),
    (["run", "raising_task"], "task 'raising_task': its constructor raised RuntimeError: no data here"),
], ids=["run-task", "run-model", "check-model", "check-task", "run-raising-task"])
def test_a_broken_entry_point_is_one_line_in_run_and_check(plugins, args, needle, capsys):
    out = plugins / "run"
    assert main([*args, *(["--out", str(out), "--no-report"] if args[0] == "run" else [])]) == 2
    one_line(capsys, needle)
    assert not out.exists()


def test_check_still_reports_a_raising_constructor_as_a_failed_check(plugins, capsys):
    assert main(["check", "--task", "raising_task"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_a_task_made_under_trust_is_refused_where_module_names_are_not(tmp_path, monkeypatch):
    """Tasks are made once per process; a `module:attribute` task made where such names are trusted
    must not be handed, from that memo, to a caller that does not trust them (a leaderboard entry)."""
    from tmem_bench.errors import UsageError
    from tmem_bench.registry import get_task, module_names

    (tmp_path / "trusted_task.py").write_text("from tmem_bench.tasks.no_harm import NoHarm as Task\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with module_names(True):
        task = get_task("trusted_task:Task", vocab=8)
        assert get_task("trusted_task:Task", vocab=8) is task  # made once
        assert get_task("trusted_task:Task", vocab=4) is not task
    with pytest.raises(UsageError, match="module:attribute names are not imported here"):
        get_task("trusted_task:Task", vocab=8)
    sys.modules.pop("trusted_task", None)


def _registered_variants():
    """(task name, the name a cell records for the variant, the task) of every registered task's
    every variant, named as the planner names them."""
    for name in task_names():
        standard = TASKS.get(name)()
        for _, task in task_variants(TASKS.get(name), {}):
            yield name, _variant_name(standard, task), task


def test_the_memory_forcing_predicate_agrees_with_its_four_old_copies_on_every_registered_variant():
    seen = set()
    for name, variant, task in _registered_variants():
        options = task.options()
        cls = TASKS.get(name)
        old = {
            "report/rules.py": variant != "standard" and cls.forces_memory(options),
            "report/validity.py": name in TASKS and cls.forces_memory(options),
            "leaderboard/board.py": get_task(name).forces_memory(options),
            "leaderboard/about.py": variant != "standard" and type(get_task(name)).forces_memory(options),
        }
        assert set(old.values()) == {variant_forces_memory(name, variant, options)}, (name, variant, old)
        seen.add(variant_forces_memory(name, variant, options))
    assert seen == {True, False}  # both answers are given somewhere, so the comparison can fail either way


def test_a_task_not_installed_here_is_read_as_standard(plugins):
    assert variant_forces_memory("no_such_task", "block_queries=True", {"block_queries": True}) is False
    assert variant_forces_memory("broken_task", "block_queries=True", {"block_queries": True}) is False
    assert variant_forces_memory("coordinate_binding", "block_queries=True", {"block_queries": True}) is True
    # A standard cell loads no task, whatever its options say.
    assert variant_forces_memory("coordinate_binding", "standard", {"block_queries": True}) is False
