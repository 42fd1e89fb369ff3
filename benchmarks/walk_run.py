"""Walk a run's arguments through the code: which files `tmem-bench run` passes through, in order.

Runs one tiny cell (`run coordinate_binding --models base --seeds 1 --steps 2`, serial, no
report) under a profiler hook and records, in order, the first call of each function that receives
the run's arguments or what was made from them (`walk`), anywhere in the package: the tasks and
models a cell trains (tasks/, baselines/, tensor_memory/) count as any other file, since a reader
following the arguments goes through them too. Consecutive calls in one file are one stay.

Counted as a reader counts them: each file stands on a floor of the package (a folder of tmem_bench,
tasks/ and baselines/ count as one room, each other module as its own; a room stands one floor above
the highest room it imports, read from the source: floor 1 imports nothing of the package), and a climb
back up is a stay on a higher floor than the stay before it: a call down into a lower layer whose caller
then carries on above it. A return is a stay in a file the walk had already left. Prints the stays, the
files, the climbs back up and the returns, then the path with each file's floor. Works on any revision
of the package (it only calls `tmem_bench.cli.main` and reads the package's imports).

    python benchmarks/walk_run.py
"""
from __future__ import annotations

import ast
import functools
import sys
import tempfile
from pathlib import Path

import tmem_bench
import tmem_bench.baselines
import tmem_bench.tasks
from tmem_bench.cli import main

# Where the package's files lie, each named as its path inside the installed package: tasks/ and
# baselines/ sit beside tmem_bench/ in a clone (pyproject's package-dir) and inside it once installed.
ROOTS = {Path(tmem_bench.__file__).resolve().parent: Path(),
         Path(tmem_bench.tasks.__file__).resolve().parent: Path("tasks"),
         Path(tmem_bench.baselines.__file__).resolve().parent: Path("baselines")}


@functools.cache  # asked at every call the profiler sees
def _in_package(filename: str) -> Path | None:
    """A source file as named inside the package, or None for a file outside it."""
    path = Path(filename)
    if path.suffix != ".py":
        return None
    for root, name in ROOTS.items():
        if root in path.parents:
            return name / path.relative_to(root)
    return None


def _sources() -> dict[str, tuple[Path, str]]:
    """The package's modules by name (tmem_bench.harness.plan), each with its file and its room: the
    folder it lies in under tmem_bench (harness/, tasks/, ...), or itself (registry.py, __init__.py)."""
    found = {}
    for root, name in ROOTS.items():
        for path in root.rglob("*.py"):
            rel = name / path.relative_to(root)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.setdefault(".".join(["tmem_bench", *parts]), (path, _room(str(rel))))
    return found


def _room(file: str) -> str:
    """The room of a file as _in_package names it (harness/plan.py -> harness/, registry.py)."""
    parts = Path(file).parts
    return f"{parts[0]}/" if len(parts) > 1 else parts[0]


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the package that module `name` imports, at its top or inside a function (a
    lazy import is still a dependency); tests/project/test_layout.py checks the layers with it too."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            # `from pkg import x` imports pkg, and pkg.x too where x is a module.
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def floors() -> dict[str, int]:
    """Each room's floor: one above the highest room it imports (1 for a room that imports none)."""
    sources = _sources()
    ties: dict[str, set[str]] = {}
    for module, (path, room) in sources.items():
        ties.setdefault(room, set()).update(sources[t][1] for t in imports(module, path, set(sources)))
    found: dict[str, int] = {}

    def floor(room: str, path: tuple = ()) -> int:
        if room not in found:
            if room in path:
                raise SystemExit(f"the rooms import each other in a circle: {' -> '.join(path + (room,))}")
            found[room] = 1 + max((floor(r, path + (room,)) for r in ties[room] - {room}), default=0)
        return found[room]
    return {room: floor(room) for room in ties}


def _held(value, depth: int = 0):
    """A value and what it holds (fields of dataclasses and namespaces, items of containers)."""
    yield value
    if depth >= 3 or isinstance(value, (str, bytes, int, float, bool, type(None), type)) or callable(value):
        return
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    elif hasattr(value, "__dict__"):
        children = list(vars(value).values())
    elif hasattr(value, "__dataclass_fields__"):
        children = [getattr(value, f) for f in value.__dataclass_fields__]
    else:
        children = []
    for child in children[:64]:
        yield from _held(child, depth + 1)


def walk() -> list[str]:
    """The files of the functions the run's arguments reach, in the order they are first reached.

    Tracked: the parsed arguments, what they hold and what cmd_run makes of them; then whatever a
    call that received a tracked value returns (the overrides, the plan, its cells, the executor's options, ...). A call
    is on the walk when one of its parameters is a tracked object (by identity; strings, numbers
    and None are too common to follow by identity and are followed only inside what holds them)."""
    seen, files, tracked, frames = set(), [], {}, set()

    def follow(value):
        for v in _held(value):
            if not isinstance(v, (str, bytes, int, float, bool, type(None))):
                tracked[id(v)] = v  # kept alive, so that an id is never reused

    def hook(frame, event, arg):
        code = frame.f_code
        if event == "return" and id(frame) in frames:
            frames.discard(id(frame))
            follow(arg)
            return
        if event != "call":
            return
        if code.co_name == "cmd_run" and not tracked:
            follow(frame.f_locals.get("args"))
        caller = frame.f_back
        if caller is not None and caller.f_code.co_name == "cmd_run":
            follow(list(caller.f_locals.values()))  # what cmd_run made of its arguments so far
        rel = _in_package(code.co_filename) if tracked else None
        if rel is None or code.co_name.startswith("<"):
            return
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if not any(id(frame.f_locals.get(n)) in tracked for n in names if n not in ("self", "cls")):
            return
        frames.add(id(frame))
        key = (str(rel), code.co_name)
        if key not in seen:
            seen.add(key)
            files.append(str(rel))

    with tempfile.TemporaryDirectory() as out:
        argv = ["run", "coordinate_binding", "--models", "base", "--seeds", "1", "--steps", "2",
                "--out", str(Path(out) / "run"), "--no-report", "--executor", "serial"]
        # The estimate a run prints first times a model's steps once per machine (estimate.py, a job
        # of its own, walked by nothing here); a dry run untraced stores them, so the walk is the run's.
        if main([*argv, "--dry-run"]) != 0:
            raise SystemExit("the dry run before the walk failed")
        sys.setprofile(hook)
        try:
            code = main(argv)
        finally:
            sys.setprofile(None)
    if code != 0:
        raise SystemExit(f"the run failed (exit {code})")
    return files


def stays(files: list[str]) -> list[str]:
    return [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]


def main_() -> None:
    path, of = stays(walk()), floors()
    up = [of[_room(f)] for f in path]
    climbs = sum(1 for i in range(1, len(path)) if up[i] > up[i - 1])
    returns = sum(1 for i, f in enumerate(path) if f in path[:i])
    print(f"{len(path)} stays in {len(set(path))} files, {climbs} climbs back up, {returns} returns to a file left")
    print(" -> ".join(f"{f} ({n})" for f, n in zip(path, up)))


if __name__ == "__main__":
    main_()
