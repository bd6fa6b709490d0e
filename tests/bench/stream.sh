#!/bin/bash
# stream.sh - stream mode against row-state mode (docs/stream.md), on one stack.
#
#   tests/bench/stream.sh            (a throwaway PostgreSQL + Redis stack of its own)
#   STREAM_BENCH_ENV=DIR/env tests/bench/stream.sh   (a stack already running; make bench)
#
# Measures, in turns, STREAM_BENCH_ROUNDS (default 3) times, medians reported:
#   - outbox.enqueue_batch() of 1000 rows a call into a row-state queue, which
#     records no transaction id, and into a stream queue of 4 partitions, whose
#     trigger records it (migration 012), with that trigger as shipped and
#     without its line recording the xid: what recording the inserting
#     transaction costs a producer
#   - drain of a STREAM_BENCH_N-row backlog (default 100000) by `outbox-relay
#     --once` to Redis: row-state (--on-success mark, the default) and a stream
#     queue of 4 partitions, each with PostgreSQL's CPU per relayed row (utime +
#     stime of the server's processes, the exited ones through the postmaster's
#     cutime), every row checked in the stream (XLEN) and in the table
#     and the relay's max RSS
#   - commit -> broker latency (p50, p99, max) at each rate of
#     STREAM_BENCH_LATENCY_RATES (rows/s offered, default "1000 5000": up to 1000
#     as single-row transactions of outbox.enqueue(), above that transactions of
#     5 rows through outbox.enqueue_batch(); STREAM_BENCH_LATENCY_SECONDS, default
#     15) of a stream queue of 4 partitions and of a row-state queue, one relay of
#     default options each, from the Redis entry ids ($BUILD/tests/tools/outbox_bench
#     stream-times; skipped when not built), with the load average over each run
# STREAM_BENCH_ROUNDS=0 runs the latency runs only.
# Prints one result line per figure on stdout; progress on stderr. Fails only
# when a step fails or a check of the delivered rows does not hold.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-bin}
BUILD=${BUILD:-build}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
LATENCY_SECONDS=${STREAM_BENCH_LATENCY_SECONDS:-15}
LATENCY_RATES=${STREAM_BENCH_LATENCY_RATES:-1000 5000}
PG_BIN=${OUTBOX_PG_BIN:-/usr/lib/postgresql/15/bin}
N=${STREAM_BENCH_N:-100000}
ROUNDS=${STREAM_BENCH_ROUNDS:-3}
STEP_TIMEOUT=600

BENCH_NAME=stream
# shellcheck source=tests/bench/common.sh
. "$ROOT/tests/bench/common.sh"
bench_stack STREAM_BENCH_ENV
REDIS_URL=$OUTBOX_TEST_REDIS_URL
bench_database outbox_stream_bench

PAYLOAD='{"order_id": 1234567, "event": "order.created", "customer": "c-0004711", "amount_cents": 129900, "currency": "EUR", "items": [{"sku": "sku-01", "qty": 2}], "pad": "xxxxxxxxxxxxxxxxxxxxxxxx"}'

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

reset_outbox() {
    sql "TRUNCATE outbox.job" >/dev/null
    sql "CHECKPOINT" >/dev/null
    wait_quiet
}

# wait_quiet: writes the page cache out (sync: the WAL of the steps before must not be
# written back under the commits measured), then waits (STEP_TIMEOUT at most) until no
# autovacuum worker runs anywhere in the server and Redis rewrites no file: on a stack
# shared with earlier steps (make bench) the vacuum of their tables would run on the cores
# measured, and count in PostgreSQL's CPU.
wait_quiet() {
    local busy waited=0
    sync
    while [ "$waited" -lt "$STEP_TIMEOUT" ]; do
        busy=$(psql -X -qAt "$OUTBOX_TEST_PG_URL" -c "SELECT count(*) FROM pg_stat_activity
                 WHERE backend_type = 'autovacuum worker'")
        redis_cli INFO persistence | grep -Eq '^(aof_rewrite|rdb_bgsave)_in_progress:1' && busy=1
        [ "$busy" = 0 ] && break
        [ "$waited" -eq 0 ] && log "waiting for autovacuum or a Redis rewrite to end"
        sleep 1
        waited=$((waited + 1))
    done
}

# enqueue_rate QUEUE: rows/s of 1000-row outbox.enqueue_batch() calls, one client, 10 s;
# sets ENQUEUE_US, PostgreSQL's CPU per row inserted (steadier than the rate on a busy host).
enqueue_rate() {
    local out tps ticks rows
    reset_outbox
    ticks=$(pg_cpu_ticks)
    printf "SELECT outbox.enqueue_batch('%s', array_fill('%s'::jsonb, ARRAY[1000]));\n" \
        "$1" "$PAYLOAD" >"$STACK/stream-enqueue-batch.sql"
    out=$(PGOPTIONS='-c synchronous_commit=off' timeout 120 "$PG_BIN/pgbench" -n -c 1 -T 10 \
        -f "$STACK/stream-enqueue-batch.sql" "$DB" 2>&1) || {
        printf '%s\n' "$out" >&2
        die "pgbench enqueue_batch failed"
    }
    tps=$(printf '%s\n' "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1)
    sleep 0.2
    rows=$(sql "SELECT count(*) FROM outbox.job")
    ENQUEUE_US=$(calc "($(pg_cpu_ticks) - $ticks) * 1000000 / $CLOCK_TICKS / $rows")
    RATE=$(calc "$tps * 1000")
}

# drain QUEUE NAME: relays N rows of QUEUE by --once; sets RATE, PG_US and RSS_KB (the relay's
# max RSS).
drain() {
    local queue=$1 name=$2 start end ticks xlen
    reset_outbox
    redis_cli DEL "sbench:$queue" >/dev/null
    sql "INSERT INTO outbox.job (queue, payload)
         SELECT '$queue', '$PAYLOAD'::jsonb FROM generate_series(1, $N)" >/dev/null
    sql "VACUUM ANALYZE outbox.job" >/dev/null
    sql "CHECKPOINT" >/dev/null
    wait_quiet
    ticks=$(pg_cpu_ticks)
    start=$(date +%s.%N)
    /usr/bin/time -v -o "$STACK/stream-time-$name" timeout "$STEP_TIMEOUT" \
        "$BIN/outbox-relay" --database-url "$DB" --broker "$REDIS_URL" \
        --metrics-addr off --log-level warn --once --stream-prefix sbench: \
        2>"$STACK/stream-relay-$name.log" || die "outbox-relay --once ($name) failed"
    end=$(date +%s.%N)
    RSS_KB=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$STACK/stream-time-$name")
    sleep 0.2
    PG_US=$(calc "($(pg_cpu_ticks) - $ticks) * 1000000 / $CLOCK_TICKS / $N")
    RATE=$(calc "$N / ($end - $start)")
    xlen=$(redis_cli XLEN "sbench:$queue")
    [ "$xlen" = "$N" ] || die "$name: stream sbench:$queue holds $xlen entries, expected $N"
    redis_cli DEL "sbench:$queue" >/dev/null
}

# latency_run QUEUE RATE: one steady run at RATE rows/s into QUEUE ('slat' a stream, 'rlat'
# row-state); sets P50 P99 PMAX (ms) and LOAD (the 1-minute load average before and after)
latency_run() {
    local queue=$1 rate=$2 transactions=$2 relay_pid rows count load_before
    reset_outbox
    redis_cli DEL "sbench:$queue" >/dev/null
    if [ "$rate" -gt 1000 ]; then
        transactions=$((rate / 5))
        printf "SELECT cardinality(outbox.enqueue_batch('%s', array_fill('%s'::jsonb, ARRAY[5])));\n" \
            "$queue" "$PAYLOAD" >"$STACK/stream-latency.sql"
    else
        printf "SELECT outbox.enqueue('%s', '%s'::jsonb);\n" "$queue" "$PAYLOAD" \
            >"$STACK/stream-latency.sql"
    fi
    load_before=$(cut -d' ' -f1 /proc/loadavg)
    "$BIN/outbox-relay" --database-url "$DB" --broker "$REDIS_URL" --metrics-addr off \
        --log-level warn --stream-prefix sbench: 2>"$STACK/stream-relay-latency.log" &
    relay_pid=$!
    sleep 1
    timeout $((LATENCY_SECONDS + 120)) "$PG_BIN/pgbench" -n -c 16 -j 2 -R "$transactions" \
        -T "$LATENCY_SECONDS" -f "$STACK/stream-latency.sql" "$DB" >/dev/null 2>&1 ||
        die "pgbench at $rate rows/s failed"
    LOAD="$load_before to $(cut -d' ' -f1 /proc/loadavg)"
    rows=$(sql "SELECT count(*) FROM outbox.job WHERE queue = '$queue'")
    for _ in $(seq 1 600); do
        [ "$(redis_cli XLEN "sbench:$queue")" -ge "$rows" ] && break
        sleep 0.1
    done
    kill -TERM "$relay_pid"
    wait "$relay_pid" || die "the background relay exited with $?"
    "$TOOLS/outbox_bench" stream-times --broker "$REDIS_URL" --stream "sbench:$queue" \
        >"$STACK/stream-times" 2>/dev/null || die "reading the stream's entry ids failed"
    redis_cli DEL "sbench:$queue" >/dev/null
    cat >"$STACK/stream-latency-report.sql" <<EOF
CREATE TEMP TABLE received (job_id bigint, received_ms bigint);
\\copy received FROM '$STACK/stream-times' WITH (DELIMITER ' ')
WITH l AS (SELECT j.created_at, r.received_ms - extract(epoch FROM j.created_at) * 1000 AS ms
           FROM outbox.job j JOIN received r USING (job_id) WHERE j.queue = '$queue'),
     s AS (SELECT min(created_at) AS t FROM l)
SELECT count(*), round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(max(ms)::numeric, 1), count(*) FILTER (WHERE ms > 50),
       count(*) FILTER (WHERE ms > 50 AND l.created_at < s.t + interval '1 second'),
       coalesce(string_agg(DISTINCT floor(extract(epoch FROM l.created_at - s.t))::text, ',')
                FILTER (WHERE ms > 50), '')
FROM l, s;
EOF
    IFS='|' read -r count P50 P99 PMAX LATE LATE_FIRST LATE_SECONDS < <(psql -X -qAt -v ON_ERROR_STOP=1 "$DB" \
        -f "$STACK/stream-latency-report.sql")
    [ "$count" = "$rows" ] || die "sbench:$queue holds $count of the $rows latency rows"
}

# late_rows: the rows of the last latency run over 50 ms, and when they were created
late_rows() {
    result "    rows over 50 ms" "$LATE" \
        "$LATE_FIRST of them in the first second; created in second(s) ${LATE_SECONDS:-none} of the run"
}
sql "SELECT outbox.stream_enable('sbench', 4)" >/dev/null
sql "SELECT outbox.stream_enable('es', 4)" >/dev/null
# The stream trigger's function as shipped, and the same without the line
# recording the xid (the stream read needs it: for this measure only).
XID_LINE='NEW.xid := pg_current_xact_id();'
STREAM_ROW=$(sql "SELECT pg_get_functiondef('outbox.stream_row()'::regprocedure)")
case "$STREAM_ROW" in *"$XID_LINE"*) ;; *) die "outbox.stream_row() has no line '$XID_LINE'" ;; esac
STREAM_ROW_NO_XID=${STREAM_ROW/"$XID_LINE"/}
sql "SELECT outbox.stream_enable('slat', 4)" >/dev/null
TOOLS=$BUILD/tests/tools
ROW_ENQ=() ROW_ENQ_US=() WITH_XID=() WITHOUT_XID=() WITH_XID_US=() WITHOUT_XID_US=() ROW_RATE=() ROW_PG=() STREAM_RATE=() STREAM_PG=()
ROW_RSS=() STREAM_RSS=()
for round in $(seq 1 "$ROUNDS"); do
    log "round $round of $ROUNDS: enqueue_batch, row-state, then stream with and without the xid"
    enqueue_rate eb
    ROW_ENQ+=("$RATE") ROW_ENQ_US+=("$ENQUEUE_US")
    [ "$(sql "SELECT count(*) FROM outbox.job WHERE xid IS NOT NULL")" = 0 ] ||
        die "row-state rows recorded an xid"
    enqueue_rate es
    WITH_XID+=("$RATE") WITH_XID_US+=("$ENQUEUE_US")
    [ "$(sql "SELECT count(*) FROM outbox.job WHERE xid IS NULL OR state <> 'stream'")" = 0 ] ||
        die "stream rows without an xid"
    sql "$STREAM_ROW_NO_XID" >/dev/null
    enqueue_rate es
    sql "$STREAM_ROW" >/dev/null
    WITHOUT_XID+=("$RATE") WITHOUT_XID_US+=("$ENQUEUE_US")
    log "round $round of $ROUNDS: drain $N rows, row-state then stream"
    drain bench row-state
    ROW_RATE+=("$RATE") ROW_PG+=("$PG_US") ROW_RSS+=("$RSS_KB")
    drain sbench stream
    left=$(sql "SELECT count(*) FROM outbox.job AS j JOIN outbox.stream_cursor AS c
                ON c.queue = j.queue AND c.partition = j.stream_partition
                WHERE j.state = 'stream' AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)")
    [ "$left" = 0 ] || die "stream drain left $left rows after the cursors"
    STREAM_RATE+=("$RATE") STREAM_PG+=("$PG_US") STREAM_RSS+=("$RSS_KB")
done

if [ "$ROUNDS" -gt 0 ]; then
W=$(median "${WITH_XID[@]}")
WO=$(median "${WITHOUT_XID[@]}")
WU=$(median "${WITH_XID_US[@]}")
WOU=$(median "${WITHOUT_XID_US[@]}")
R=$(median "${ROW_RATE[@]}")
S=$(median "${STREAM_RATE[@]}")
RE=$(median "${ROW_ENQ[@]}")
REU=$(median "${ROW_ENQ_US[@]}")
result "enqueue_batch (1000 rows a call), row-state queue" "$(printf '%.0f' "$RE") rows/s" \
    "records no xid; PostgreSQL CPU $(printf '%.2f' "$REU") us/row; runs: $(runs "${ROW_ENQ[@]}")"
result "enqueue_batch, stream queue, xid recorded" "$(printf '%.0f' "$W") rows/s" \
    "without recording it $(printf '%.0f' "$WO") rows/s: cost $(printf '%.1f' "$(calc "(1 - $W / $WO) * 100")") % (goal <= 5); runs: $(runs "${WITH_XID[@]}") / $(runs "${WITHOUT_XID[@]}")"
result "  PostgreSQL CPU per enqueued stream row, xid recorded" "$(printf '%.2f' "$WU") us" \
    "without recording it $(printf '%.2f' "$WOU") us: cost $(printf '%.1f' "$(calc "($WU / $WOU - 1) * 100")") %; the stream trigger against a row-state row $(printf '%.1f' "$(calc "($WU / $REU - 1) * 100")") %; runs: $(runs "${WITH_XID_US[@]}") / $(runs "${WITHOUT_XID_US[@]}")"
result "drain to Redis, row-state (mark)" "$(printf '%.0f' "$R") rows/s" \
    "PostgreSQL CPU $(printf '%.1f' "$(median "${ROW_PG[@]}")") us/row; runs: $(runs "${ROW_RATE[@]}")"
result "drain to Redis, stream (4 partitions)" "$(printf '%.0f' "$S") rows/s" \
    "$(printf '%.2f' "$(calc "$S / $R")") x row-state (goal >= 2.5); runs: $(runs "${STREAM_RATE[@]}")"
result "  PostgreSQL CPU per relayed row, stream" "$(printf '%.1f' "$(median "${STREAM_PG[@]}")") us" \
    "goal <= 8; runs: $(runs "${STREAM_PG[@]}") us"
result "  relay max RSS, row-state / stream drain" \
    "$(($(median "${ROW_RSS[@]}") / 1024)) / $(($(median "${STREAM_RSS[@]}") / 1024)) MiB" \
    "runs: $(runs "${ROW_RSS[@]}") / $(runs "${STREAM_RSS[@]}") kB"
fi
if [ -x "$TOOLS/outbox_bench" ]; then
    for rate in $LATENCY_RATES; do
        log "commit -> broker latency at $rate rows/s, $LATENCY_SECONDS s: stream, then row-state"
        latency_run slat "$rate"
        result "stream commit -> Redis at $rate rows/s offered, p50 / p99" "$P50 / $P99 ms" \
            "max $PMAX ms; goal p99 <= 50; one run; load average $LOAD"
        late_rows
        latency_run rlat "$rate"
        result "row-state commit -> Redis at $rate rows/s offered, p50 / p99" "$P50 / $P99 ms" \
            "max $PMAX ms; the same relay options; one run; load average $LOAD"
        late_rows
    done
fi
