#!/usr/bin/env bash
# Set up .venv (if needed) and start the REPL; arguments go to infer.py.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/python infer.py "$@"
