"""The registry of engines: every engine declares what the CLI, the dry run
and make_executor ask of it; bad or unusable options are refused in one line before anything is
written; a failing cell is retried, recorded and reported while the others finish."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.harness.executors.helpers import PLUGIN, sweep_profile
from tmem_bench.cli import build_parser, main
from tmem_bench.errors import UsageError, positive
from tmem_bench.harness.executors import (ENGINES, ExecutorOptions, LocalOptions, RayOptions, Serial, SlurmOptions,
                                          from_args, usable)
from tmem_bench.harness.executors.base import Flag
from tmem_bench.harness.plan import Overrides, make_plan
from tmem_bench.harness.results import read_cell
from tmem_bench.harness.rundir import RunDir
from tmem_bench.registry import module_names
from tmem_bench.report.data import load_run


def test_every_engine_declares_itself_to_the_registry():
    assert list(ENGINES) == ["serial", "local", "ray", "slurm"]
    (run,) = [a for a in build_parser()._actions if a.dest == "command"]
    parser = run.choices["run"]
    flags = {flag for action in parser._actions for flag in action.option_strings}
    (executor,) = [a for a in parser._actions if a.dest == "executor"]
    assert executor.metavar == "|".join(ENGINES)  # the CLI offers every engine, and no other
    for name, engine in ENGINES.items():
        assert engine.name == name and {f.name for f in engine.flags} <= flags, name
        assert engine.Options is None or {"given", "from_args"} <= set(vars(engine.Options)), name
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    assert helps["--workers"] == ("local: worker processes (default one per GPU, else one per core); "
                                  "slurm: array tasks at once")  # each engine's meaning, in the registry's order
    assert helps["--executor"].startswith("where the cells run: serial (in this process, the default), local (")


@dataclass(frozen=True)
class _ToyOptions:
    knob: str | None = None

    @classmethod
    def from_args(cls, args):
        return cls(knob=args.toy_knob)

    def given(self):
        return ["--toy-knob"] * (self.knob is not None)


class _Toy(Serial):
    name, summary = "toy", "a test's engine"
    flags = (Flag("--toy-knob", "a knob", {"metavar": "K"}),
             Flag("--workers", "toys at once", {"type": positive, "metavar": "N"}))
    Options = _ToyOptions


def test_an_engine_registered_brings_its_flags_and_options_to_the_command_line(monkeypatch):
    monkeypatch.setitem(ENGINES, "toy", _Toy)  # no line of the CLI names it
    parser = build_parser()
    args = parser.parse_args(["run", "coordinate_binding", "--executor", "toy", "--toy-knob", "k", "--workers", "2"])
    o = usable(from_args(args))
    assert (o.kind, o.workers, o.own) == ("toy", 2, _ToyOptions(knob="k"))
    (command,) = [a for a in parser._actions if a.dest == "command"]
    helps = {a.option_strings[0]: a.help for a in command.choices["run"]._actions if a.option_strings}
    assert helps["--workers"].endswith("; toy: toys at once") and helps["--toy-knob"] == "toy: a knob"
    assert "toy (a test's engine)" in helps["--executor"]
    args = parser.parse_args(["run", "coordinate_binding", "--executor", "local", "--toy-knob", "k"])
    with pytest.raises(UsageError, match="^--toy-knob applies to --executor toy, not local$"):
        usable(from_args(args))


def test_engines_sharing_a_flag_must_declare_it_alike(monkeypatch):
    class Odd(_Toy):
        flags = (Flag("--workers", "odd", {"type": float, "metavar": "N"}),)

    monkeypatch.setitem(ENGINES, "toy", Odd)
    with pytest.raises(TypeError, match="--workers with different settings"):
        build_parser()


@pytest.mark.parametrize("options, needle", [
    (lambda: ExecutorOptions(kind="dask"), "--executor 'dask' is unknown; allowed: serial, local, ray, slurm"),
    (lambda: ExecutorOptions(kind="serial", workers=2), "--workers applies to --executor local or slurm, not serial"),
    (lambda: ExecutorOptions(kind="local", own=RayOptions(address="ray://x")),
     "--address applies to --executor ray, not local"),
    (lambda: ExecutorOptions(kind="ray", own=(LocalOptions(), RayOptions(), SlurmOptions(partition="gpu"))),
     "--slurm-partition applies to --executor slurm, not ray"),
    (lambda: ExecutorOptions(kind="local", gpus_per_cell=1), "--gpus-per-cell applies to --executor ray or slurm"),
    (lambda: ExecutorOptions(kind="local", own=SlurmOptions(partition="gpu")),
     "--slurm-partition applies to --executor slurm, not local"),
    (lambda: ExecutorOptions(kind="serial", own=SlurmOptions(options={"qos": "high"})),
     "--slurm-option applies to --executor slurm, not serial"),
    (lambda: ExecutorOptions(kind="local", workers=0), "--workers"),
])
def test_bad_executor_settings_are_refused(options, needle):
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        usable(options())


def test_another_engines_options_left_at_their_defaults_are_dropped():
    assert usable(ExecutorOptions(kind="local", own=SlurmOptions())).own == LocalOptions()
    assert usable(ExecutorOptions(kind="serial", own=(LocalOptions(), RayOptions(), SlurmOptions()))).own is None


def test_a_missing_extra_names_it_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    profile = sweep_profile(tmp_path)
    assert main(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ['tmem-bench: error: --executor ray needs ray, which is not installed; '
                                        'install it with: pip install "tmem-bench[ray]"']
    assert not (tmp_path / "run").exists()


def test_a_failing_cell_is_retried_recorded_and_reported_while_the_others_finish(tmp_path, monkeypatch, capsys):
    (tmp_path / "flaky_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    profile = sweep_profile(tmp_path, '["base", { name = "flaky_plugin:model", label = "flaky" }]')
    args = ["run", "coordinate_binding", "--profile", profile, "--level", "n_writes=3", "--seeds", "1",
            "--device", "cpu", "--out", "run", "--no-report", "--retries", "2"]
    monkeypatch.setenv("TMEM_TEST_FAIL", "1")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("FAILED coordinate_binding flaky") == 4  # three attempts, then the summary line
    assert "attempt 3 of 3" in err and "1 of 2 cells failed; rerun the same command" in err

    run_dir = tmp_path / "run"
    with module_names(True):  # the test's own plug-in
        (flaky,) = [c for c in make_plan("coordinate_binding", profile, Overrides(levels={"n_writes": [3]}, seeds=[0]))
                    if c.label == "flaky"]
    record = json.loads(RunDir(run_dir).failed_path(flaky.id).read_text())
    assert record["attempts"] == 3 and record["error"] == "RuntimeError: the plugin broke in training"
    assert "flaky_plugin.py" in record["traceback"] and record["cell"]["label"] == "flaky"
    assert [r["cell"]["label"] for r in RunDir(run_dir).load_cells()[0]] == ["base"]  # the other cell finished
    with pytest.raises(ValueError):
        read_cell(RunDir(run_dir).failed_path(flaky.id))  # never taken for a finished cell
    problems = load_run(run_dir).problems
    assert len(problems) == 1 and f"cell {flaky.id}" in problems[0] and "FAILED after 3 attempt(s)" in problems[0]

    monkeypatch.delenv("TMEM_TEST_FAIL")
    assert main(args) == 0
    assert "resuming: 1 of 2 cells already finished" in capsys.readouterr().err
    assert not RunDir(run_dir).failed_path(flaky.id).exists() and len(RunDir(run_dir).load_cells()[0]) == 2
    assert load_run(run_dir).problems == []
