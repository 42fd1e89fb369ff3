"""tmem-bench: diagnostic toy tasks for memory in sequence models."""
__version__ = "0.1.0"


def load_results(run_dir):
    """The results table of a run directory (one row per cell and evaluation level)."""
    from .results import load_results as _load

    return _load(run_dir)
