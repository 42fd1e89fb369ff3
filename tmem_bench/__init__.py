"""tmem-bench: diagnostic toy tasks for memory in sequence models."""
from .version import __version__

# Gymnasium's convention: importing the package registers its environments. The
# entry point is a string, so torch and the task module load only on make().
GYMNASIUM_ENVS = {"tmem_bench/MapBuilding-v0": "tmem_bench.tasks.map_building:MapBuildingEnv"}


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


register_envs()
