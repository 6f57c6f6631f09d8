#!/usr/bin/env python
"""Benchmark the decoding strategies: ``python bench.py --help``.

(The ``bench/`` package beside this file holds the code; Python imports the
package, not this script, for ``import bench``.)
"""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
