#!/usr/bin/env bash
# The device check for a lent GPU, as one call under a hard budget of 6 minutes (docs/results.md,
# "On a GPU"), in this order, each part under its share of the time (printed first; a part's
# unused time goes to the next) and each saved to its folder under $OUT as soon as it ends:
#   1. identity/  correctness first: float32, random models of the Llama-3.2 1B/3B layer shapes (4
#                 layers each: a capture's cost grows with the layers), target AR
#                 and speculative decoding (the 1B drafting for the 3B) on each compile path (off,
#                 static, graphs) and transformers' eager and static peers, each run once: every
#                 output must equal the engine's eager target AR;
#   2. verdicts/  the same in bfloat16: each output that differs judged a near-tie or unexplained
#                 (analysis/divergence.py; a peer records no rows, so it gets no verdict);
#   3. speed/     the bfloat16 entries timed in alternating rounds (scripts/gpu_figures.py);
#   4. tests/     the engine tests on the device (the static path's first, then test.sh's FLOOR_TESTS,
#                 or TESTS="..."), each failure logged as it happens (tests/helpers/faillog.py); a
#                 test that needs a package the machine lacks (optimum-quanto) is skipped, one line.
# Nothing is filtered out of the output: every error line and traceback is shown.
#
#   bash scripts/gpu_check.sh              on the GPU machine; with no CUDA device it says so in one
#                                          line and exits 0
#   bash scripts/gpu_check.sh --rehearse   the same parts on the CPU, on small shapes, in at most 3
#                                          minutes, with transformers 5.17 (.venv-5.17.0 where it is
#                                          set up, else the default python): test.sh runs it
#
# Uses the machine's own python3, torch and transformers (PYTHON overrides; where python3 has no
# torch, the checkout's .venv); nothing is installed. OUT: the output folder (default ./gpu_out).
# BUDGET_S: the whole call's seconds (default 360; 180 rehearsing). TESTS: the test files of part 4.
# WORKERS: test processes (default 14, or the cores where fewer; pytest-xdist where installed).
# The exit status is 0 when every part ran to its end and passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."

rehearse=0
case "${1:-}" in
    "") ;;
    --rehearse) rehearse=1 ;;
    *) echo "usage: bash scripts/gpu_check.sh [--rehearse]" >&2; exit 2 ;;
esac

start=$(date +%s)
py="${PYTHON:-}"
if [ -z "$py" ] && [ "$rehearse" -eq 1 ] && [ -x .venv-5.17.0/bin/python ]; then
    py=.venv-5.17.0/bin/python
fi
if [ -z "$py" ]; then
    py=python3
    if ! "$py" -c "import torch" 2>/dev/null && [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
fi

if [ "$rehearse" -eq 0 ] && ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is false in $py): nothing checked; --rehearse runs the parts on the CPU"
    exit 0
fi

out="${OUT:-gpu_out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ "$rehearse" -eq 1 ]; then
    budget="${BUDGET_S:-180}"
    device=cpu
    # small shapes, few tokens: the rehearsal runs every step of every part, not the figures
    figure_args=(--small --length 8 --prompt 8 --gamma 2 --ab-rounds 1 --identity-layers 2)
    shares=(identity=40 verdicts=40 speed=15)
    tests_share=45
    tests="${TESTS:-tests/test_compile_front.py}"
else
    budget="${BUDGET_S:-360}"
    device=cuda
    figure_args=()
    shares=(identity=60 verdicts=170 speed=70)
    tests_share=40
    engine=$(sed -n '/^FLOOR_TESTS=(/,/^)/p' test.sh | grep tests/ | xargs)
    first="tests/test_static_cache.py tests/test_compile_front.py tests/test_bench_static_peers.py"
    tests="${TESTS:-$first $(for t in $engine; do case " $first " in *" $t "*) ;; *) printf '%s ' "$t";; esac; done)}"
fi
figures_share=0
for share in "${shares[@]}"; do figures_share=$(( figures_share + ${share#*=} )); done
# start-up (imports, models built before a part's clock starts) and the last lines: the rest
reserve=$(( budget - figures_share - tests_share ))
shares_line=$(IFS=,; echo "${shares[*]}")

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null || true
"$py" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
rest="start-up and the last lines ${reserve} s"
[ "$reserve" -ge 0 ] || rest="the shares exceed the budget: the later parts get what is left"
echo "gpu_check$( [ "$rehearse" -eq 1 ] && echo ' --rehearse'): ${budget} s in all: ${shares_line//,/ s, } s, tests=${tests_share} s, $rest"

left() { echo $(( start + budget - $(date +%s) )); }

# Parts 1 to 3 in one process (the verdicts' runs are the speed part's warm-up); a hard stop at their
# shares and half the reserve.
figures_box=$(( figures_share + (reserve > 0 ? reserve / 2 : 0) ))
[ "$figures_box" -le $(( $(left) - 10 )) ] || figures_box=$(( $(left) - 10 ))
timeout "$figures_box" "$py" scripts/gpu_figures.py --device "$device" ${figure_args[@]+"${figure_args[@]}"} \
    --parts identity,verdicts,speed --shares "$shares_line" --out-dir "$out" 2>&1 | tee "$out/figures.log"
figures=${PIPESTATUS[0]}
case "$figures" in
    0) why="every part ran to its end and passed" ;;
    124) why="stopped by its time box" ;;
    *) why="an output differs in float32, a difference is unexplained, or an entry or a part failed" ;;
esac
echo "gpu_check: figures exit $figures ($why) after $(( $(date +%s) - start )) s"

# Part 4: the tests, with what is left but a few seconds for the last lines.
mkdir -p "$out/tests"
tests_box=$(( $(left) - 5 ))
[ "$tests_box" -gt 1 ] || tests_box=1
parallel=()
if "$py" -c "import xdist" 2>/dev/null; then
    cores=$(nproc 2>/dev/null || echo 2)
    parallel=(-n "${WORKERS:-$(( cores < 14 ? cores : 14 ))}" --dist loadfile)
fi
echo "== part tests: ${tests_box} s: $tests"
# shellcheck disable=SC2086  # $tests is a list of files
SPECDEC_FAILLOG="$out/tests/fails.log" SPECDEC_TEST_DEVICE="$device" timeout "$tests_box" \
    "$py" -m pytest -q -rs ${parallel[@]+"${parallel[@]}"} -p no:cacheprovider -p tests.helpers.faillog $tests \
    > "$out/tests/tests.log" 2>&1
status=$?
{
    echo "pytest exit $status (124: stopped by its time box) after $(( $(date +%s) - start )) s in all"
    grep -E "^(SKIPPED|ERROR|FAILED)" "$out/tests/tests.log" | cut -c1-300 | head -40
    tail -1 "$out/tests/tests.log" | cut -c1-300
    if [ -s "$out/tests/fails.log" ]; then
        echo "$(wc -l < "$out/tests/fails.log") failures; by first error line:"
        cut -d' ' -f3- "$out/tests/fails.log" | sed 's/[0-9]\+/N/g' | sort | uniq -c | sort -rn | head -25 | cut -c1-250
    fi
} | tee "$out/tests/summary.txt"

echo "gpu_check: figures exit $figures, tests exit $status, $(( $(date +%s) - start )) s of ${budget}"
[ "$figures" -eq 0 ] && [ "$status" -eq 0 ]
