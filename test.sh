#!/usr/bin/env bash
# Run the tests on both ends of the supported transformers range (docs/versions.md):
#   1. the whole suite on the newest transformers (.venv, set up by scripts/setup.sh);
#   2. the engine tests on the declared floor, transformers 4.57.6 (.venv-floor, scripts/setup.sh --floor);
#   3. the static-path, compile and static-peer tests (STATIC_TESTS) on transformers 5.17.0
#      (.venv-5.17.0, scripts/setup.sh --release 5.17.0): the release the GPU machine has, whose static
#      layer is rolled back differently from the ends' (docs/static.md);
#   4. the GPU check's rehearsal (scripts/gpu_check.sh --rehearse: every part on the CPU, small shapes,
#      on that 5.17 environment, at most 3 minutes), its files left in gpu_out/rehearsal/.
# Arguments go to pytest for the first run only, and skip runs 2 to 4 (they pick tests of the
# whole suite: `bash test.sh -k repl`). SPECDEC_SKIP_FLOOR=1 skips runs 2 to 4 as well (every run
# beside the newest). SPECDEC_STATIC_RELEASE=X.Y.Z runs run 3 on another release (empty: skips it);
# SPECDEC_SKIP_REHEARSAL=1 skips run 4.
# SPECDEC_RELEASES="5.10.4 5.20.2" also runs the engine tests on each of those transformers releases
# (.venv-X.Y.Z, scripts/setup.sh --release X.Y.Z): the releases between the ends, which CI leaves out.
# The script fails when either run fails, and when a run collects no test (pytest's exit code 5).
set -euo pipefail
cd "$(dirname "$0")"

# The floor and release runs keep the tests of the listed files whose result depends on the release (below).
RELEASE_DEPENDENT=(-m "not any_release")

# The engine tests the floor run covers; files not (yet) in the tree are left out. A file belongs
# here when what it checks depends on transformers (a model's forward, its cache, its loading).
# The newest run alone covers test_distribution.py and test_equivalence.py: they sweep sampling
# settings and gammas on one tiny Llama, dimensions that do not depend on the release, and on the
# floor they took 4 of its 11 CPU-minutes. The floor's per-family checks (test_architectures.py:
# greedy at gammas 1, 3 and 5 with the cache on and off, and chi-square sampling on a sliding-window,
# a recurrent and an encoder-decoder family) are what the release changes. Within the listed files,
# tests marked any_release (pytest.ini) run on the newest only, for the same reason.
FLOOR_TESTS=(
    tests/test_accept.py
    tests/test_engine.py
    tests/test_cache_rounds.py
    tests/test_edge_cases.py
    tests/test_inspection.py
    tests/test_divergence.py
    tests/test_processors.py
    tests/test_ngram_storage.py
    tests/test_lookahead.py
    tests/test_architectures.py
    tests/test_architectures_2.py
    tests/test_cache.py
    tests/test_selfdraft_matrix.py
    tests/test_mtp.py
    tests/test_gemma4_assistant.py
    tests/test_eagle3.py
    tests/test_selfdraft_trees.py
    tests/test_lean.py
    tests/test_tree_forward.py
    tests/test_verify_rules.py
    tests/test_drafter_contract.py
    tests/test_hybrid.py
    tests/test_advisor_replay.py
    tests/test_advisor.py
    tests/test_bench_static_peers.py
    tests/test_compile_front.py
    tests/test_static_cache.py
)

# The tests run 3 covers: what the static path and its peers do depends on the release's static layer.
STATIC_TESTS=(
    tests/test_static_cache.py
    tests/test_compile_front.py
    tests/test_bench_static_peers.py
)
STATIC_RELEASE="${SPECDEC_STATIC_RELEASE-5.17.0}"

# Test processes: one per core, at most 4 (each test process runs torch on one thread, tests/conftest.py;
# the tiny models are bound by Python, so a second process nearly halves the time on 2 cores).
# A test file runs whole in one process (--dist loadfile), so module fixtures are built once.
# SPECDEC_TEST_WORKERS=0 runs everything in this process, as plain pytest does.
workers="${SPECDEC_TEST_WORKERS:-$(n=$(nproc 2>/dev/null || echo 1); [ "$n" -gt 4 ] && n=4; echo "$n")}"
parallel=()
if [ "$workers" -gt 1 ]; then
    parallel=(-n "$workers" --dist loadfile)
fi

# run_pytest LABEL PYTHON ARGS...: run pytest, turning "no tests collected" into a failure.
run_pytest() {
    local label=$1 python=$2 status=0
    shift 2
    echo "== $label: $("$python" -c 'import transformers; print("transformers", transformers.__version__)'), $workers test process(es)" >&2
    # --durations: every log names the slowest tests, for keeping the run inside its time budget.
    "$python" -m pytest -q --durations=15 ${parallel[@]+"${parallel[@]}"} "$@" || status=$?
    if [ "$status" -eq 5 ]; then
        echo "== $label: pytest collected no tests, which counts as a failure" >&2
    elif [ "$status" -ne 0 ]; then
        echo "== $label: failed (pytest exit code $status)" >&2
    fi
    return "$status"
}

# present_floor_tests: the engine test files that exist (into the array `present`).
present_floor_tests() {
    present=()
    for file in "${FLOOR_TESTS[@]}"; do
        [ -f "$file" ] && present+=("$file")
    done
}

bash scripts/setup.sh
newest=0
run_pytest "newest" .venv/bin/python "$@" || newest=$?

floor=0
if [ "$#" -gt 0 ]; then
    echo "== floor run skipped: pytest arguments were given" >&2
elif [ "${SPECDEC_SKIP_FLOOR:-0}" = "1" ]; then
    echo "== floor run skipped: SPECDEC_SKIP_FLOOR=1" >&2
else
    present_floor_tests
    if [ "${#present[@]}" -eq 0 ]; then
        echo "== floor: none of the engine test files exist" >&2
        floor=1
    else
        bash scripts/setup.sh --floor
        run_pytest "floor" .venv-floor/bin/python "${RELEASE_DEPENDENT[@]}" "${present[@]}" || floor=$?
    fi
fi

releases=0
if [ "$#" -gt 0 ] && [ -n "${SPECDEC_RELEASES:-}" ]; then
    echo "== release runs skipped: pytest arguments were given" >&2
elif [ -n "${SPECDEC_RELEASES:-}" ]; then
    present_floor_tests
    for release in $SPECDEC_RELEASES; do
        status=0
        bash scripts/setup.sh --release "$release" || status=$?
        if [ "$status" -eq 0 ]; then
            run_pytest "transformers $release" ".venv-$release/bin/python" "${RELEASE_DEPENDENT[@]}" "${present[@]}" \
                || status=$?
        fi
        if [ "$status" -ne 0 ]; then
            releases=1
        fi
    done
fi

static_release=0
if [ "$#" -gt 0 ] || [ "${SPECDEC_SKIP_FLOOR:-0}" = "1" ] || [ -z "$STATIC_RELEASE" ]; then
    echo "== static-path run skipped (pytest arguments, SPECDEC_SKIP_FLOOR=1 or an empty SPECDEC_STATIC_RELEASE)" >&2
else
    bash scripts/setup.sh --release "$STATIC_RELEASE" || static_release=$?
    if [ "$static_release" -eq 0 ]; then
        run_pytest "static path on transformers $STATIC_RELEASE" ".venv-$STATIC_RELEASE/bin/python" \
            "${RELEASE_DEPENDENT[@]}" "${STATIC_TESTS[@]}" || static_release=$?
    fi
fi

rehearsal=0
if [ "$#" -gt 0 ] || [ "${SPECDEC_SKIP_FLOOR:-0}" = "1" ] || [ "${SPECDEC_SKIP_REHEARSAL:-0}" = "1" ]; then
    echo "== GPU check rehearsal skipped (pytest arguments, SPECDEC_SKIP_FLOOR=1 or SPECDEC_SKIP_REHEARSAL=1)" >&2
else
    echo "== GPU check rehearsal: bash scripts/gpu_check.sh --rehearse" >&2
    rm -rf gpu_out/rehearsal
    OUT=gpu_out/rehearsal bash scripts/gpu_check.sh --rehearse || rehearsal=$?
    [ "$rehearsal" -eq 0 ] || echo "== GPU check rehearsal: failed (exit $rehearsal; gpu_out/rehearsal/)" >&2
fi

if [ "$newest" -ne 0 ] || [ "$floor" -ne 0 ] || [ "$releases" -ne 0 ] || [ "$static_release" -ne 0 ] \
        || [ "$rehearsal" -ne 0 ]; then
    echo "== test.sh: FAILED (newest: exit $newest, floor: exit $floor, releases: exit $releases," \
         "static path on $STATIC_RELEASE: exit $static_release, rehearsal: exit $rehearsal)" >&2
    exit 1
fi
