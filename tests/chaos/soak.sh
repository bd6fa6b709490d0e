#!/bin/bash
# soak.sh - the chaos driver for a long run on a throwaway stack (make soak).
#
#   SOAK_SECONDS=600 tests/chaos/soak.sh
#
# Runs build/tests/integration/test_chaos with faults for SOAK_SECONDS per broker
# (OUTBOX_CHAOS_BROKERS picks rabbitmq, redis or both) and OUTBOX_CHAOS_SOAK=1, so the
# verdict also fails when the long-lived relay's RSS or open descriptors grow steadily.
# The samples (run, seconds, RSS KiB, fds) go to $BUILD/soak-samples.txt.
set -u

SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
cd "$SOURCE_DIR" || exit 1
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
STACK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/outbox-soak.XXXXXX") || exit 1

stop_stack() {
    "$SOURCE_DIR/tests/harness/stack.sh" stop "$STACK_DIR" || true
    if [ -n "${OUTBOX_TEST_KEEP:-}" ]; then
        echo "soak: kept $STACK_DIR (logs)"
    else
        rm -rf "$STACK_DIR"
    fi
}
trap stop_stack EXIT
trap 'exit 130' INT TERM

"$SOURCE_DIR/tests/harness/stack.sh" start "$STACK_DIR" postgres rabbitmq redis || exit 1
set -a
# shellcheck disable=SC1091
. "$STACK_DIR/env"
set +a
OUTBOX_BIN=$(cd "$BIN" && pwd) || exit 1
export OUTBOX_BIN OUTBOX_SOURCE_DIR=$SOURCE_DIR
export OUTBOX_CHAOS_SECONDS=${SOAK_SECONDS:-600} OUTBOX_CHAOS_SOAK=1
export OUTBOX_CHAOS_SAMPLES=$SOURCE_DIR/$BUILD/soak-samples.txt
rm -f "$OUTBOX_CHAOS_SAMPLES"
"$BUILD/tests/integration/test_chaos"
