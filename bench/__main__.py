"""``python -m bench``: the same as ``python bench.py``."""

import sys

from bench.cli import main

sys.exit(main())
