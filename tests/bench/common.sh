# common.sh - what the bench scripts share; sourced, never run. Before sourcing, set
# BENCH_NAME (the prefix of progress lines), ROOT (the source tree) and STEP_TIMEOUT.
#
#   bench_stack VAR                PostgreSQL + Redis: the stack whose env file $VAR names
#                                  (one already running, as make bench's), or a throwaway
#                                  one of its own, stopped on exit; sources its env
#   bench_database NAME            a fresh, migrated database NAME on that stack: sets DB
#   bench_on_exit COMMAND          also runs COMMAND at exit (before the stack stops)
# and log, die, calc, median, runs, result, sql (psql on $DB) and redis_cli.

log() { printf '%s bench: %s\n' "$BENCH_NAME" "$*" >&2; }
die() {
    printf '%s bench: error: %s\n' "$BENCH_NAME" "$*" >&2
    exit 1
}
calc() { awk "BEGIN { printf \"%s\", $1 }" </dev/null; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
runs() { printf "${RUNS_FORMAT:-%.1f} " "$@" | sed 's/ $//; s/ /, /g'; }
result() { printf '  %-58s %16s  %s\n' "$1" "$2" "${3:-}"; }

BENCH_OWN_STACK="" BENCH_AT_EXIT=""
bench_on_exit() { BENCH_AT_EXIT="${BENCH_AT_EXIT}$1;"; }
bench_cleanup() {
    eval "$BENCH_AT_EXIT" || true
    if [ -n "$BENCH_OWN_STACK" ]; then
        "$ROOT/tests/harness/stack.sh" stop "$BENCH_OWN_STACK" >/dev/null 2>&1 || true
        rm -rf "$BENCH_OWN_STACK"
    fi
}
trap bench_cleanup EXIT

bench_stack() {
    local env_file=${!1:-}

    if [ -z "$env_file" ]; then
        BENCH_OWN_STACK=$(mktemp -d "/tmp/outbox-$BENCH_NAME-bench.XXXXXX")
        log "starting PostgreSQL and Redis in $BENCH_OWN_STACK"
        "$ROOT/tests/harness/stack.sh" start "$BENCH_OWN_STACK" postgres redis \
            >"$BENCH_OWN_STACK/stack.log" 2>&1 ||
            die "the stack did not start (see $BENCH_OWN_STACK/stack.log)"
        env_file=$BENCH_OWN_STACK/env
    fi
    # shellcheck disable=SC1090
    . "$env_file"
    STACK=$OUTBOX_TEST_STACK_DIR
}

bench_database() {
    DB="${OUTBOX_TEST_PG_URL%/*}/$1"
    psql -X -q "$OUTBOX_TEST_PG_URL" -c "DROP DATABASE IF EXISTS $1" >/dev/null
    psql -X -q -v ON_ERROR_STOP=1 "$OUTBOX_TEST_PG_URL" -c "CREATE DATABASE $1" >/dev/null
    "$BIN/outboxctl" --database-url "$DB" migrate >/dev/null
}

sql() { timeout "$STEP_TIMEOUT" psql -X -qAt -v ON_ERROR_STOP=1 "$DB" -c "$1"; }
redis_cli() {
    REDISCLI_AUTH=${OUTBOX_TEST_REDIS_PASSWORD:-} redis-cli -h 127.0.0.1 \
        -p "$OUTBOX_TEST_REDIS_PORT" "$@"
}
