#!/bin/bash
# standards.sh - the drain to Redis with CloudEvents and with spans, against the drain without.
#
#   tests/bench/standards.sh            (a throwaway PostgreSQL + Redis stack of its own)
#   STANDARDS_BENCH_ENV=DIR/env tests/bench/standards.sh   (a stack already running; make bench)
#
# In turns, STANDARDS_BENCH_ROUNDS (default 3) times, medians reported: a backlog of
# STANDARDS_BENCH_N rows (default 100000) drained by `outbox-relay --once` to Redis
#   - as it is (the reference),
#   - with --cloudevents binary (ten ce_ fields more per entry),
#   - with a span per message at 100 % sampling (OTEL_TRACES_SAMPLER=always_on) exported
#     to a collector on this host: tests/standards/otlp_receiver.py PORT, which takes every
#     export without decoding it (a collector elsewhere; the relay's export thread does
#     all the encoding and sending on these cores), spans counted at the end;
# every row checked in the table and the stream (XLEN). The goal of each: >= 0.9 of the
# reference. Prints one result line per figure; fails only when a step fails or a check
# of the delivered rows does not hold.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-bin}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
N=${STANDARDS_BENCH_N:-100000}
ROUNDS=${STANDARDS_BENCH_ROUNDS:-3}
STEP_TIMEOUT=600

BENCH_NAME=standards
RUNS_FORMAT=%.0f
# shellcheck source=tests/bench/common.sh
. "$ROOT/tests/bench/common.sh"
COLLECTOR_PID=""
bench_on_exit '[ -n "$COLLECTOR_PID" ] && kill "$COLLECTOR_PID" 2>/dev/null'
bench_stack STANDARDS_BENCH_ENV
bench_database outbox_standards_bench

PAYLOAD='{"order_id": 1234567, "event": "order.created", "customer": "c-0004711", "amount_cents": 129900, "currency": "EUR", "items": [{"sku": "sku-01", "qty": 2}], "pad": "xxxxxxxxxxxxxxxxxxxxxxxx"}'
# what a traced producer writes: a sampled parent per row, and the event's type
HEADERS='{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "ce_type": "com.example.order.created"}'

# the collector: a port the stack's range leaves free
COLLECTOR_PORT=$(( (OUTBOX_TEST_REDIS_PORT + 97) ))
venv=${OUTBOX_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/venv}
"$venv/bin/python" "$ROOT/tests/standards/otlp_receiver.py" "$COLLECTOR_PORT" >"$STACK/collector.out" &
COLLECTOR_PID=$!

# drain NAME [OPTIONS...]: N rows to stream std:<name>:bench by --once; sets RATE
drain() {
    local name=$1 start end xlen
    shift
    sql "TRUNCATE outbox.job" >/dev/null
    sql "INSERT INTO outbox.job (queue, payload, headers)
         SELECT 'bench', '$PAYLOAD'::jsonb, '$HEADERS'::jsonb FROM generate_series(1, $N)" >/dev/null
    sql "VACUUM ANALYZE outbox.job" >/dev/null
    sql "CHECKPOINT" >/dev/null
    redis_cli DEL "std:$name:bench" >/dev/null
    start=$(date +%s.%N)
    timeout "$STEP_TIMEOUT" "$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_REDIS_URL" \
        --stream-prefix "std:$name:" --metrics-addr off --log-level warn --once "$@" \
        2>"$STACK/standards-$name.log" || die "outbox-relay --once ($name) failed"
    end=$(date +%s.%N)
    [ "$(sql "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'")" = "$N" ] ||
        die "$name: not every row succeeded"
    xlen=$(redis_cli XLEN "std:$name:bench")
    [ "$xlen" = "$N" ] || die "$name: stream holds $xlen entries, expected $N"
    redis_cli DEL "std:$name:bench" >/dev/null
    RATE=$(calc "$N / ($end - $start)")
}

PLAIN=() CE=() SPANS=()
log "warming up: one drain not counted"
drain plain
for round in $(seq 1 "$ROUNDS"); do
    log "round $round of $ROUNDS: plain, --cloudevents binary, spans at 100 %"
    drain plain
    PLAIN+=("$RATE")
    drain ce --cloudevents binary
    CE+=("$RATE")
    OTEL_TRACES_SAMPLER=always_on drain spans --otel-endpoint "http://127.0.0.1:$COLLECTOR_PORT"
    SPANS+=("$RATE")
done
kill "$COLLECTOR_PID"
wait "$COLLECTOR_PID" 2>/dev/null || true
COLLECTOR_PID=""
plain=$(median "${PLAIN[@]}") ce=$(median "${CE[@]}") spans=$(median "${SPANS[@]}")
result "to Redis, $N rows (reference)" "$(printf '%.0f' "$plain") rows/s" "runs: $(runs "${PLAIN[@]}")"
result "  with --cloudevents binary" "$(printf '%.0f' "$ce") rows/s" \
    "$(printf '%.2f' "$(calc "$ce / $plain")") of the reference (goal >= 0.90); runs: $(runs "${CE[@]}")"
result "  with a span per message, 100 % sampled, to a collector" "$(printf '%.0f' "$spans") rows/s" \
    "$(printf '%.2f' "$(calc "$spans / $plain")") of the reference (goal >= 0.90); runs: $(runs "${SPANS[@]}"); collector took $(cat "$STACK/collector.out") of $((N * ROUNDS))"
