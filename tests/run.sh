#!/bin/bash
# run.sh - run the test binaries: unit tests, then integration tests against a throwaway stack.
#
#   tests/run.sh [unit|integration|all|ha]     (default all; ha: the multi-node tests of tests/ha)
#
# BUILD (default build) holds the test binaries, BIN (default bin) the products.
# Integration tests get a fresh stack (tests/harness/stack.sh) in a temp dir, stopped on
# every exit, and the environment of its DIR/env plus OUTBOX_BIN and OUTBOX_SOURCE_DIR;
# then the tests/deploy scripts (install, package, systemd unit, Prometheus) against it,
# tests/browser (the console in headless Chromium), tests/standards (CloudEvents and
# OpenTelemetry read by their own SDKs) and tests/torture (the short torture pass).
# OUTBOX_VALGRIND, when set, prefixes every test binary (e.g. "valgrind -q ...").
# OUTBOX_TEST_TIMEOUT bounds each binary (seconds, default 900).
# Prints one line per binary and a summary; exits 1 when any failed.
set -u

SOURCE_DIR=$(cd "$(dirname "$0")/.." && pwd)
cd "$SOURCE_DIR" || exit 1
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
WHAT=${1:-all}
TIMEOUT=${OUTBOX_TEST_TIMEOUT:-900}

case "$WHAT" in
unit | integration | all | ha) ;;
*)
    echo "usage: tests/run.sh [unit|integration|all|ha]" >&2
    exit 2
    ;;
esac

passed=0
failed=0
failed_names=""
STACK_DIR=""
TEST_PID=""

now_ms() {
    date +%s%3N
}

# Runs one test binary with its output to the terminal; prints ok/FAILED with its duration.
run_binary() {
    local binary=$1 name start end status
    name=${binary#"$BUILD"/tests/}${2:+[$2]}
    start=$(now_ms)
    # In the background so that a signal to this script is handled at once, not after
    # the test ends (timeout puts the test in its own process group, away from Ctrl-C).
    local prefix=${OUTBOX_VALGRIND:-}
    case "$binary" in *.sh) prefix="" ;; esac # scripts run programs, valgrind runs binaries
    # shellcheck disable=SC2086
    timeout -k 10 "$TIMEOUT" $prefix "$binary" &
    TEST_PID=$!
    wait "$TEST_PID"
    status=$?
    TEST_PID=""
    end=$(now_ms)
    local seconds
    seconds=$(awk -v ms=$((end - start)) 'BEGIN { printf "%.1f", ms / 1000 }')
    if [ "$status" -eq 0 ]; then
        printf 'ok      %-40s %6ss\n' "$name" "$seconds"
        passed=$((passed + 1))
    else
        local why="exit $status"
        [ "$status" -eq 124 ] && why="timed out after ${TIMEOUT}s"
        printf 'FAILED  %-40s %6ss  (%s)\n' "$name" "$seconds" "$why"
        failed=$((failed + 1))
        failed_names="$failed_names $name"
    fi
}

run_dir() {
    local dir=$1 binary found=0
    for binary in "$dir"/test_*; do
        [ -f "$binary" ] && [ -x "$binary" ] || continue
        case "$binary" in *.o | *.d) continue ;; esac
        found=1
        case "$binary" in
        */test_relay_brokers)
            # every scenario times every broker: one run (and one timeout) per broker
            for broker in rabbitmq redis nats kafka; do
                OUTBOX_TEST_FILTER="$broker: *" run_binary "$binary" "$broker"
            done
            ;;
        *) run_binary "$binary" ;;
        esac
    done
    [ "$found" -eq 1 ] || echo "(no test binaries in $dir)"
}

stop_stack() {
    local ha
    if [ -n "$STACK_DIR" ]; then
        "$SOURCE_DIR/tests/harness/stack.sh" stop "$STACK_DIR" || true
        # Redis deployments a test left running (killed at its timeout, say)
        for ha in "$STACK_DIR"/redis-ha-*; do
            [ -d "$ha" ] && "$SOURCE_DIR/tests/harness/redis_ha.sh" stop "$ha" >/dev/null 2>&1
        done
        if [ -n "${OUTBOX_TEST_KEEP:-}" ]; then
            echo "run: kept $STACK_DIR (logs)"
        else
            rm -rf "$STACK_DIR"
        fi
        STACK_DIR=""
    fi
}

on_signal() {
    trap '' INT TERM
    echo "run: interrupted, stopping the test servers" >&2
    if [ -n "$TEST_PID" ]; then
        kill -TERM "$TEST_PID" 2>/dev/null
        wait "$TEST_PID" 2>/dev/null
    fi
    stop_stack
    exit 130
}

trap stop_stack EXIT
trap on_signal INT TERM

if [ "$WHAT" = unit ] || [ "$WHAT" = all ]; then
    echo "== unit tests"
    run_dir "$BUILD/tests/unit"
    if BIN="$BIN" "$SOURCE_DIR/tests/check_docs.sh" >/dev/null; then
        printf 'ok      %-40s\n' "docs: options = --help, HACKING recipes"
        passed=$((passed + 1))
    else
        printf 'FAILED  %-40s\n' "docs: options = --help, HACKING recipes"
        failed=$((failed + 1))
        failed_names="$failed_names check_docs"
    fi
fi

if [ "$WHAT" != unit ]; then
    if [ "$WHAT" = ha ]; then
        echo "== multi-node tests"
    else
        echo "== integration tests"
    fi
    STACK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/outbox-stack.XXXXXX") || exit 1
    stack_start=$(now_ms)
    if ! "$SOURCE_DIR/tests/harness/stack.sh" start "$STACK_DIR"; then
        echo "FAILED  test servers did not start"
        failed=$((failed + 1))
        failed_names="$failed_names stack"
    else
        echo "run: servers up in $(awk -v ms=$(($(now_ms) - stack_start)) 'BEGIN { printf "%.1f", ms / 1000 }')s ($STACK_DIR)"
        set -a
        # shellcheck disable=SC1091
        . "$STACK_DIR/env"
        set +a
        OUTBOX_BIN=$(cd "$BIN" 2>/dev/null && pwd) || OUTBOX_BIN=$SOURCE_DIR/$BIN
        export OUTBOX_BIN
        export OUTBOX_SOURCE_DIR=$SOURCE_DIR
        if [ "$WHAT" = ha ]; then
            run_dir "$BUILD/tests/ha"
        else
            run_dir "$BUILD/tests/integration"
            run_dir tests/deploy
            run_dir tests/browser
            run_dir tests/standards
            run_dir tests/torture
        fi
    fi
    stop_stack
fi

echo "== $passed passed, $failed failed${failed_names:+:$failed_names}"
[ "$failed" -eq 0 ]
