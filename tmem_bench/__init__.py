"""tmem-bench: diagnostic toy tasks for memory in sequence models."""
import sys
from importlib.abc import MetaPathFinder
from importlib.util import find_spec

from .version import __version__

# Gymnasium's convention: importing the package registers its environments. The
# entry point is a string, so torch and the task module load only on make().
GYMNASIUM_ENVS = {"tmem_bench/MapBuilding-v0": "tmem_bench.tasks.map_building_env:MapBuildingEnv"}


def register_envs() -> None:
    """Register the suite's gymnasium environments (a second call is a no-op)."""
    import gymnasium

    for env_id, entry_point in GYMNASIUM_ENVS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point)


def load_results(run_dir):
    """The results table of a run directory (one row per cell and evaluation level)."""
    from .harness.rundir import RunDir

    return RunDir(run_dir).table()


def load_entry(path, allow_module_names: bool = False):
    """A leaderboard entry (leaderboard/entries/<slug>): `.entry`, `.cells`, `.table()`, `.model(cell_id)`
    (built, with its trained weights) and `.reevaluate(cell_id=None)` (stored and recomputed numbers).
    A `module:attribute` task or model the entry names is refused unless `allow_module_names`."""
    from .leaderboard.api import load_entry as load

    return load(path, allow_module_names)


class _RegisterWhenImported(MetaPathFinder):
    """Registers the environments the moment gymnasium has been imported: importing gymnasium costs
    over a second, which no command that does not use it (`--help`, `list`, the leaderboard) should
    pay, while `import tmem_bench` followed by `gymnasium.make(...)`, in either import order, keeps
    working as documented."""

    def find_spec(self, name, path=None, target=None):
        if name != "gymnasium":
            return None
        sys.meta_path.remove(self)  # found once, by the finders after this one
        spec = find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                register_envs()

            spec.loader.exec_module = exec_module
        return spec


if "gymnasium" in sys.modules:
    register_envs()
elif not any(isinstance(finder, _RegisterWhenImported) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenImported())
