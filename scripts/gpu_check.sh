#!/usr/bin/env bash
# The device checks for a lent GPU, as one prepared call of at most 8 minutes (docs/results.md, "On a GPU"):
#   1. scripts/gpu_figures.py, first (the figures matter most): on random models of the Llama-3.2 1B/3B
#      shapes, in bfloat16 then float32, target AR and speculative decoding (the 1B drafting for the 3B)
#      on each compile path (off, static, graphs) beside transformers' eager and static (compiled)
#      peers, warmed and alternating; the target step against the card's memory-bandwidth floor;
#      float32 identity, bfloat16 divergences counted. Each group is printed and saved as it ends.
#   2. the engine tests on CUDA (the static path's first, then test.sh's FLOOR_TESTS, or TESTS="..."),
#      each failure logged as it happens (tests/helpers/faillog.py), so a run cut off by its time box
#      still says what failed.
# Output goes to $OUT (the device tool's folder; ./gpu_out elsewhere). Time boxes in seconds:
# FIGURES_S (default 300) and TESTS_S (default 140): with start-up and the last lines, under 8 minutes.
# WORKERS test processes (default 14, or the cores where fewer). DEVICE (default cuda) and FIGURE_ARGS (e.g. --small) make a
# smoke run on a CPU possible:
#   DEVICE=cpu FIGURE_ARGS=--small FIGURES_S=120 TESTS=tests/test_processors.py OUT=/tmp/gpu_out bash scripts/gpu_check.sh
# Uses the machine's own python3, torch and transformers (PYTHON overrides; where python3 has no torch,
# the checkout's .venv); nothing is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SPECDEC_FAILLOG="$out/fails.log"
py="${PYTHON:-python3}"
if ! "$py" -c "import torch" 2>/dev/null && [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null || true
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

timeout "${FIGURES_S:-300}" "$py" scripts/gpu_figures.py --device "${DEVICE:-cuda}" ${FIGURE_ARGS:-} \
    --out "$out/gpu_figures.json" 2>&1 \
    | grep --line-buffered -v -i "warn\|forward_call\|rope_param\|generation_config\|max_cache_len\|bos_token_id" | tee "$out/figures.log"
echo "figures exit ${PIPESTATUS[0]} (124: stopped by its time box) after $(( $(date +%s) - start )) s"

engine=$(sed -n '/^FLOOR_TESTS=(/,/^)/p' test.sh | grep tests/ | xargs)
first="tests/test_static_cache.py tests/test_compile_front.py"
tests="${TESTS:-$first $(for t in $engine; do case " $first " in *" $t "*) ;; *) printf '%s ' "$t";; esac; done)}"
cores=$(nproc 2>/dev/null || echo 2)
SPECDEC_TEST_DEVICE="${DEVICE:-cuda}" timeout "${TESTS_S:-140}" "$py" -m pytest -q -n "${WORKERS:-$(( cores < 14 ? cores : 14 ))}" --dist loadfile \
    -p no:cacheprovider -p tests.helpers.faillog $tests > "$out/tests.log" 2>&1
echo "pytest exit $? (124: stopped by its time box) after $(( $(date +%s) - start )) s in all"
tail -3 "$out/tests.log" | cut -c1-300
if [ -s "$out/fails.log" ]; then
    echo "$(wc -l < "$out/fails.log") failures; by first error line:"
    cut -d' ' -f3- "$out/fails.log" | sed 's/[0-9]\+/N/g' | sort | uniq -c | sort -rn | head -25 | cut -c1-250
fi
