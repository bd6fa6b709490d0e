#!/bin/bash
# run.sh - the benchmark behind `make bench` (CONTRACT.md section 7).
#
# Starts throwaway PostgreSQL, RabbitMQ, Redis and Kafka servers in a temp dir
# (tests/harness/stack.sh), stops them on every exit path, and measures in one
# run, with the same ~200 byte JSON payload throughout:
#
#   1. enqueue rows/s: single-row transactions from 16 pgbench clients through
#      outbox.enqueue() and through a bare INSERT (their ratio); 1000 rows per
#      statement through outbox.enqueue_batch(), a bare INSERT ... SELECT
#      (their ratio) and 1000 outbox.enqueue() calls
#   2. commit -> publish latency at a steady offered load (relay to Redis):
#      1000 rows/s of single-row transactions, and 5000 rows/s as 1000
#      transactions/s of 5 rows through outbox.enqueue_batch(); the 1000 rows/s
#      also with BENCH_CLEANUP_N (500 000) succeeded rows past --retention
#      waiting for the relay's cleanup meanwhile
#   3. the ceilings: claim + complete in PostgreSQL alone (store library),
#      also with pauses of other queues and keys in place,
#      publish with confirms to RabbitMQ, pipelined XADD to Redis, an idempotent
#      acks=all librdkafka producer to Kafka (tests/tools/kafka_throughput); and the
#      relay's RabbitMQ sink alone, without a database
#   4. drain rows/s of a backlog of BENCH_N rows by `outbox-relay --once` to
#      Redis (with --on-success mark, the default, and delete), to RabbitMQ and to Kafka
#      (also from a stream queue of 4 partitions, docs/stream.md),
#      checked row by row and message by message, with the relay's max RSS and
#      PostgreSQL's CPU time per relayed row (utime + stime of the server's
#      processes from /proc, the exited ones through the postmaster's cutime);
#      the relay's cleanup capacity (rows/s deleted of BENCH_CLEANUP_N succeeded
#      rows past --retention)
#   5. claim latency against a growing ready backlog, table and index sizes
#   6. claim latency with ordering keys
#   7. a consumer's transaction with and without outbox.inbox_accept()
#   8. long-run health, short: tests/bench/longrun.sh steady (BENCH_LONGRUN_SECONDS,
#      default 120, at 5 000 rows/s with --retention 1m) and horizon (a
#      transaction open for 60 s); their pass lines are reported, not enforced
#      (make soak runs the 10-minute version and fails on them)
#   9. the console: every page and GET of the API timed at 1 000 000 rows /
#      1 000 queues, and a small request beside overviews (tests/bench/console.sh)
#  10. NATS JetStream: the raw async publisher ceiling (tools/nats_bench, one
#      connection, window 4096, the same payload and stream) and the relay's
#      drain of BENCH_N rows to that stream (row-state, and from a stream queue
#      of 4 partitions), in turns, with PostgreSQL's CPU
#      per relayed row (skipped when the stack has no nats)
#  11. stream mode against row-state (tests/bench/stream.sh): PostgreSQL CPU per
#      relayed row, the drain to Redis, the enqueue cost of recording the xid
#  12. the drain to Redis with --cloudevents binary and with a span per message at
#      100 % sampling against a collector, each against the drain without
#      (tests/bench/standards.sh)
#
# The host is shared and one run of a step can be 20 % off the next, so the
# single-row and bulk enqueue, the latency, the ceilings and the drains run
# BENCH_ROUNDS times each, in turns, and their medians are reported.
#
# Environment: BUILD, BIN (as make sets them), BENCH_N (rows, default 100000),
# BENCH_BIG=1 (adds a 10M-row step to the claim scaling), BENCH_SECONDS
# (pgbench duration, default 10), BENCH_LATENCY_SECONDS (default 15),
# BENCH_LATENCY_RATES (rows/s, default "1000 5000"; up to 1000 as single-row
# transactions, above that 5 rows per transaction), BENCH_ROUNDS (default 3),
# BENCH_CLEANUP_N (default 500000), BENCH_FULL_ROWS (succeeded rows under the
# keyed enqueue step of 1, default 1000000), BENCH_LONGRUN_SECONDS (default 120; 0 skips 8),
# OUTBOX_BENCH_STACK_SH (another
# stack.sh). Results are printed and written to $BUILD/bench/results.txt.
# A measuring script: it fails only when a step fails or a check of the
# delivered rows does not hold, never because a figure is low.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
TOOLS="$BUILD/tests/tools"
STACK_SH=${OUTBOX_BENCH_STACK_SH:-$ROOT/tests/harness/stack.sh}
PG_BIN=${OUTBOX_PG_BIN:-/usr/lib/postgresql/15/bin}

N=${BENCH_N:-100000}
BIG=${BENCH_BIG:-0}
PGBENCH_SECONDS=${BENCH_SECONDS:-10}
LATENCY_SECONDS=${BENCH_LATENCY_SECONDS:-15}
LATENCY_RATES=${BENCH_LATENCY_RATES:-${BENCH_LATENCY_RATE:-1000 5000}}
ROUNDS=${BENCH_ROUNDS:-3}
CLEANUP_N=${BENCH_CLEANUP_N:-500000}
LONGRUN_SECONDS=${BENCH_LONGRUN_SECONDS:-120}
STEP_TIMEOUT=600 # no single step may take longer (seconds)
RESULTS_FILE="$BUILD/bench/results.txt"

BENCH_START=$(date +%s)
log() { printf 'bench: [%4ds] %s\n' "$(($(date +%s) - BENCH_START))" "$*" >&2; }
die() {
    printf 'bench: error: %s\n' "$*" >&2
    exit 1
}

case "$N" in '' | *[!0-9]*) die "BENCH_N must be a positive integer, got '$N'" ;; esac
case "$ROUNDS" in '' | *[!0-9]* | 0) die "BENCH_ROUNDS must be a positive integer, got '$ROUNDS'" ;; esac
[ "$N" -gt 0 ] || die "BENCH_N must be positive"
for program in "$BIN/outbox-relay" "$BIN/outboxctl" "$TOOLS/outbox_bench" "$TOOLS/nats_bench" \
    "$TOOLS/outbox_producer" "$TOOLS/outbox_consumer" "$TOOLS/kafka_throughput" "$PG_BIN/pgbench" \
    /usr/bin/time; do
    [ -x "$program" ] || die "missing $program (run 'make bench')"
done
[ -x "$STACK_SH" ] || die "missing $STACK_SH (the test harness)"
command -v redis-cli >/dev/null || die "missing redis-cli"

STACK=$(mktemp -d /tmp/outbox-bench.XXXXXX)
chmod 755 "$STACK"
RELAY_PID=""
cleanup() {
    local status=$?
    if [ -n "$RELAY_PID" ]; then
        kill -TERM "$RELAY_PID" 2>/dev/null || true
        wait "$RELAY_PID" 2>/dev/null || true
    fi
    "$STACK_SH" stop "$STACK" >/dev/null 2>&1 || log "stopping the stack in $STACK failed"
    rm -rf "$STACK"
    [ "$status" = 0 ] || log "failed (exit $status); partial results above"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- helpers ------------------------------------------------------------------

# One SQL command on the bench database, unaligned tuples only, bounded.
sql() { timeout "$STEP_TIMEOUT" psql -X -qAt -v ON_ERROR_STOP=1 "$DB" -c "$1"; }

now() { date +%s.%N; }

# calc EXPR: floating point arithmetic with awk.
calc() { awk "BEGIN { printf \"%s\", $1 }" </dev/null; }

# field KEY LINE: the value of KEY=value in a tool's output line.
field() { printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }

RESULTS="$STACK/results"
: >"$RESULTS"
# result LABEL VALUE [NOTE]: one line of the final table.
result() {
    printf '  %-58s %16s  %s\n' "$1" "$2" "${3:-}" >>"$RESULTS"
    printf 'bench:   %s: %s %s\n' "$1" "$2" "${3:-}" >&2
}
section() { printf '\n%s\n' "$1" >>"$RESULTS"; }

# A payload of exactly 200 bytes of JSON (the pad makes up the length).
PAYLOAD_HEAD='{"order_id": 1234567, "event": "order.created", "customer": "c-0004711", "amount_cents": 129900, "currency": "EUR", "items": [{"sku": "sku-01", "qty": 2}], "pad": "'
PAD_LENGTH=$((200 - ${#PAYLOAD_HEAD} - 2))
PAYLOAD="$PAYLOAD_HEAD$(printf '%*s' "$PAD_LENGTH" '' | tr ' ' x)\"}"
PAYLOAD_BYTES=${#PAYLOAD}

# reset: an empty outbox.job, flushed, so one step does not tax the next.
reset_outbox() {
    sql "TRUNCATE outbox.job" >/dev/null
    sql "CHECKPOINT" >/dev/null
}

# fill ROWS [QUEUE]: a ready backlog, inserted in one statement, then analyzed.
fill() {
    local rows=$1 queue=${2:-bench}
    sql "INSERT INTO outbox.job (queue, payload)
         SELECT '$queue', '$PAYLOAD'::jsonb FROM generate_series(1, $rows)" >/dev/null
    sql "VACUUM ANALYZE outbox.job" >/dev/null
    sql "CHECKPOINT" >/dev/null
}

# fill_old_succeeded ROWS: succeeded rows finished two hours ago (queue old), analyzed
fill_old_succeeded() {
    sql "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)
         SELECT 'old', '$PAYLOAD'::jsonb, 'succeeded', 1, now() - interval '2 hours'
         FROM generate_series(1, $1)" >/dev/null
    sql "VACUUM ANALYZE outbox.job" >/dev/null
    sql "CHECKPOINT" >/dev/null
}

sizes() {
    sql "SELECT pg_size_pretty(pg_table_size('outbox.job')) || ' table + ' ||
                pg_size_pretty(pg_indexes_size('outbox.job')) || ' indexes'"
}

# pgbench_rate SCRIPT CLIENTS ROWS_PER_TRANSACTION: rows/s of one pgbench run.
pgbench_rate() {
    local script=$1 clients=$2 rows=$3 out tps
    out=$(timeout $((PGBENCH_SECONDS + 120)) "$PG_BIN/pgbench" -n -c "$clients" -j 2 \
        -T "$PGBENCH_SECONDS" -f "$script" "$DB" 2>&1) || {
        printf '%s\n' "$out" >&2
        die "pgbench $(basename "$script") failed"
    }
    tps=$(printf '%s\n' "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1)
    [ -n "$tps" ] || die "pgbench $(basename "$script") printed no tps"
    calc "$tps * $rows"
}

# relay_once BROKER_URL NAME [OPTIONS...]: times `outbox-relay --once` from
# start to exit; sets DRAIN_SECONDS, DRAIN_RSS_KB and DRAIN_PG_TICKS
# (PostgreSQL's CPU during the drain).
relay_once() {
    local broker=$1 name=$2 start end status ticks
    shift 2
    ticks=$(pg_cpu_ticks)
    start=$(now)
    set +e
    /usr/bin/time -v -o "$STACK/time-$name" timeout "$STEP_TIMEOUT" \
        "$BIN/outbox-relay" --database-url "$DB" --broker "$broker" --metrics-addr off \
        --log-level warn --once "$@" 2>"$STACK/relay-$name.log"
    status=$?
    set -e
    end=$(now)
    if [ "$status" != 0 ]; then
        tail -n 20 "$STACK/relay-$name.log" >&2
        die "outbox-relay --once to $name exited with $status"
    fi
    DRAIN_SECONDS=$(calc "$end - $start")
    sleep 0.2 # the postmaster reaps the relay's backends
    DRAIN_PG_TICKS=$(($(pg_cpu_ticks) - ticks))
    DRAIN_RSS_KB=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$STACK/time-$name")
}

# pg_cpu_ticks: CPU clock ticks (user + system) PostgreSQL has used so far:
# the postmaster and its live children, plus the children it has reaped
# (cutime + cstime), so backends that exit during a step still count.
CLOCK_TICKS=$(getconf CLK_TCK)
pg_cpu_ticks() {
    local postmaster child
    postmaster=$(head -n 1 "$STACK/pg/postmaster.pid")
    {
        awk '{ print $14 + $15 + $16 + $17 }' "/proc/$postmaster/stat"
        for child in $(ps -o pid= --ppid "$postmaster"); do
            awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || true
        done
    } | awk '{ sum += $1 } END { print sum }'
}

# pg_cpu_us_per_row TICKS_BEFORE TICKS_AFTER ROWS: microseconds of PostgreSQL CPU per row.
pg_cpu_us_per_row() { calc "($2 - $1) * 1000000 / $CLOCK_TICKS / $3"; }

# check_succeeded ROWS: every row of the backlog is succeeded.
check_succeeded() {
    local counts
    counts=$(sql "SELECT count(*) FILTER (WHERE state = 'succeeded') || ' ' || count(*)
                  FROM outbox.job")
    [ "$counts" = "$1 $1" ] ||
        die "expected $1 succeeded rows of $1, the database has (succeeded total): $counts"
}

# median V1 V2 ...: the middle value (the lower middle for an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# runs V1 V2 ...: the single runs, rounded, for the note.
runs() { printf '%.0f ' "$@" | sed 's/ $//; s/ /, /g'; }
rate() { calc "$1 / $2"; }
ratio() { calc "$1 / $2"; }
fmt_rate() { printf '%.0f' "$1"; }

# ---- the stack ----------------------------------------------------------------

log "starting PostgreSQL, RabbitMQ, Redis and Kafka in $STACK"
timeout "$STEP_TIMEOUT" "$STACK_SH" start "$STACK" >"$STACK/stack.log" 2>&1 || {
    cat "$STACK/stack.log" >&2
    die "the stack did not start"
}
# shellcheck disable=SC1091
. "$STACK/env"
DB="${OUTBOX_TEST_PG_URL%/*}/outbox_bench"
REDIS_URL=$OUTBOX_TEST_REDIS_URL
AMQP_URL=$OUTBOX_TEST_AMQP_URL
psql -X -q -v ON_ERROR_STOP=1 "$OUTBOX_TEST_PG_URL" -c "CREATE DATABASE outbox_bench" >/dev/null
"$BIN/outboxctl" --database-url "$DB" migrate >/dev/null
redis_cli() {
    REDISCLI_AUTH=${OUTBOX_TEST_REDIS_PASSWORD:-} redis-cli -h 127.0.0.1 \
        -p "$OUTBOX_TEST_REDIS_PORT" "$@"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
[ -n "$CPU_MODEL" ] || CPU_MODEL=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
MEMORY=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
PG_VERSION=$(sql "SHOW server_version")
PG_SETTINGS=$(sql "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)
                   FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers')")
REDIS_VERSION=$(redis_cli INFO server | sed -n 's/^redis_version:\([^\r]*\).*/\1/p')
RABBIT_VERSION=$(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo unknown)

# ---- 1. enqueue ------------------------------------------------------------------

section "1. enqueue (pgbench, ${PGBENCH_SECONDS}s each, ${PAYLOAD_BYTES} byte payload; single rows: median of $ROUNDS runs taken in turns)"
printf "SELECT outbox.enqueue('bench_enqueue', '%s'::jsonb);\n" "$PAYLOAD" >"$STACK/enqueue.sql"
printf "INSERT INTO outbox.job (queue, payload) VALUES ('bench_enqueue', '%s'::jsonb);\n" \
    "$PAYLOAD" >"$STACK/insert.sql"
printf "SELECT count(outbox.enqueue('bench_enqueue', '%s'::jsonb)) FROM generate_series(1, 1000);\n" \
    "$PAYLOAD" >"$STACK/enqueue-batch.sql"
printf "INSERT INTO outbox.job (queue, payload) SELECT 'bench_enqueue', '%s'::jsonb FROM generate_series(1, 1000);\n" \
    "$PAYLOAD" >"$STACK/insert-batch.sql"
printf "SELECT cardinality(outbox.enqueue_batch('bench_enqueue', array_fill('%s'::jsonb, ARRAY[1000])));\n" \
    "$PAYLOAD" >"$STACK/enqueue-bulk.sql"
printf "SELECT cardinality(outbox.enqueue_batch('bench_enqueue', array_fill('%s'::jsonb, ARRAY[1000]), ordering_keys => ARRAY(SELECT 'key-' || (g %% 10) FROM generate_series(1, 1000) AS g)));\n" \
    "$PAYLOAD" >"$STACK/enqueue-bulk-keyed.sql"

ENQUEUE_RUNS=() INSERT_RUNS=()
for round in $(seq 1 "$ROUNDS"); do
    log "enqueue: single-row transactions, 16 clients, round $round of $ROUNDS"
    reset_outbox
    ENQUEUE_RUNS+=("$(pgbench_rate "$STACK/enqueue.sql" 16 1)")
    reset_outbox
    INSERT_RUNS+=("$(pgbench_rate "$STACK/insert.sql" 16 1)")
done
ENQUEUE_RATE=$(median "${ENQUEUE_RUNS[@]}")
INSERT_RATE=$(median "${INSERT_RUNS[@]}")
result "1 row/txn, 16 clients, SELECT outbox.enqueue()" "$(fmt_rate "$ENQUEUE_RATE") rows/s" \
    "$(printf '%.2f' "$(ratio "$ENQUEUE_RATE" "$INSERT_RATE")") of a bare INSERT (goal >= 0.90); median of runs $(runs "${ENQUEUE_RUNS[@]}")"
result "1 row/txn, 16 clients, bare INSERT INTO outbox.job" "$(fmt_rate "$INSERT_RATE") rows/s" \
    "median of runs $(runs "${INSERT_RUNS[@]}")"
BULK_RUNS=() BATCH_INSERT_RUNS=()
for round in $(seq 1 "$ROUNDS"); do
    log "enqueue: 1000 rows per statement, 4 clients, round $round of $ROUNDS"
    reset_outbox
    BULK_RUNS+=("$(pgbench_rate "$STACK/enqueue-bulk.sql" 4 1000)")
    reset_outbox
    BATCH_INSERT_RUNS+=("$(pgbench_rate "$STACK/insert-batch.sql" 4 1000)")
done
BULK_RATE=$(median "${BULK_RUNS[@]}")
BATCH_INSERT_RATE=$(median "${BATCH_INSERT_RUNS[@]}")
log "enqueue: 1000 rows over 10 ordering keys per statement, 4 clients"
reset_outbox
KEYED_RATE=$(pgbench_rate "$STACK/enqueue-bulk-keyed.sql" 4 1000)
log "enqueue: 1000 outbox.enqueue() calls per statement, 4 clients"
reset_outbox
BATCH_RATE=$(pgbench_rate "$STACK/enqueue-batch.sql" 4 1000)
result "1000 rows/stmt, 4 clients, outbox.enqueue_batch()" "$(fmt_rate "$BULK_RATE") rows/s" \
    "$(printf '%.2f' "$(ratio "$BULK_RATE" "$BATCH_INSERT_RATE")") of a bare INSERT ... SELECT (goal >= 0.80); median of runs $(runs "${BULK_RUNS[@]}")"
result "1000 rows/stmt, 4 clients, bare INSERT ... SELECT" "$(fmt_rate "$BATCH_INSERT_RATE") rows/s" \
    "median of runs $(runs "${BATCH_INSERT_RUNS[@]}")"
result "  the same, 10 ordering keys (990 rows held per statement)" "$(fmt_rate "$KEYED_RATE") rows/s" \
    "$(printf '%.2f' "$(ratio "$KEYED_RATE" "$BULK_RATE")") of outbox.enqueue_batch() without keys; one run"
result "1000 rows/stmt, 4 clients, outbox.enqueue() per row" "$(fmt_rate "$BATCH_RATE") rows/s" \
    "$(printf '%.2f' "$(ratio "$BATCH_RATE" "$BATCH_INSERT_RATE")") of a bare INSERT ... SELECT; one run"

# Keyed and unkeyed enqueue_batch() with the table full of succeeded rows of the
# same queue and keys: the insert guard must not read them (migration 008). The
# rows a run adds are deleted before the next, the full table stays.
FULL_ROWS=${BENCH_FULL_ROWS:-1000000}
log "enqueue: filling outbox.job with $FULL_ROWS succeeded rows over 10 ordering keys"
reset_outbox
sql "INSERT INTO outbox.job (queue, payload, ordering_key, state, attempts, finished_at)
     SELECT 'bench_enqueue', '$PAYLOAD'::jsonb, 'key-' || (g % 10), 'succeeded', 1,
            now() - interval '2 hours'
     FROM generate_series(1, $FULL_ROWS) AS g" >/dev/null
sql "VACUUM ANALYZE outbox.job" >/dev/null
drop_new_rows() {
    sql "DELETE FROM outbox.job WHERE state <> 'succeeded'" >/dev/null
    sql "VACUUM ANALYZE outbox.job" >/dev/null
}
FULL_BULK_RUNS=() FULL_KEYED_RUNS=()
for round in $(seq 1 "$ROUNDS"); do
    log "enqueue: keyed and unkeyed batches at $FULL_ROWS rows, round $round of $ROUNDS"
    FULL_BULK_RUNS+=("$(pgbench_rate "$STACK/enqueue-bulk.sql" 4 1000)")
    drop_new_rows
    FULL_KEYED_RUNS+=("$(pgbench_rate "$STACK/enqueue-bulk-keyed.sql" 4 1000)")
    drop_new_rows
done
FULL_BULK_RATE=$(median "${FULL_BULK_RUNS[@]}")
FULL_KEYED_RATE=$(median "${FULL_KEYED_RUNS[@]}")
result "  the same at $FULL_ROWS succeeded rows, no keys, as the owner" "$(fmt_rate "$FULL_BULK_RATE") rows/s" \
    "median of runs $(runs "${FULL_BULK_RUNS[@]}")"
result "  the same at $FULL_ROWS succeeded rows, 10 ordering keys, as the owner" "$(fmt_rate "$FULL_KEYED_RATE") rows/s" \
    "$(printf '%.2f' "$(ratio "$FULL_KEYED_RATE" "$FULL_BULK_RATE")") of the unkeyed batch (goal >= 0.50); median of runs $(runs "${FULL_KEYED_RUNS[@]}")"
reset_outbox

# ---- 2. latency -------------------------------------------------------------------------

# latency_round N RATE [cleanup]: one steady run of RATE rows/s with the relay
# in the background; appends its figures to the L_* arrays. It runs before the
# drains, while RabbitMQ has no backlog to clean up in the background. With
# "cleanup", CLEANUP_N succeeded rows past --retention (1h) wait for the relay's
# cleanup while the load runs, and the figures go to the C_* arrays instead.
latency_round() {
    local round=$1 rate=$2 mode=${3:-} out rows count b50 b99 bmax f50 f99 fmax
    local script=latency-load.sql transactions=$rate level=warn
    if [ "$rate" -gt 1000 ]; then
        script=latency-load-5.sql
        transactions=$((rate / 5))
    fi
    reset_outbox
    if [ "$mode" = cleanup ]; then
        fill_old_succeeded "$CLEANUP_N"
        level=info # the cleanup's log line says how long it took
    fi
    "$BIN/outbox-relay" --database-url "$DB" --broker "$REDIS_URL" \
        --stream-prefix "latency$round:" --metrics-addr off --log-level "$level" \
        --retention 1h 2>"$STACK/relay-latency.log" &
    RELAY_PID=$!
    sleep 1
    kill -0 "$RELAY_PID" 2>/dev/null || {
        cat "$STACK/relay-latency.log" >&2
        die "the relay did not start"
    }
    # pgbench -R schedules transactions at the given mean rate (Poisson arrivals)
    out=$(timeout $((LATENCY_SECONDS + 120)) "$PG_BIN/pgbench" -n -c 16 -j 2 -R "$transactions" \
        -T "$LATENCY_SECONDS" -f "$STACK/$script" "$DB" 2>&1) || {
        printf '%s\n' "$out" >&2
        die "pgbench at $rate rows/s failed"
    }
    rows=$(sql "SELECT count(*) FROM outbox.job WHERE queue = 'latency'")
    for _ in $(seq 1 600); do
        [ "$(sql "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'")" = 0 ] && break
        sleep 0.1
    done
    kill -TERM "$RELAY_PID"
    wait "$RELAY_PID" || die "the background relay exited with $?"
    RELAY_PID=""
    [ "$(sql "SELECT count(*) FILTER (WHERE state = 'succeeded') || ' ' || count(*)
              FROM outbox.job WHERE queue = 'latency'")" = "$rows $rows" ] ||
        die "not every latency row succeeded"
    "$TOOLS/outbox_bench" stream-times --broker "$REDIS_URL" --stream "latency$round:latency" \
        >"$STACK/stream-times" 2>/dev/null || die "reading the stream's entry ids failed"
    redis_cli DEL "latency$round:latency" >/dev/null
    IFS='|' read -r count b50 b99 bmax f50 f99 fmax < <(timeout "$STEP_TIMEOUT" \
        psql -X -qAt -v ON_ERROR_STOP=1 "$DB" -f "$STACK/latency.sql")
    [ "$count" = "$rows" ] || die "the stream holds $count of the $rows latency rows"
    if [ "$mode" = cleanup ]; then
        C_B50+=("$b50") C_B99+=("$b99") C_BMAX+=("$bmax")
        C_LEFT+=("$(sql "SELECT count(*) FROM outbox.job WHERE queue = 'old'")")
        C_SECONDS+=("$(sed -n 's/.*deleted old succeeded rows.*seconds=\([0-9.]*\).*/\1/p' \
            "$STACK/relay-latency.log" | head -n 1)")
        return
    fi
    L_OFFERED+=("$(calc "$(printf '%s\n' "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1) * $rate / $transactions")")
    L_LAG+=("$(printf '%s\n' "$out" | sed -n 's/^rate limit schedule lag: avg [0-9.]* (max \([0-9.]*\)) ms/\1/p')")
    L_ROWS+=("$rows") L_B50+=("$b50") L_B99+=("$b99") L_BMAX+=("$bmax")
    L_F50+=("$f50") L_F99+=("$f99")
}

sed 's/bench_enqueue/latency/' "$STACK/enqueue.sql" >"$STACK/latency-load.sql"
printf "SELECT cardinality(outbox.enqueue_batch('latency', array_fill('%s'::jsonb, ARRAY[5])));\n" \
    "$PAYLOAD" >"$STACK/latency-load-5.sql"
cat >"$STACK/latency.sql" <<EOF
CREATE TEMP TABLE received (job_id bigint, received_ms bigint);
\\copy received FROM '$STACK/stream-times' WITH (DELIMITER ' ')
WITH l AS (
    SELECT extract(epoch FROM j.finished_at - j.created_at) * 1000 AS to_finished,
           r.received_ms - extract(epoch FROM j.created_at) * 1000 AS to_broker
    FROM outbox.job j LEFT JOIN received r USING (job_id)
    WHERE j.queue = 'latency'
)
SELECT count(to_broker),
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY to_broker)::numeric, 1),
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY to_broker)::numeric, 1),
       round(max(to_broker)::numeric, 1),
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY to_finished)::numeric, 1),
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY to_finished)::numeric, 1),
       round(max(to_finished)::numeric, 1)
FROM l;
EOF
joined() { printf '%s, ' "$@" | sed 's/, $//'; }
section "2. commit -> publish latency for ${LATENCY_SECONDS}s at each offered rate, $ROUNDS runs (pgbench -R, 16 clients, relay to Redis)"
for latency_rate in $LATENCY_RATES; do
    L_OFFERED=() L_ROWS=() L_B50=() L_B99=() L_BMAX=() L_F50=() L_F99=() L_LAG=()
    C_B50=() C_B99=() C_BMAX=() C_LEFT=() C_SECONDS=()
    for round in $(seq 1 "$ROUNDS"); do
        log "latency: $latency_rate rows/s for ${LATENCY_SECONDS}s with the relay running, round $round of $ROUNDS"
        latency_round "$round" "$latency_rate"
        if [ "$latency_rate" -le 1000 ] && [ "$CLEANUP_N" -gt 0 ]; then
            log "latency: the same with $CLEANUP_N succeeded rows past --retention to clean up, round $round of $ROUNDS"
            latency_round "$round" "$latency_rate" cleanup
        fi
    done
    if [ "$latency_rate" -gt 1000 ]; then
        shape="$((latency_rate / 5)) txn/s x 5 rows, outbox.enqueue_batch()"
    else
        shape="$latency_rate txn/s x 1 row, outbox.enqueue()"
    fi
    result "$latency_rate rows/s offered ($shape)" \
        "$(fmt_rate "$(median "${L_OFFERED[@]}")") rows/s" \
        "achieved; rows per run: $(joined "${L_ROWS[@]}"); pgbench's schedule lag, max per run: $(joined "${L_LAG[@]}") ms"
    result "  created_at -> Redis receive time, median of runs" "p50 $(median "${L_B50[@]}") ms" \
        "p99 $(median "${L_B99[@]}") ms (goal <= 50); per run p99 $(joined "${L_B99[@]}") ms, max $(joined "${L_BMAX[@]}") ms"
    result "  created_at -> finished_at (marked succeeded), median" "p50 $(median "${L_F50[@]}") ms" \
        "p99 $(median "${L_F99[@]}") ms; per run p99 $(joined "${L_F99[@]}") ms"
    if [ "${#C_B99[@]}" -gt 0 ]; then
        result "  the same while the relay deletes $CLEANUP_N old succeeded rows" \
            "p50 $(median "${C_B50[@]}") ms" \
            "p99 $(median "${C_B99[@]}") ms, $(printf '%.2f' "$(ratio "$(median "${C_B99[@]}")" "$(median "${L_B99[@]}")")") of the p99 without (goal <= 1.5); per run p99 $(joined "${C_B99[@]}") ms, max $(joined "${C_BMAX[@]}") ms"
        result "  cleanup meanwhile: seconds per run, old rows left after the run" \
            "$(joined "${C_SECONDS[@]}") s" "left: $(joined "${C_LEFT[@]}")"
    fi
done
section "  created_at is the transaction's start (now()), a few ms before its commit;
  the receive time is the millisecond Redis assigned the entry id (same host clock)."

# ---- 3 + 4. ceilings and drains, interleaved ------------------------------------

# The host is shared, so one run of a step can be 20 % off the next. Each
# ceiling and the drain compared with it run in turns, ROUNDS times, so slow
# and fast spells fall on both alike; the medians are compared. Each step
# sets RATE.
claim_ceiling() {
    local out ticks
    reset_outbox
    fill "$N"
    ticks=$(pg_cpu_ticks)
    out=$("$TOOLS/outbox_bench" claim-ceiling --database-url "$DB" --threads 2 --batch 500) ||
        die "claim-ceiling failed"
    sleep 0.2
    PG_US=$(pg_cpu_us_per_row "$ticks" "$(pg_cpu_ticks)" "$N")
    [ "$(field rows "$out")" = "$N" ] || die "claim-ceiling completed $(field rows "$out") of $N rows"
    RATE=$(field rate "$out")
}

# claim_ceiling_paused: the same with pauses in place that match none of
# the rows (another queue, and 100 ordering keys): what the claim's probe of
# outbox.paused costs when something is paused elsewhere
claim_ceiling_paused() {
    sql "SELECT outbox.pause('bench-paused', NULL, 'bench');
         SELECT count(outbox.pause('bench', 'key-' || g, 'bench')) FROM generate_series(1, 100) AS g" \
        >/dev/null
    claim_ceiling
    sql "DELETE FROM outbox.paused" >/dev/null
}

amqp_ceiling() {
    local out
    out=$(timeout "$STEP_TIMEOUT" "$TOOLS/outbox_bench" amqp-confirm --broker "$AMQP_URL" \
        --count "$N" --window 1000 --payload-bytes "$PAYLOAD_BYTES") || die "amqp-confirm failed"
    RATE=$(field rate "$out")
}

# amqp_sink_alone: the relay's publishing pattern (2 pipelines x 500 per batch,
# each batch waiting for its confirms) through the sink to queue bench,
# without a database; the queue is emptied afterwards
amqp_sink_alone() {
    local out
    out=$(timeout "$STEP_TIMEOUT" "$TOOLS/sink_amqp_throughput" "$AMQP_URL" bench "$N" 2 500 \
        "$PAYLOAD_BYTES") || die "sink_amqp_throughput failed"
    "$TOOLS/outbox_bench" amqp-count --broker "$AMQP_URL" --queue bench --purge yes >/dev/null ||
        die "emptying queue bench failed"
    RATE=$(field rate "$out")
}

# drain_redis: relays the backlog to stream drain:bench and checks it
drain_redis() {
    local xlen
    reset_outbox
    fill "$N"
    redis_cli DEL drain:bench >/dev/null
    relay_once "$REDIS_URL" redis --stream-prefix drain:
    check_succeeded "$N"
    xlen=$(redis_cli XLEN drain:bench)
    [ "$xlen" = "$N" ] || die "stream drain:bench holds $xlen entries, expected $N"
    redis_cli DEL drain:bench >/dev/null
    REDIS_RSS_KB=$DRAIN_RSS_KB
    RATE=$(rate "$N" "$DRAIN_SECONDS")
    PG_US=$(pg_cpu_us_per_row 0 "$DRAIN_PG_TICKS" "$N")
}

# drain_redis_delete: the same with --on-success delete; every row is gone
drain_redis_delete() {
    local xlen left
    reset_outbox
    fill "$N"
    redis_cli DEL drain:bench >/dev/null
    relay_once "$REDIS_URL" redis-delete --stream-prefix drain: --on-success delete
    left=$(sql "SELECT count(*) FROM outbox.job")
    [ "$left" = 0 ] || die "--on-success delete left $left rows in outbox.job"
    xlen=$(redis_cli XLEN drain:bench)
    [ "$xlen" = "$N" ] || die "stream drain:bench holds $xlen entries, expected $N"
    redis_cli DEL drain:bench >/dev/null
    RATE=$(rate "$N" "$DRAIN_SECONDS")
    PG_US=$(pg_cpu_us_per_row 0 "$DRAIN_PG_TICKS" "$N")
}

# drain_amqp: relays the backlog to queue bench and checks it
drain_amqp() {
    local out
    "$TOOLS/outbox_bench" amqp-count --broker "$AMQP_URL" --queue bench --purge yes >/dev/null ||
        die "emptying queue bench failed"
    reset_outbox
    fill "$N"
    relay_once "$AMQP_URL" amqp
    check_succeeded "$N"
    out=$("$TOOLS/outbox_bench" amqp-count --broker "$AMQP_URL" --queue bench --purge yes) ||
        die "counting the messages of queue bench failed"
    [ "$(field messages "$out")" = "$N" ] ||
        die "queue bench held $(field messages "$out") messages, expected $N"
    AMQP_RSS_KB=$DRAIN_RSS_KB
    RATE=$(rate "$N" "$DRAIN_SECONDS")
}


AMQP_OK=1
# kafka_ceiling: the raw idempotent acks=all producer (tests/tools/kafka_throughput raw)
# to a fresh topic of 3 partitions, as many records as the drain relays
kafka_ceiling() {
    local out topic="ceiling$1.bench"
    "$TOOLS/kafka_throughput" create-topic "$KAFKA_URL" "$topic" 3 || die "creating topic $topic failed"
    out=$(timeout "$STEP_TIMEOUT" "$TOOLS/kafka_throughput" raw "$KAFKA_URL" "$topic" "$N" \
        "$PAYLOAD_BYTES") || die "the raw kafka producer failed"
    "$TOOLS/kafka_throughput" delete-topic "$KAFKA_URL" "$topic"
    RATE=$(field rate "$out")
}

# kafka_sink_alone ROUND: the relay's publishing pattern (2 pipelines x 500 per batch, each
# batch waiting for its delivery reports) through the Kafka sink, without a database
kafka_sink_alone() {
    local out topic="sink$1.bench"
    "$TOOLS/kafka_throughput" create-topic "$KAFKA_URL" "$topic" 3 || die "creating topic $topic failed"
    out=$(timeout "$STEP_TIMEOUT" "$TOOLS/kafka_throughput" sink "$KAFKA_URL" "$topic" "$N" \
        "$PAYLOAD_BYTES" 2 500) || die "the kafka sink alone failed"
    "$TOOLS/kafka_throughput" delete-topic "$KAFKA_URL" "$topic"
    RATE=$(field rate "$out")
}

# drain_kafka ROUND: relays the backlog to topic drainROUND.bench (3 partitions), checks it
drain_kafka() {
    local out topic="drain$1.bench"
    reset_outbox
    fill "$N"
    "$TOOLS/kafka_throughput" create-topic "$KAFKA_URL" "$topic" 3 || die "creating topic $topic failed"
    relay_once "$KAFKA_URL" kafka --topic-prefix "drain$1."
    check_succeeded "$N"
    out=$("$TOOLS/kafka_throughput" count "$KAFKA_URL" "$topic") || die "counting $topic failed"
    [ "$(field records "$out")" = "$N" ] || die "topic $topic holds $(field records "$out") records, expected $N"
    "$TOOLS/kafka_throughput" delete-topic "$KAFKA_URL" "$topic"
    KAFKA_RSS_KB=$DRAIN_RSS_KB
    RATE=$(rate "$N" "$DRAIN_SECONDS")
    PG_US=$(pg_cpu_us_per_row 0 "$DRAIN_PG_TICKS" "$N")
}

# stream_fill QUEUE: QUEUE made a stream of 4 partitions (docs/stream.md), then a backlog of N
stream_fill() {
    reset_outbox
    sql "SELECT outbox.stream_enable('$1', 4)" >/dev/null
    fill "$N" "$1"
}

# stream_check QUEUE: every row of QUEUE is behind its partition's cursor; the queue is
# made row-state again, so that later steps' relays hold no stream connections
stream_check() {
    local left
    left=$(sql "SELECT count(*) FROM outbox.job AS j JOIN outbox.stream_cursor AS c
                ON c.queue = j.queue AND c.partition = j.stream_partition
                WHERE j.queue = '$1' AND j.state = 'stream'
                  AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)")
    [ "$left" = 0 ] || die "stream queue $1: $left rows left after the cursors"
    sql "SELECT outbox.stream_disable('$1')" >/dev/null
}

# drain_kafka_stream ROUND: the same drain from a stream queue (kstream, 4 partitions)
drain_kafka_stream() {
    local out topic="sdrain$1.kstream"
    stream_fill kstream
    "$TOOLS/kafka_throughput" create-topic "$KAFKA_URL" "$topic" 3 || die "creating topic $topic failed"
    relay_once "$KAFKA_URL" kafka-stream --topic-prefix "sdrain$1."
    stream_check kstream
    out=$("$TOOLS/kafka_throughput" count "$KAFKA_URL" "$topic") || die "counting $topic failed"
    [ "$(field records "$out")" = "$N" ] || die "topic $topic holds $(field records "$out") records, expected $N"
    "$TOOLS/kafka_throughput" delete-topic "$KAFKA_URL" "$topic"
    RATE=$(rate "$N" "$DRAIN_SECONDS")
    PG_US=$(pg_cpu_us_per_row 0 "$DRAIN_PG_TICKS" "$N")
}
KAFKA_URL=${OUTBOX_TEST_KAFKA_URL:-}
KAFKA_CEILING_RUNS=() KAFKA_SINK_RUNS=() KAFKA_RUNS=() KAFKA_PG=() KAFKA_STREAM_RUNS=() KAFKA_STREAM_PG=()

if ! check_out=$("$BIN/outbox-relay" --database-url "$DB" --broker "$AMQP_URL" \
    --metrics-addr off --check 2>&1); then
    AMQP_OK=0
else
    "$TOOLS/outbox_consumer" --broker "$AMQP_URL" --queue bench --declare --expect 0 ||
        die "declaring queue bench failed"
fi
CLAIM_RUNS=() CLAIM_PAUSED_RUNS=() REDIS_RUNS=() AMQP_CEILING_RUNS=() AMQP_SINK_RUNS=() AMQP_RUNS=()
CLAIM_PG=() REDIS_PG=() DELETE_RUNS=() DELETE_PG=()
for round in $(seq 1 "$ROUNDS"); do
    log "round $round of $ROUNDS: claim+complete ceiling, drain to Redis (mark, delete)"
    claim_ceiling
    CLAIM_RUNS+=("$RATE") CLAIM_PG+=("$PG_US")
    claim_ceiling_paused
    CLAIM_PAUSED_RUNS+=("$RATE")
    drain_redis
    REDIS_RUNS+=("$RATE") REDIS_PG+=("$PG_US")
    drain_redis_delete
    DELETE_RUNS+=("$RATE") DELETE_PG+=("$PG_US")
    if [ "$AMQP_OK" = 1 ]; then
        log "round $round of $ROUNDS: RabbitMQ confirm ceiling, drain to RabbitMQ"
        amqp_ceiling
        AMQP_CEILING_RUNS+=("$RATE")
        amqp_sink_alone
        AMQP_SINK_RUNS+=("$RATE")
        drain_amqp
        AMQP_RUNS+=("$RATE")
    fi
    if [ -n "$KAFKA_URL" ]; then
        log "round $round of $ROUNDS: Kafka producer ceiling, drain to Kafka"
        kafka_ceiling "$round"
        KAFKA_CEILING_RUNS+=("$RATE")
        kafka_sink_alone "$round"
        KAFKA_SINK_RUNS+=("$RATE")
        drain_kafka "$round"
        KAFKA_RUNS+=("$RATE") KAFKA_PG+=("$PG_US")
        drain_kafka_stream "$round"
        KAFKA_STREAM_RUNS+=("$RATE") KAFKA_STREAM_PG+=("$PG_US")
    fi
done
CLAIM_CEILING=$(median "${CLAIM_RUNS[@]}")
REDIS_DRAIN=$(median "${REDIS_RUNS[@]}")

log "ceiling: Redis pipelined XADD, $N messages"
out=$(timeout "$STEP_TIMEOUT" "$TOOLS/outbox_bench" redis-xadd --broker "$REDIS_URL" \
    --count "$N" --payload-bytes "$PAYLOAD_BYTES") || die "redis-xadd failed"
REDIS_CEILING=$(field rate "$out")

section "3. ceilings (same payload; median of $ROUNDS runs, taken in turns with the drains)"
result "PostgreSQL claim+complete (batch 500, 2 threads)" "$(fmt_rate "$CLAIM_CEILING") rows/s" \
    "PostgreSQL CPU $(printf '%.1f' "$(median "${CLAIM_PG[@]}")") us/row; runs: $(runs "${CLAIM_RUNS[@]}")"
CLAIM_PAUSED=$(median "${CLAIM_PAUSED_RUNS[@]}")
result "  the same, another queue and 100 keys paused" "$(fmt_rate "$CLAIM_PAUSED") rows/s" \
    "$(printf '%.2f' "$(ratio "$CLAIM_PAUSED" "$CLAIM_CEILING")") of the ceiling with nothing paused; runs: $(runs "${CLAIM_PAUSED_RUNS[@]}")"
if [ "$AMQP_OK" = 1 ]; then
    AMQP_CEILING=$(median "${AMQP_CEILING_RUNS[@]}")
    result "RabbitMQ publish+confirm (persistent, durable, window 1000)" \
        "$(fmt_rate "$AMQP_CEILING") msgs/s" "runs: $(runs "${AMQP_CEILING_RUNS[@]}")"
    AMQP_SINK=$(median "${AMQP_SINK_RUNS[@]}")
    result "  the relay's RabbitMQ sink alone, no database (2 x 500)" \
        "$(fmt_rate "$AMQP_SINK") msgs/s" \
        "$(printf '%.2f' "$(ratio "$AMQP_SINK" "$AMQP_CEILING")") of the ceiling; runs: $(runs "${AMQP_SINK_RUNS[@]}")"
fi
result "Redis pipelined XADD (window 4096, one run)" "$(fmt_rate "$REDIS_CEILING") msgs/s"

section "4. drain of a $N-row backlog by outbox-relay --once (default options; median of $ROUNDS)"
result "to Redis (all rows succeeded, XLEN = $N)" "$(fmt_rate "$REDIS_DRAIN") rows/s" \
    "$(printf '%.2f' "$(ratio "$REDIS_DRAIN" "$CLAIM_CEILING")") of claim+complete (goal >= 0.80), $(printf '%.2f' "$(ratio "$REDIS_DRAIN" "$REDIS_CEILING")") of raw XADD; goal >= 60 000 rows/s; runs: $(runs "${REDIS_RUNS[@]}")"
result "  PostgreSQL CPU per relayed row, median" "$(printf '%.1f' "$(median "${REDIS_PG[@]}")") us" \
    "goal <= 25; runs: $(printf '%.1f ' "${REDIS_PG[@]}" | sed 's/ $//; s/ /, /g') us"
DELETE_DRAIN=$(median "${DELETE_RUNS[@]}")
result "to Redis with --on-success delete (no row left, XLEN = $N)" "$(fmt_rate "$DELETE_DRAIN") rows/s" \
    "$(printf '%.2f' "$(ratio "$DELETE_DRAIN" "$REDIS_DRAIN")") of the drain with mark; goal >= 60 000 rows/s; runs: $(runs "${DELETE_RUNS[@]}")"
result "  PostgreSQL CPU per relayed row, median" "$(printf '%.1f' "$(median "${DELETE_PG[@]}")") us" \
    "goal <= 25; runs: $(printf '%.1f ' "${DELETE_PG[@]}" | sed 's/ $//; s/ /, /g') us"
result "  relay max RSS during the last Redis drain" "$((REDIS_RSS_KB / 1024)) MiB" \
    "(${REDIS_RSS_KB} kB)"
if [ "$AMQP_OK" = 1 ]; then
    AMQP_DRAIN=$(median "${AMQP_RUNS[@]}")
    result "to RabbitMQ (all rows succeeded, queue held $N)" "$(fmt_rate "$AMQP_DRAIN") rows/s" \
        "$(printf '%.2f' "$(ratio "$AMQP_DRAIN" "$AMQP_CEILING")") of raw publish+confirm (goal >= 0.80); runs: $(runs "${AMQP_RUNS[@]}")"
    result "  relay max RSS during the last RabbitMQ drain" "$((AMQP_RSS_KB / 1024)) MiB" \
        "(${AMQP_RSS_KB} kB)"
else
    result "to RabbitMQ" "n/a" "relay --check: $(printf '%s' "$check_out" | tail -n 1)"
fi
if [ -n "$KAFKA_URL" ]; then
    KAFKA_CEILING=$(median "${KAFKA_CEILING_RUNS[@]}")
    KAFKA_DRAIN=$(median "${KAFKA_RUNS[@]}")
    KAFKA_SINK=$(median "${KAFKA_SINK_RUNS[@]}")
    result "Kafka raw producers (2, idempotent, acks=all, 3 partitions)" "$(fmt_rate "$KAFKA_CEILING") msgs/s" \
        "runs: $(runs "${KAFKA_CEILING_RUNS[@]}")"
    result "  the relay's Kafka sink alone, no database (2 x 500)" "$(fmt_rate "$KAFKA_SINK") msgs/s" \
        "$(printf '%.2f' "$(ratio "$KAFKA_SINK" "$KAFKA_CEILING")") of the raw producers; runs: $(runs "${KAFKA_SINK_RUNS[@]}")"
    result "to Kafka (all rows succeeded, topic held $N)" "$(fmt_rate "$KAFKA_DRAIN") rows/s" \
        "$(printf '%.2f' "$(ratio "$KAFKA_DRAIN" "$KAFKA_CEILING")") of the raw producers (goal >= 0.80), $(printf '%.2f' "$(ratio "$KAFKA_DRAIN" "$CLAIM_CEILING")") of claim+complete; runs: $(runs "${KAFKA_RUNS[@]}")"
    result "  PostgreSQL CPU per relayed row, median" "$(printf '%.1f' "$(median "${KAFKA_PG[@]}")") us" \
        "runs: $(printf '%.1f ' "${KAFKA_PG[@]}" | sed 's/ $//; s/ /, /g') us"
    result "  relay max RSS during the last Kafka drain" "$((KAFKA_RSS_KB / 1024)) MiB" "(${KAFKA_RSS_KB} kB)"
    KAFKA_STREAM=$(median "${KAFKA_STREAM_RUNS[@]}")
    result "to Kafka from a stream queue (4 partitions, topic held $N)" "$(fmt_rate "$KAFKA_STREAM") rows/s" \
        "$(printf '%.2f' "$(ratio "$KAFKA_STREAM" "$KAFKA_CEILING")") of the raw producers (goal >= 0.80); runs: $(runs "${KAFKA_STREAM_RUNS[@]}")"
    result "  PostgreSQL CPU per relayed row, median" "$(printf '%.1f' "$(median "${KAFKA_STREAM_PG[@]}")") us" \
        "runs: $(printf '%.1f ' "${KAFKA_STREAM_PG[@]}" | sed 's/ $//; s/ /, /g') us"
fi
result "table + indexes with $N succeeded rows" "" "$(sizes)"
timeout "$STEP_TIMEOUT" "$BIN/outboxctl" --database-url "$DB" purge --older-than 0s >/dev/null ||
    die "outboxctl purge failed"
sql "VACUUM outbox.job" >/dev/null
result "  after outboxctl purge --older-than 0s + VACUUM" "" "$(sizes)"
log "cleanup capacity: $CLEANUP_N succeeded rows past --retention, outbox-relay --once"
reset_outbox
fill_old_succeeded "$CLEANUP_N"
relay_once "$REDIS_URL" cleanup --retention 1h --log-level info
CLEANED=$(sed -n 's/.*deleted old succeeded rows rows=\([0-9]*\) seconds=\([0-9.]*\).*/\1 \2/p' \
    "$STACK/relay-cleanup.log" | head -n 1)
[ "$(sql "SELECT count(*) FROM outbox.job")" = 0 ] || die "the cleanup left rows behind"
[ "${CLEANED% *}" = "$CLEANUP_N" ] || die "the relay logged '$CLEANED' deleted rows, expected $CLEANUP_N"
CLEANUP_RATE=$(rate "$CLEANUP_N" "${CLEANED#* }")
result "cleanup of $CLEANUP_N succeeded rows past --retention" "$(fmt_rate "$CLEANUP_RATE") rows/s" \
    "$(printf '%.1f' "$(ratio "$CLEANUP_RATE" "$REDIS_DRAIN")")x the Redis drain; batches of 5 000, one transaction each (${CLEANED#* } s)"

# ---- 5. scaling ---------------------------------------------------------------------------

section "5. one claim of 500 rows (median of 11, each completed) vs ready backlog"
SCALE_SIZES="10000 100000 1000000"
[ "$BIG" = 1 ] && SCALE_SIZES="$SCALE_SIZES 10000000"
for size in $SCALE_SIZES; do
    log "claim latency with a ready backlog of $size rows"
    reset_outbox
    fill "$size"
    out=$("$TOOLS/outbox_bench" claim-latency --database-url "$DB" --batch 500 --repeat 11) ||
        die "claim-latency failed"
    result "ready backlog of $size rows" "$(field median_ms "$out") ms" "$(sizes)"
done
reset_outbox

# ---- 6. ordering keys -------------------------------------------------------------------

section "6. one claim of 500 rows (median of 11, each completed) with ordering keys"
# Rows are written as outbox.enqueue() would: the first row of each key ready, the rest held.
# The fill skips the insert guard of migration 003 (session_replication_role = replica, as
# the superuser the bench runs as): its check of each held row costs more than the 600 s a
# step may take on a busy host, and the rows are the ones enqueue() would write anyway.
log "claim latency with 10 000 keys x 100 rows"
reset_outbox
sql "SET session_replication_role = replica;
     INSERT INTO outbox.job (queue, payload, ordering_key, held)
     SELECT 'bench', '{\"n\": 1}', 'key-' || (g % 10000), g > 10000
     FROM generate_series(1, 1000000) AS g" >/dev/null &&
    sql "VACUUM ANALYZE outbox.job" >/dev/null || die "unable to fill the keyed backlog"
out=$("$TOOLS/outbox_bench" claim-latency --database-url "$DB" --batch 500 --repeat 11) ||
    die "claim-latency failed"
result "10 000 keys x 100 rows (1M rows)" "$(field median_ms "$out") ms" "$(sizes)"
log "claim latency with one hot key of 100 000 rows and 100 000 unkeyed rows"
reset_outbox
sql "SET session_replication_role = replica;
     INSERT INTO outbox.job (queue, payload, ordering_key, held)
     SELECT 'bench', '{\"n\": 1}', CASE WHEN g % 2 = 0 THEN 'hot' END, g % 2 = 0 AND g > 2
     FROM generate_series(1, 200000) AS g" >/dev/null &&
    sql "VACUUM ANALYZE outbox.job" >/dev/null || die "unable to fill the hot-key backlog"
out=$("$TOOLS/outbox_bench" claim-latency --database-url "$DB" --batch 500 --repeat 11) ||
    die "claim-latency failed"
result "one hot key of 100k rows + 100k unkeyed" "$(field median_ms "$out") ms" "$(sizes)"
reset_outbox

# ---- 7. inbox -----------------------------------------------------------------------------

# A consumer's transaction: its own insert, alone and after outbox.inbox_accept().
# One client, so the latency difference is the inbox's cost per message; with
# synchronous_commit off, or the commit's flush (the same for both) drowns it.
section "7. consumer inbox: one message per transaction, 1 client, synchronous_commit off, ${PGBENCH_SECONDS}s, median of $ROUNDS"
sql "CREATE TABLE IF NOT EXISTS bench_effects (message_id text NOT NULL, amount bigint);
     TRUNCATE bench_effects, outbox.inbox" >/dev/null
cat >"$STACK/inbox-without.sql" <<'EOF_SQL'
\set id random(1, 2000000000)
BEGIN;
INSERT INTO bench_effects (message_id, amount) VALUES (:id::text, :id % 1000);
COMMIT;
EOF_SQL
cat >"$STACK/inbox-with.sql" <<'EOF_SQL'
\set id random(1, 2000000000)
BEGIN;
SELECT outbox.inbox_accept('bench', :id::text);
INSERT INTO bench_effects (message_id, amount) VALUES (:id::text, :id % 1000);
COMMIT;
EOF_SQL
INBOX_WITHOUT=() INBOX_WITH=()
for round in $(seq 1 "$ROUNDS"); do
    log "inbox: consumer insert alone, then with inbox_accept, round $round of $ROUNDS"
    INBOX_WITHOUT+=("$(PGOPTIONS='-c synchronous_commit=off' pgbench_rate "$STACK/inbox-without.sql" 1 1)")
    INBOX_WITH+=("$(PGOPTIONS='-c synchronous_commit=off' pgbench_rate "$STACK/inbox-with.sql" 1 1)")
done
WITHOUT=$(median "${INBOX_WITHOUT[@]}")
WITH=$(median "${INBOX_WITH[@]}")
result "consumer insert alone" "$(fmt_rate "$WITHOUT") msgs/s" \
    "$(printf '%.0f' "$(calc "1000000 / $WITHOUT")") us per message; runs: $(runs "${INBOX_WITHOUT[@]}")"
result "with outbox.inbox_accept() first" "$(fmt_rate "$WITH") msgs/s" \
    "$(printf '%.0f' "$(calc "1000000 / $WITH")") us per message, the inbox $(printf '%.0f' "$(calc "1000000 / $WITH - 1000000 / $WITHOUT")") us of it; runs: $(runs "${INBOX_WITH[@]}")"
sql "DROP TABLE bench_effects; TRUNCATE outbox.inbox" >/dev/null

# ---- 8. long-run health -------------------------------------------------------------------

if [ "$LONGRUN_SECONDS" -gt 0 ]; then
    section "8. long-run health (tests/bench/longrun.sh; make soak runs 10 minutes and enforces these)"
    for mode in steady horizon; do
        log "long run: $mode"
        set +e
        BUILD="$BUILD" BIN="$BIN" LONGRUN_ENV="$STACK/env" LONGRUN_SECONDS="$LONGRUN_SECONDS" \
            LONGRUN_WARMUP_SECONDS=30 LONGRUN_HOLD_SECONDS=60 LONGRUN_RECOVERY_SECONDS=120 \
            LONGRUN_WARNING=30s \
            timeout $((LONGRUN_SECONDS + 600)) "$ROOT/tests/bench/longrun.sh" "$mode" \
            >"$STACK/longrun-$mode.out" 2>"$STACK/longrun-$mode.log"
        status=$?
        set -e
        [ "$status" -le 1 ] || {
            tail -n 20 "$STACK/longrun-$mode.log" >&2
            die "longrun.sh $mode failed (exit $status)"
        }
        sed 's/^/  /' "$STACK/longrun-$mode.out" >>"$RESULTS"
        cat "$STACK/longrun-$mode.out" >&2
    done
fi

# ---- 9. the console's overview --------------------------------------------------------------

section "9. console read times (tests/bench/console.sh)"
log "console: seeding 1 000 000 rows over 1 000 queues"
OUTBOX_TEST_PG_URL="$OUTBOX_TEST_PG_URL" BIN="$BIN" timeout 1800 "$ROOT/tests/bench/console.sh" \
    >"$STACK/console.out" 2>"$STACK/console.log" || {
    tail -n 20 "$STACK/console.log" >&2
    die "tests/bench/console.sh failed"
}
cat "$STACK/console.out" >>"$RESULTS"
cat "$STACK/console.out" >&2

# ---- 10. NATS JetStream ---------------------------------------------------------------------

# nats_stream_reset: stream bench-nats over nbench.> holds nothing
nats_stream_reset() {
    "$TOOLS/nats_bench" stream-delete --broker "$NATS_URL" --stream bench-nats >/dev/null ||
        die "deleting stream bench-nats failed"
    "$TOOLS/nats_bench" stream-create --broker "$NATS_URL" --stream bench-nats \
        --subject 'nbench.>' >/dev/null || die "creating stream bench-nats failed"
}

# nats_stream_holds N: the stream holds exactly N messages
nats_stream_holds() {
    local out
    out=$("$TOOLS/nats_bench" stream-count --broker "$NATS_URL" --stream bench-nats) ||
        die "counting stream bench-nats failed"
    [ "$(field messages "$out")" = "$1" ] ||
        die "stream bench-nats holds $(field messages "$out") messages, expected $1"
}

nats_ceiling() {
    local out
    nats_stream_reset
    out=$(timeout "$STEP_TIMEOUT" "$TOOLS/nats_bench" publish --broker "$NATS_URL" \
        --subject nbench.bench --count "$N" --payload-bytes "$PAYLOAD_BYTES") ||
        die "nats_bench publish failed"
    nats_stream_holds "$N"
    RATE=$(field rate "$out")
}

drain_nats() {
    nats_stream_reset
    reset_outbox
    fill "$N"
    relay_once "$NATS_URL" nats --subject-prefix nbench.
    check_succeeded "$N"
    nats_stream_holds "$N"
    NATS_RSS_KB=$DRAIN_RSS_KB
    RATE=$(rate "$N" "$DRAIN_SECONDS")
    PG_US=$(pg_cpu_us_per_row 0 "$DRAIN_PG_TICKS" "$N")
}

# drain_nats_stream: the same drain from a stream queue (nstream, 4 partitions)
drain_nats_stream() {
    nats_stream_reset
    stream_fill nstream
    relay_once "$NATS_URL" nats-stream --subject-prefix nbench.
    stream_check nstream
    nats_stream_holds "$N"
    RATE=$(rate "$N" "$DRAIN_SECONDS")
    PG_US=$(pg_cpu_us_per_row 0 "$DRAIN_PG_TICKS" "$N")
}

NATS_URL=${OUTBOX_TEST_NATS_URL:-}
if [ -n "$NATS_URL" ]; then
    NATS_CEILING_RUNS=() NATS_RUNS=() NATS_PG=() NATS_STREAM_RUNS=() NATS_STREAM_PG=()
    for round in $(seq 1 "$ROUNDS"); do
        log "round $round of $ROUNDS: NATS async publish ceiling, drain to NATS"
        nats_ceiling
        NATS_CEILING_RUNS+=("$RATE")
        drain_nats
        NATS_RUNS+=("$RATE") NATS_PG+=("$PG_US")
        drain_nats_stream
        NATS_STREAM_RUNS+=("$RATE") NATS_STREAM_PG+=("$PG_US")
    done
    "$TOOLS/nats_bench" stream-delete --broker "$NATS_URL" --stream bench-nats >/dev/null || true
    NATS_CEILING=$(median "${NATS_CEILING_RUNS[@]}")
    NATS_DRAIN=$(median "${NATS_RUNS[@]}")
    section "10. NATS JetStream (file storage, one server; median of $ROUNDS runs in turns)"
    result "raw async publish, one connection, window 4096, Nats-Msg-Id each" \
        "$(fmt_rate "$NATS_CEILING") msgs/s" "runs: $(runs "${NATS_CEILING_RUNS[@]}")"
    result "drain of $N rows to NATS (all succeeded, stream holds $N)" \
        "$(fmt_rate "$NATS_DRAIN") rows/s" \
        "$(printf '%.2f' "$(ratio "$NATS_DRAIN" "$NATS_CEILING")") of the raw publisher (goal >= 0.80), $(printf '%.2f' "$(ratio "$NATS_DRAIN" "$CLAIM_CEILING")") of claim+complete; runs: $(runs "${NATS_RUNS[@]}")"
    result "  PostgreSQL CPU per relayed row, median" "$(printf '%.1f' "$(median "${NATS_PG[@]}")") us" \
        "runs: $(printf '%.1f ' "${NATS_PG[@]}" | sed 's/ $//; s/ /, /g') us"
    result "  relay max RSS during the last NATS drain" "$((NATS_RSS_KB / 1024)) MiB" \
        "(${NATS_RSS_KB} kB)"
    NATS_STREAM=$(median "${NATS_STREAM_RUNS[@]}")
    result "drain of $N rows to NATS from a stream queue (4 partitions)" \
        "$(fmt_rate "$NATS_STREAM") rows/s" \
        "$(printf '%.2f' "$(ratio "$NATS_STREAM" "$NATS_CEILING")") of the raw publisher (goal >= 0.80); runs: $(runs "${NATS_STREAM_RUNS[@]}")"
    result "  PostgreSQL CPU per relayed row, median" "$(printf '%.1f' "$(median "${NATS_STREAM_PG[@]}")") us" \
        "runs: $(printf '%.1f ' "${NATS_STREAM_PG[@]}" | sed 's/ $//; s/ /, /g') us"
fi

# ---- 11. stream mode ----------------------------------------------------------------------

section "11. stream mode against row-state (tests/bench/stream.sh, median of $ROUNDS)"
# The step needs PostgreSQL and Redis only: the other servers stop, so that their idle
# work (RabbitMQ's schedulers, Kafka's JVM) is not on the two cores it measures;
# stream.sh waits for the autovacuum of the earlier steps' tables before each figure.
for service in rabbitmq kafka nats; do
    "$STACK_SH" stop-service "$STACK" "$service" >/dev/null 2>&1 || true
done
log "stream mode: enqueue cost of the xid, drain row-state vs stream"
BUILD="$BUILD" BIN="$BIN" STREAM_BENCH_ENV="$STACK/env" STREAM_BENCH_N="$N" STREAM_BENCH_ROUNDS="$ROUNDS" \
    timeout $((STEP_TIMEOUT * 4)) "$ROOT/tests/bench/stream.sh" >"$STACK/stream.out" ||
    die "tests/bench/stream.sh failed"
cat "$STACK/stream.out" >>"$RESULTS"
cat "$STACK/stream.out" >&2

# ---- 12. CloudEvents and spans --------------------------------------------------------------

section "12. the drain to Redis with --cloudevents binary and with spans (tests/bench/standards.sh, median of $ROUNDS)"
log "standards: drain plain, with CloudEvents, with spans at 100 %"
BIN="$BIN" STANDARDS_BENCH_ENV="$STACK/env" STANDARDS_BENCH_N="$N" STANDARDS_BENCH_ROUNDS="$ROUNDS" \
    timeout $((STEP_TIMEOUT * 4)) "$ROOT/tests/bench/standards.sh" >"$STACK/standards.out" ||
    die "tests/bench/standards.sh failed"
cat "$STACK/standards.out" >>"$RESULTS"
cat "$STACK/standards.out" >&2

# ---- report -----------------------------------------------------------------------------

mkdir -p "$(dirname "$RESULTS_FILE")"
{
    echo "outbox-relay benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "machine: $(nproc) CPUs ($CPU_MODEL), $MEMORY RAM, $(uname -sr)"
    echo "load average (1/5/15 min) at start: $LOAD_BEFORE, at end: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the host skews the figures)"
    echo "servers: PostgreSQL $PG_VERSION ($PG_SETTINGS), RabbitMQ $RABBIT_VERSION, Redis $REDIS_VERSION; all on this host"
    echo "backlog: N = $N rows, payload $PAYLOAD_BYTES bytes of JSON"
    cat "$RESULTS"
} >"$RESULTS_FILE"
printf '\n'
cat "$RESULTS_FILE"
printf '\n(written to %s)\n' "$RESULTS_FILE"
