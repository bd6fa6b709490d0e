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
# OUTBOX_TEST_ONLY (entry names as printed, space-separated) runs those alone.
# OUTBOX_TEST_JOBS (default 2) integration tests run side by side, each lane on a stack of
# its own in its own slice of OUTBOX_TEST_PORT_RANGE, so that no two share a server; a test's
# output is printed whole when it ends. The multi-node tests run one at a time.
# Prints one line per binary and a summary; exits 1 when any failed.
set -u

SOURCE_DIR=$(cd "$(dirname "$0")/.." && pwd)
cd "$SOURCE_DIR" || exit 1
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
WHAT=${1:-all}
TIMEOUT=${OUTBOX_TEST_TIMEOUT:-900}
JOBS=${OUTBOX_TEST_JOBS:-2}
PORT_RANGE=${OUTBOX_TEST_PORT_RANGE:-20000-32000}
# The longest tests (over a minute on a quiet 2-core host), started first, longest first, so
# that the lanes end together; the others follow in directory order.
SLOW_FIRST="torture/test_torture.sh integration/test_chaos integration/test_relay_brokers[rabbitmq]
torture/test_mutants.sh integration/test_relay_databases_faults integration/test_metrics_http
integration/test_relay_databases_streams integration/test_relay_databases_tenants
integration/test_relay_brokers[nats] integration/test_relay_databases"

case "$WHAT" in
unit | integration | all | ha) ;;
*)
    echo "usage: tests/run.sh [unit|integration|all|ha]" >&2
    exit 2
    ;;
esac
case "$JOBS" in
[1-9]) ;;
*)
    echo "run: OUTBOX_TEST_JOBS=$JOBS: a number from 1 to 9 expected" >&2
    exit 2
    ;;
esac

# One line per test run: "ok NAME" or "FAILED NAME" (lanes append to it side by side).
RESULTS=$(mktemp "${TMPDIR:-/tmp}/outbox-test-results.XXXXXX") || exit 1
STACK_DIRS=""
LANE_DIR=""
LANE_PIDS=""
TEST_PID=""

now_ms() {
    date +%s%3N
}

# Runs one test binary with its output to the terminal; prints ok/FAILED with its duration.
run_binary() {
    local binary=$1 name start end status
    name=$(entry_name "$binary${2:+ $2}")
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
        echo "ok $name" >>"$RESULTS"
    else
        local why="exit $status"
        [ "$status" -eq 124 ] && why="timed out after ${TIMEOUT}s"
        printf 'FAILED  %-40s %6ss  (%s)\n' "$name" "$seconds" "$why"
        echo "FAILED $name" >>"$RESULTS"
    fi
}

# The name run_binary prints for an entry "PATH[ LABEL]": integration/test_x[label].
entry_name() {
    local name=${1%% *}
    name=${name#"$BUILD"/tests/}
    name=${name#tests/}
    [ "$1" = "${1% *}" ] || name="$name[${1#* }]"
    echo "$name"
}

# Prints the tests of dir, one "PATH[ LABEL]" per run (a label: one broker of
# test_relay_brokers, whose scenarios time every broker, one run and one timeout each);
# only those OUTBOX_TEST_ONLY names (space-separated entry names) when it is set.
list_dir() {
    local dir=$1 binary entry
    for binary in "$dir"/test_*; do
        [ -f "$binary" ] && [ -x "$binary" ] || continue
        case "$binary" in
        *.o | *.d) continue ;;
        */test_relay_brokers) set -- "$binary rabbitmq" "$binary redis" "$binary nats" "$binary kafka" ;;
        *) set -- "$binary" ;;
        esac
        for entry; do
            case " ${OUTBOX_TEST_ONLY:-$(entry_name "$entry")} " in
            *" $(entry_name "$entry") "*) echo "$entry" ;;
            esac
        done
    done
}

# Runs one "PATH[ LABEL]" of list_dir.
run_entry() {
    local binary=${1% *} label=
    [ "$binary" = "$1" ] || label=${1#* }
    if [ -n "$label" ]; then
        OUTBOX_TEST_FILTER="$label: *" run_binary "$binary" "$label"
    else
        run_binary "$binary"
    fi
}

run_dir() {
    local entry found=0
    while read -r entry; do
        found=1
        run_entry "$entry" </dev/null # a test reading its input would eat the list
    done < <(list_dir "$1")
    [ "$found" -eq 1 ] || echo "(no test binaries in $1)"
}

# Starts a stack in dir (its servers' ports in range) and loads its environment.
start_stack() {
    local dir=$1 range=$2 start
    start=$(now_ms)
    STACK_DIRS="$STACK_DIRS $dir"
    OUTBOX_TEST_PORT_RANGE=$range "$SOURCE_DIR/tests/harness/stack.sh" start "$dir" || return 1
    echo "run: servers up in $(awk -v ms=$(($(now_ms) - start)) 'BEGIN { printf "%.1f", ms / 1000 }')s ($dir)"
    set -a
    # shellcheck disable=SC1091
    . "$dir/env"
    set +a
    export OUTBOX_TEST_PORT_RANGE=$range
}

# Lane k's slice (1-based) of PORT_RANGE when it is cut in JOBS.
lane_range() {
    local k=$1 low=${PORT_RANGE%-*} high=${PORT_RANGE#*-} width
    width=$(((high - low + 1) / JOBS))
    echo "$((low + (k - 1) * width))-$((low + k * width - 1))"
}

# Takes the next entry off the lanes' queue: prints it, or fails when none is left.
next_entry() {
    local entry
    {
        flock 8
        entry=$(head -n 1 "$LANE_DIR/queue")
        [ -n "$entry" ] && sed -i 1d "$LANE_DIR/queue"
    } 8>>"$LANE_DIR/queue.lock"
    [ -n "$entry" ] && echo "$entry"
}

# One lane: a stack of its own, then entries off the queue until none is left, each
# test's output printed whole when it ends.
run_lane() {
    local k=$1 entry
    trap '[ -n "$TEST_PID" ] && kill -TERM "$TEST_PID" 2>/dev/null; exit 130' TERM
    if ! start_stack "$LANE_DIR/stack-$k" "$(lane_range "$k")" >"$LANE_DIR/out-$k" 2>&1; then
        cat "$LANE_DIR/out-$k"
        echo "FAILED  the servers of lane $k did not start"
        echo "FAILED stack-$k" >>"$RESULTS"
        return
    fi
    grep '^run: ' "$LANE_DIR/out-$k"
    while entry=$(next_entry); do
        run_entry "$entry" </dev/null >"$LANE_DIR/out-$k" 2>&1
        {
            flock 8
            cat "$LANE_DIR/out-$k"
        } 8>>"$LANE_DIR/print.lock"
    done
}

# Every integration test, the slow ones first, over JOBS lanes.
run_lanes() {
    local dir entry k slow
    LANE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/outbox-lanes.XXXXXX") || exit 1
    chmod 0755 "$LANE_DIR" # the servers' users reach their stacks in it
    for dir in "$BUILD/tests/integration" tests/deploy tests/browser tests/standards tests/torture; do
        list_dir "$dir"
    done >"$LANE_DIR/all"
    for slow in $SLOW_FIRST; do
        while read -r entry; do
            [ "$(entry_name "$entry")" = "$slow" ] && echo "$entry"
        done <"$LANE_DIR/all"
    done >"$LANE_DIR/queue"
    grep -vxF -f "$LANE_DIR/queue" "$LANE_DIR/all" >>"$LANE_DIR/queue"
    echo "run: $(wc -l <"$LANE_DIR/queue") tests in $JOBS lanes, each on servers of its own"
    for ((k = 1; k <= JOBS; k++)); do
        run_lane "$k" &
        LANE_PIDS="$LANE_PIDS $!"
    done
    wait
    LANE_PIDS=""
}

stop_stacks() {
    local dir ha
    for dir in $STACK_DIRS ${LANE_DIR:+"$LANE_DIR"/stack-*}; do
        [ -d "$dir" ] || continue
        "$SOURCE_DIR/tests/harness/stack.sh" stop "$dir" || true
        # Redis deployments a test left running (killed at its timeout, say)
        for ha in "$dir"/redis-ha-*; do
            [ -d "$ha" ] && "$SOURCE_DIR/tests/harness/redis_ha.sh" stop "$ha" >/dev/null 2>&1
        done
        if [ -n "${OUTBOX_TEST_KEEP:-}" ]; then
            echo "run: kept $dir (logs)"
        else
            rm -rf "$dir"
        fi
    done
    STACK_DIRS=""
    [ -n "$LANE_DIR" ] && [ -z "${OUTBOX_TEST_KEEP:-}" ] && rm -rf "$LANE_DIR"
    LANE_DIR=""
}

on_signal() {
    trap '' INT TERM
    echo "run: interrupted, stopping the test servers" >&2
    if [ -n "$TEST_PID$LANE_PIDS" ]; then
        # shellcheck disable=SC2086
        kill -TERM $TEST_PID $LANE_PIDS 2>/dev/null
        wait 2>/dev/null
    fi
    stop_stacks
    exit 130
}

trap 'stop_stacks; rm -f "$RESULTS"' EXIT
trap on_signal INT TERM

if [ "$WHAT" = unit ] || [ "$WHAT" = all ]; then
    echo "== unit tests"
    run_dir "$BUILD/tests/unit"
    if BIN="$BIN" "$SOURCE_DIR/tests/check_docs.sh" >/dev/null; then
        printf 'ok      %-40s\n' "docs: options = --help, HACKING recipes"
        echo "ok check_docs" >>"$RESULTS"
    else
        printf 'FAILED  %-40s\n' "docs: options = --help, HACKING recipes"
        echo "FAILED check_docs" >>"$RESULTS"
    fi
fi

if [ "$WHAT" != unit ]; then
    if [ "$WHAT" = ha ]; then
        echo "== multi-node tests"
    else
        echo "== integration tests"
    fi
    OUTBOX_BIN=$(cd "$BIN" 2>/dev/null && pwd) || OUTBOX_BIN=$SOURCE_DIR/$BIN
    export OUTBOX_BIN
    export OUTBOX_SOURCE_DIR=$SOURCE_DIR
    if [ "$WHAT" != ha ] && [ "$JOBS" -gt 1 ]; then
        run_lanes
    elif ! start_stack "$(mktemp -d "${TMPDIR:-/tmp}/outbox-stack.XXXXXX")" "$PORT_RANGE"; then
        echo "FAILED  test servers did not start"
        echo "FAILED stack" >>"$RESULTS"
    elif [ "$WHAT" = ha ]; then
        run_dir "$BUILD/tests/ha"
    else
        for dir in "$BUILD/tests/integration" tests/deploy tests/browser tests/standards tests/torture; do
            run_dir "$dir"
        done
    fi
    stop_stacks
fi

passed=$(grep -c '^ok ' "$RESULTS")
failed_names=$(sed -n 's/^FAILED / /p' "$RESULTS" | tr -d '\n')
failed=$(grep -c '^FAILED ' "$RESULTS")
echo "== $passed passed, $failed failed${failed_names:+:$failed_names}"
[ "$failed" -eq 0 ]
