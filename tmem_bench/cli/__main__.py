"""`python -m tmem_bench.cli ...` does what `tmem-bench ...` does."""
import sys

from .main import main

sys.exit(main())
