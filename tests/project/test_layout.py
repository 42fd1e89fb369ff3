"""The shape of the codebase: layers, no import cycles, small modules, no private names shared.

Imports are read from the source (every `import`, at the top of a module or inside a
function: a lazy import is still a dependency), so the checks need no import to run.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from benchmarks.walk_run import imports  # one reader of the package's imports, the walk's too

ROOT = Path(__file__).resolve().parents[2]
# Where each part of the installed package lives in the repository (pyproject's package-dir).
PACKAGE_DIRS = {"tmem_bench": ROOT / "tmem_bench", "tmem_bench.tasks": ROOT / "tasks",
                "tmem_bench.baselines": ROOT / "baselines"}
MAX_LINES = 450


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_no_import_cycle_between_modules():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_the_cycle_finder_can_fail():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_small(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by concern"


def test_implementations_do_not_import_the_registry():
    """Built-ins are named by the registry's catalogue; a task or model that imported the
    registry would make the two import each other."""
    graph = import_graph()
    plugins = [m for m in graph if m.startswith(("tmem_bench.tasks.", "tmem_bench.baselines."))]
    assert plugins
    for name in [*plugins, *in_package(graph, "tmem_bench.tensor_memory")]:
        assert "tmem_bench.registry" not in graph[name], name


def in_package(graph: dict[str, set[str]], package: str) -> list[str]:
    return [m for m in graph if m == package or m.startswith(package + ".")]


# The layers, lowest first: a module imports from its own layer or a lower one, never a higher.
# The package's __init__ (its public face: `load_entry`, `load_results`) is the top layer, alone: what
# it holds is for users, and a module that read it (`from .. import x`) would reach up through it.
LAYERS = (
    ("plumbing", ("tmem_bench.version", "tmem_bench.errors", "tmem_bench.files", "tmem_bench.levels",
                  "tmem_bench.schema", "tmem_bench.registry", "tmem_bench.thresholds")),
    ("contracts", ("tmem_bench.contracts",)),
    ("models and tasks", ("tmem_bench.tensor_memory", "tmem_bench.baselines", "tmem_bench.tasks")),
    ("diagnostics", ("tmem_bench.diagnostics",)),
    ("harness", ("tmem_bench.harness",)),
    ("report", ("tmem_bench.report",)),
    ("leaderboard", ("tmem_bench.leaderboard",)),
    ("cli", ("tmem_bench.cli",)),
    ("the package's face", ("tmem_bench",)),
)


def layer(name: str) -> int | None:
    for i, (_, prefixes) in enumerate(LAYERS):
        # The root names only itself: every other module is in some package below it.
        if any(name == p or (p != "tmem_bench" and name.startswith(p + ".")) for p in prefixes):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{name} ({LAYERS[layer(name)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
            for name, imported in sorted(graph.items()) if layer(name) is not None
            for target in sorted(imported) if layer(target) is not None and layer(target) > layer(name)]


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if layer(m) is None] == []


def test_no_module_imports_from_a_higher_layer():
    assert upward_imports(import_graph()) == []


# A module reads a data file of its package as `resources.files(PACKAGE).joinpath("NAME")`; no import
# shows it, so the layers are checked on these reads too.
DATA_READ = re.compile(r"resources\.files\((__package__|\"[\w.]+\")\)\.joinpath\(\"([\w.]+)\"")


def data_reads(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the data files it reads, as "package/name" (e.g. "tmem_bench.report/claims.toml")."""
    out = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out[name] = {f"{package if where == '__package__' else where.strip(chr(34))}/{file}"
                     for where, file in DATA_READ.findall(path.read_text())}
    return out


def data_floor(data_file: str, found: dict[str, Path]) -> int | None:
    """A data file's layer: that of the module beside it of the same stem (thresholds.toml is
    thresholds.py's), else that of its package; None where neither has one (profiles, schemas)."""
    package, _, file = data_file.partition("/")
    twin = f"{package}.{file.partition('.')[0]}"
    if twin in found:
        return layer(twin)
    return None if package == "tmem_bench" else layer(package)  # the root's own layer is its face


def reads_from_above(reads: dict[str, set[str]], found: dict[str, Path]) -> list[str]:
    return [f"{name} ({LAYERS[layer(name)][0]}) reads {f} ({LAYERS[data_floor(f, found)][0]})"
            for name, files in sorted(reads.items()) if layer(name) is not None for f in sorted(files)
            if data_floor(f, found) is not None and data_floor(f, found) > layer(name)]


def test_no_module_reads_a_data_file_of_a_higher_layer():
    found = modules()
    reads = data_reads(found)
    assert reads["tmem_bench.thresholds"] == {"tmem_bench/thresholds.toml"}  # the pattern finds reads
    assert reads_from_above(reads, found) == []
    planted = {**reads, "tmem_bench.diagnostics.convergence": {"tmem_bench.report/claims.toml"}}
    assert reads_from_above(planted, found) == [
        "tmem_bench.diagnostics.convergence (diagnostics) reads tmem_bench.report/claims.toml (report)"]


def test_the_layer_check_can_fail():
    planted = {"tmem_bench.contracts.task": {"tmem_bench.harness.plan"}, "tmem_bench.harness.plan": set()}
    assert upward_imports(planted) == ["tmem_bench.contracts.task (contracts) imports tmem_bench.harness.plan (harness)"]
    planted = {"tmem_bench.leaderboard.validate": {"tmem_bench"}, "tmem_bench": set()}
    assert upward_imports(planted) == ["tmem_bench.leaderboard.validate (leaderboard) imports tmem_bench "
                                       "(the package's face)"]


def private_imports(name: str, path: Path) -> list[str]:
    """`from M import _x` in module `name`, M being another module of the package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tmem_bench")):
            found += [f"{name} imports {alias.name} from {'.' * node.level}{node.module or ''}"
                      for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_private_name_is_imported_across_modules():
    assert [line for name, path in sorted(modules().items()) for line in private_imports(name, path)] == []


def test_the_private_import_check_can_fail(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("from .figures import _finish, Style\nfrom .version import __version__\n")
    assert private_imports("tmem_bench.report.m", planted) == ["tmem_bench.report.m imports _finish from .figures"]


def test_only_models_import_tensor_memory():
    """Tensor Memory is one model among others: the harness learns what it needs (which scan
    ran) from the backbone, so nothing but the baselines matched to its parameter count imports it."""
    graph = import_graph()
    tensor_memory = set(in_package(graph, "tmem_bench.tensor_memory"))
    for name, imported in graph.items():
        if name not in tensor_memory and not name.startswith("tmem_bench.baselines."):
            assert not imported & tensor_memory, f"{name} imports {sorted(imported & tensor_memory)}"


def test_baselines_do_not_import_each_other():
    """What two baselines share lives in the core (`recurrent`, `transformer`), not in one of them."""
    graph = import_graph()
    for name in in_package(graph, "tmem_bench.baselines"):
        others = {m for m in graph[name] if m.startswith("tmem_bench.baselines.") and m != name}
        assert not others, f"{name} imports {sorted(others)}"


def test_a_runs_arguments_climb_back_at_most_six_times():
    """Issues 36.1 and 47: followed through the code (benchmarks/walk_run.py), a run's arguments climb
    back up to a higher floor of the package at most 6 times; each climb is a call down into a lower
    layer whose caller then carries on above it, a place where two modules share one job."""
    import re
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "walk_run.py")], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"(\d+) stays in (\d+) files, (\d+) climbs back up, (\d+) returns to a file left\n(.*)",
                      proc.stdout)
    assert found, proc.stdout[-2000:]
    assert int(found[3]) <= 6, found[0]


def test_the_tests_mirror_the_package():
    """Each test folder is named for a folder of the package (tests/harness/executors for
    tmem_bench/harness/executors, tests/tasks for tasks/), or is tests/project, for the checkout."""
    package_folders = {p.relative_to(root).as_posix() for root in (ROOT / "tmem_bench",) for p in root.rglob("*")
                       if p.is_dir() and (p / "__init__.py").exists()}
    package_folders |= {"tasks", "baselines", "project"}
    tests = ROOT / "tests"
    folders = {p.relative_to(tests).as_posix() for p in tests.rglob("*")
               if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders <= package_folders, sorted(folders - package_folders)
    flat = {p.stem.removeprefix("test_") for p in tests.glob("test_*.py")}
    assert flat <= {p.stem for p in (ROOT / "tmem_bench").glob("*.py")}, sorted(flat)
