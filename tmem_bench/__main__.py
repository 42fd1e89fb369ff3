"""`python -m tmem_bench ...` does what `tmem-bench ...` does."""
import sys

from .cli.main import main

sys.exit(main())
