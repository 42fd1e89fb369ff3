"""What a command imports, and the command's identity (issue 46): `import tmem_bench` and the commands
that do not use gymnasium (`--help`, `list`, the leaderboard) do not import it, while
`gymnasium.make` of the suite's environment works after `import tmem_bench` in either order;
`leaderboard fetch` imports no torch; `tmem-bench --version` and `python -m tmem_bench.cli` exist."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tmem_bench import __version__


def _python(code: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, *args, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("argv", [[], ["--help"], ["list"], ["leaderboard", "fetch", "leaderboard"]])
def test_a_command_that_does_not_use_gymnasium_does_not_import_it(argv, tmp_path):
    code = ("import sys\nfrom tmem_bench.cli import main\n"
            f"try:\n    main({argv!r}) if {bool(argv)!r} else None\nexcept SystemExit:\n    pass\n"
            "print('gymnasium' in sys.modules, 'torch' in sys.modules)")
    gymnasium, torch = _python(code).splitlines()[-1].split()
    assert gymnasium == "False"
    if argv[:2] == ["leaderboard", "fetch"]:
        assert torch == "False"  # fetching checks hashes; it builds no model


@pytest.mark.parametrize("order", ["import gymnasium, tmem_bench", "import tmem_bench, gymnasium"])
def test_gymnasium_make_works_after_importing_tmem_bench_in_either_order(order):
    code = f"{order}\nprint(type(gymnasium.make('tmem_bench/MapBuilding-v0', horizon=4).unwrapped).__name__)"
    assert _python(code) == "MapBuildingEnv"


def test_version_and_python_dash_m():
    # The one -m entry, which the tests' helpers run; a second, python -m tmem_bench, was removed (issue 58):
    # no page named it.
    proc = subprocess.run([sys.executable, "-m", "tmem_bench.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"tmem-bench {__version__}", proc


@pytest.mark.parametrize("argv, needle", [
    (["run", "NOPE"], "unknown task 'NOPE'; known: coordinate_binding"),
    (["run", "coordinate_binding", "--models", "base,nope"], "unknown model 'nope'; known: base"),
    (["run", "coordinate_binding", "--models", "nope", "--dry-run"], "unknown model 'nope'"),
])
def test_a_bad_name_is_refused_before_torch_is_imported(argv, needle):
    # Importing torch takes seconds (tens on a busy machine): a typo is told before that.
    code = ("import sys\nfrom tmem_bench.cli import main\n"
            f"print(main({argv!r}), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["2", "False"], proc
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
