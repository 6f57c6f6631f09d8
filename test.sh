#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
