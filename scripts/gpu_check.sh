#!/usr/bin/env bash
# The device checks for a lent GPU, as one prepared call (docs/results.md, "On a GPU"):
#   1. scripts/gpu_figures.py: costs, target AR against transformers' generate (alternating),
#      greedy identity in float32 and bfloat16, on random models of the Llama-3.2 1B/3B shapes;
#   2. the engine tests (test.sh's FLOOR_TESTS, or TESTS="...") on CUDA, each failure logged as it
#      happens (tests/helpers/faillog.py), so a run cut off by its time box still says what failed.
# Output goes to $OUT (the device tool's folder; ./gpu_out elsewhere). Time boxes in seconds:
# FIGURES_S (default 150) and TESTS_S (default 300); WORKERS test processes (default 14).
# DEVICE (default cuda) and FIGURE_ARGS (e.g. --small) make a smoke run on a CPU possible.
# Uses the machine's own python3, torch and transformers; nothing is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SPECDEC_FAILLOG="$out/fails.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

timeout "${FIGURES_S:-150}" python3 scripts/gpu_figures.py --device "${DEVICE:-cuda}" ${FIGURE_ARGS:-} \
    --out "$out/gpu_figures.json" 2>&1 \
    | grep -v -i "warn\|forward_call\|rope_param\|generation_config" | tee "$out/figures.log"

engine=$(sed -n '/^FLOOR_TESTS=(/,/^)/p' test.sh | grep tests/ | xargs)
SPECDEC_TEST_DEVICE="${DEVICE:-cuda}" timeout "${TESTS_S:-300}" python3 -m pytest -q -n "${WORKERS:-14}" --dist loadfile \
    -p no:cacheprovider -p tests.helpers.faillog ${TESTS:-$engine} > "$out/tests.log" 2>&1
echo "pytest exit $? (124: stopped by its time box)"
tail -3 "$out/tests.log" | cut -c1-300
if [ -s "$out/fails.log" ]; then
    echo "$(wc -l < "$out/fails.log") failures; by first error line:"
    cut -d' ' -f3- "$out/fails.log" | sed 's/[0-9]\+/N/g' | sort | uniq -c | sort -rn | head -25 | cut -c1-250
fi
