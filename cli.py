"""`python cli.py ...` from a clone does what `tmem-bench ...` does."""
import sys
from pathlib import Path

root = Path(__file__).resolve().parent
sys.path.insert(0, str(root))
import tmem_bench  # noqa: E402

# Uninstalled, tasks/ and baselines/ sit beside the package rather than in it.
if not (Path(tmem_bench.__file__).parent / "tasks").is_dir():
    tmem_bench.__path__.append(str(root))

from tmem_bench.cli import main

sys.exit(main())
