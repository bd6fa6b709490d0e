#!/bin/bash
# longrun.sh - does outbox.job stay small under sustained load? (make soak, make bench)
#
#   tests/bench/longrun.sh steady|horizon|burst
#
# steady   LONGRUN_SECONDS (600) at LONGRUN_RATE rows/s (5000) offered in
#          10-row transactions of outbox.enqueue() into one relay with
#          default settings and --retention LONGRUN_RETENTION (1m), publishing to
#          Redis (the load: pgbench, 4 clients, paced with -R). Every 10 s it samples table and index bytes, dead tuples,
#          succeeded rows past the retention, ready rows, and the time of five
#          claims (EXPLAIN ANALYZE of the claim's candidate scan for 500 rows,
#          rolled back). Passes when the size plateaus (every sample of the last
#          LONGRUN_PLATEAU_SECONDS, default the last half up to 300 s, within
#          +-10 % of their mean), succeeded rows past the retention stay under one
#          minute of traffic, and claim p99 stays flat (the second half's p99 at
#          most twice the first half's after a warm-up, or 5 ms above it).
# horizon  the same load for LONGRUN_WARMUP_SECONDS (60), then one transaction
#          holds the xmin horizon for LONGRUN_HOLD_SECONDS (120), then
#          LONGRUN_RECOVERY_SECONDS (180) more; the relay runs with
#          --horizon-warning LONGRUN_WARNING (1m). Passes when the relay logged
#          its horizon warning, and after the transaction ended the dead tuples
#          fell below half their peak, succeeded rows past the retention went back
#          under one minute of traffic and claims went back to their warm-up p99
#          (twice it, or 5 ms above it).
# burst    the 600 000-row run: producers commit 1000-row transactions at about
#          12 000 rows/s (LONGRUN_BURST_ROWS, LONGRUN_BURST_RATE) into a relay
#          with --retention 5s; 100 s after the load stops it prints the
#          succeeded rows left and the table size. Measures, never fails on a
#          figure. LONGRUN_RELAY (default $BIN/outbox-relay) runs another build.
#
# Redis keeps little: streams are trimmed (--stream-maxlen 100000) and the
# dedup window is 2 minutes. Environment: BUILD, BIN (as make sets them);
# LONGRUN_TABLE_SQL (SQL run after the migrations, to compare table settings);
# LONGRUN_ENV, the env file of a stack already running (tests/harness/stack.sh),
# else the script starts and stops its own. Samples go to
# $BUILD/longrun/<mode>.tsv; the summary to stdout. Exit 1 when a pass
# criterion fails or a step breaks.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
STACK_SH="$ROOT/tests/harness/stack.sh"
MODE=${1:-}

SECONDS_TOTAL=${LONGRUN_SECONDS:-600}
RATE=${LONGRUN_RATE:-5000}
RETENTION=${LONGRUN_RETENTION:-1m}
WARMUP=${LONGRUN_WARMUP_SECONDS:-60}
HOLD=${LONGRUN_HOLD_SECONDS:-120}
RECOVERY=${LONGRUN_RECOVERY_SECONDS:-180}
WARNING=${LONGRUN_WARNING:-1m}
BURST_ROWS=${LONGRUN_BURST_ROWS:-600000}
BURST_RATE=${LONGRUN_BURST_RATE:-12000}
RELAY=${LONGRUN_RELAY:-$BIN/outbox-relay}
CTL=${LONGRUN_CTL:-$BIN/outboxctl}
SAMPLE_EVERY=10
# about 200 bytes of JSON, like the benchmark's
PAYLOAD='{"order_id": 1234567, "event": "order.created", "customer": "c-0004711", "amount_cents": 129900, "currency": "EUR", "items": [{"sku": "sku-01", "qty": 2}], "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'

die() {
    printf 'longrun: error: %s\n' "$*" >&2
    exit 1
}
log() { printf 'longrun: %s\n' "$*" >&2; }

case "$MODE" in steady | horizon | burst) ;; *) die "usage: longrun.sh steady|horizon|burst" ;; esac
PG_BIN=${OUTBOX_PG_BIN:-/usr/lib/postgresql/15/bin}
for program in "$RELAY" "$CTL" "$PG_BIN/pgbench"; do
    [ -x "$program" ] || die "missing $program (run 'make test-binaries')"
done

# seconds DURATION: 90s, 1m, 5s -> seconds (the forms this script uses)
seconds_of() {
    case "$1" in
    *m) echo $((${1%m} * 60)) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
    esac
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/outbox-longrun.XXXXXX")
OWN_STACK=""
RELAY_PID="" PRODUCER_PID="" HOLDER_PID=""
cleanup() {
    local status=$?
    for pid in $HOLDER_PID $PRODUCER_PID; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ -n "$RELAY_PID" ]; then
        kill -TERM "$RELAY_PID" 2>/dev/null || true
        wait "$RELAY_PID" 2>/dev/null || true
    fi
    if [ -n "${ADMIN_URL:-}" ] && [ -n "${DB_NAME:-}" ]; then
        psql -X -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    [ -n "${REDIS_PREFIX:-}" ] && redis_cli --scan --pattern "$REDIS_PREFIX*" 2>/dev/null |
        xargs -r -n 500 env REDISCLI_AUTH="${OUTBOX_TEST_REDIS_PASSWORD:-}" redis-cli -h 127.0.0.1 \
            -p "$OUTBOX_TEST_REDIS_PORT" DEL >/dev/null 2>&1 || true
    [ -n "$OWN_STACK" ] && "$STACK_SH" stop "$OWN_STACK" >/dev/null 2>&1
    rm -rf "$WORK" $OWN_STACK
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "${LONGRUN_ENV:-}" ]; then
    # shellcheck disable=SC1090
    . "$LONGRUN_ENV"
else
    OWN_STACK=$(mktemp -d "${TMPDIR:-/tmp}/outbox-longrun-stack.XXXXXX")
    chmod 755 "$OWN_STACK"
    "$STACK_SH" start "$OWN_STACK" postgres redis >"$WORK/stack.log" 2>&1 || {
        cat "$WORK/stack.log" >&2
        die "the stack did not start"
    }
    # shellcheck disable=SC1091
    . "$OWN_STACK/env"
fi
redis_cli() {
    REDISCLI_AUTH=${OUTBOX_TEST_REDIS_PASSWORD:-} redis-cli -h 127.0.0.1 \
        -p "$OUTBOX_TEST_REDIS_PORT" "$@"
}

ADMIN_URL=$OUTBOX_TEST_PG_URL
DB_NAME="outbox_longrun_${MODE}_$$"
DB="${OUTBOX_TEST_PG_URL%/*}/$DB_NAME"
REDIS_PREFIX="longrun$$:"
psql -X -q -v ON_ERROR_STOP=1 "$ADMIN_URL" -c "CREATE DATABASE $DB_NAME" >/dev/null
"$CTL" --database-url "$DB" migrate >/dev/null
sql() { psql -X -qAt -v ON_ERROR_STOP=1 "$DB" -c "$1"; }
# LONGRUN_TABLE_SQL: run after the migrations, e.g. to compare autovacuum settings
[ -z "${LONGRUN_TABLE_SQL:-}" ] || sql "$LONGRUN_TABLE_SQL" >/dev/null

mkdir -p "$BUILD/longrun"
SAMPLES="$BUILD/longrun/$MODE.tsv"
CLAIMS="$WORK/claims"
: >"$CLAIMS"

start_relay() {
    "$RELAY" --database-url "$DB" --broker "$OUTBOX_TEST_REDIS_URL" --metrics-addr off \
        --stream-prefix "$REDIS_PREFIX" --stream-maxlen 100000 --dedup-window 2m "$@" \
        2>"$WORK/relay.log" &
    RELAY_PID=$!
    sleep 1
    kill -0 "$RELAY_PID" 2>/dev/null || {
        cat "$WORK/relay.log" >&2
        die "the relay did not start"
    }
}

# start_producer ROWS RATE BATCH: pgbench commits ROWS rows in transactions of
# BATCH outbox.enqueue() calls, 4 clients, paced to RATE rows/s in total
start_producer() {
    local transactions=$(($1 / $3))
    printf "SELECT count(outbox.enqueue('longrun', '%s'::jsonb)) FROM generate_series(1, %d);\n" \
        "$PAYLOAD" "$3" >"$WORK/producer.sql"
    "$PG_BIN/pgbench" -n -c 4 -j 2 -t $((transactions / 4)) \
        -R "$(awk -v r="$2" -v b="$3" 'BEGIN { printf "%.3f", r / b }')" \
        -f "$WORK/producer.sql" "$DB" >"$WORK/producer.out" 2>&1 &
    PRODUCER_PID=$!
}

# stop_producer: ends the producer, which must still be running (it was given more rows)
stop_producer() {
    kill -0 "$PRODUCER_PID" 2>/dev/null || {
        cat "$WORK/producer.out" >&2
        die "the producer stopped early"
    }
    kill "$PRODUCER_PID" 2>/dev/null || true
    wait "$PRODUCER_PID" 2>/dev/null || true
    PRODUCER_PID=""
}

# claim_ms: one claim's candidate scan of 500 rows, in its own rolled back transaction
claim_ms() {
    psql -X -qAt -v ON_ERROR_STOP=1 "$DB" 2>/dev/null <<'EOF' |
BEGIN;
EXPLAIN (ANALYZE, FORMAT JSON)
SELECT job_id FROM outbox.job
 WHERE state = 'ready' AND NOT held AND run_at <= statement_timestamp()
 ORDER BY priority DESC, run_at, job_id LIMIT 500 FOR UPDATE SKIP LOCKED;
ROLLBACK;
EOF
        sed -n 's/.*"Execution Time": \([0-9.]*\).*/\1/p' | head -n 1
}

START=$(date +%s)
RETENTION_SECONDS=$(seconds_of "$RETENTION")
# sample PHASE: one line of figures, plus five claim timings in $CLAIMS
sample() {
    local t figures worst=0 ms
    t=$(($(date +%s) - START))
    figures=$(sql "SELECT pg_table_size('outbox.job') || ' ' || pg_indexes_size('outbox.job')
                   || ' ' || coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                                        WHERE relid = 'outbox.job'::regclass), 0)
                   || ' ' || (SELECT count(*) FROM outbox.job WHERE state = 'succeeded'
                                AND finished_at < now() - make_interval(secs => $RETENTION_SECONDS))
                   || ' ' || (SELECT count(*) FROM outbox.job WHERE state = 'ready')")
    for _ in 1 2 3 4 5; do
        ms=$(claim_ms)
        [ -n "$ms" ] || continue
        printf '%s %s %s\n' "$t" "$1" "$ms" >>"$CLAIMS"
        worst=$(awk -v a="$worst" -v b="$ms" 'BEGIN { print (b > a) ? b : a }')
    done
    # shellcheck disable=SC2086
    set -- "$1" $figures
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$1" "$2" "$3" "$4" "$5" "$6" "$worst" \
        >>"$SAMPLES"
    printf 'longrun: %4ss %-8s table %6.1f MB  indexes %6.1f MB  dead %8s  past retention %7s  ready %6s  claim max %s ms\n' \
        "$t" "$1" "$(awk -v b="$2" 'BEGIN { print b / 1048576 }')" \
        "$(awk -v b="$3" 'BEGIN { print b / 1048576 }')" "$4" "$5" "$6" "$worst" >&2
}

# p99 of the claim timings of samples with FILTER (an awk condition on t and phase)
claims_p99() {
    awk "$1 { print \$3 }" "$CLAIMS" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) { print 0; exit } i = int(NR * 0.99 + 0.999); if (i > NR) i = NR; print v[i] }'
}

# sample_until SECONDS PHASE: samples every 10 s for SECONDS (or until the producer ends)
sample_for() {
    local until=$(($(date +%s) + $1))
    while [ "$(date +%s)" -lt "$until" ]; do
        sleep "$SAMPLE_EVERY"
        sample "$2"
    done
}

printf 't\tphase\ttable_bytes\tindex_bytes\tdead_tuples\tpast_retention\tready\tclaim_max_ms\n' \
    >"$SAMPLES"
FAILED=0
verdict() { # verdict OK|FAIL TEXT
    printf '  %-4s %s\n' "$1" "$2"
    [ "$1" = ok ] || FAILED=1
}

case "$MODE" in
steady)
    log "steady: $RATE rows/s offered for ${SECONDS_TOTAL}s, --retention $RETENTION, default settings otherwise"
    start_relay --retention "$RETENTION"
    start_producer $((RATE * (SECONDS_TOTAL + 30))) "$RATE" 10
    sample_for "$SECONDS_TOTAL" steady
    stop_producer
    kill -0 "$RELAY_PID" 2>/dev/null || { tail -n 20 "$WORK/relay.log" >&2; die "the relay died"; }

    PLATEAU=${LONGRUN_PLATEAU_SECONDS:-$((SECONDS_TOTAL / 2 > 300 ? 300 : SECONDS_TOTAL / 2))}
    LAST_T=$(tail -n 1 "$SAMPLES" | cut -f1)
    FROM=$((LAST_T - PLATEAU))
    read -r MEAN LOW HIGH < <(awk -F'\t' -v from="$FROM" 'NR > 1 && $1 >= from {
            s = $3 + $4; sum += s; n++; if (n == 1 || s < lo) lo = s; if (s > hi) hi = s }
        END { printf "%.0f %.0f %.0f\n", sum / n, lo, hi }' "$SAMPLES")
    MAX_PAST=$(awk -F'\t' 'NR > 1 && $6 > m { m = $6 } END { print m + 0 }' "$SAMPLES")
    MAX_DEAD=$(awk -F'\t' 'NR > 1 && $5 > m { m = $5 } END { print m + 0 }' "$SAMPLES")
    HALF=$((LAST_T / 2))
    WARM=$((HALF / 3 < 60 ? HALF / 3 : 60)) # the first samples fill an empty table
    P99_FIRST=$(claims_p99 "\$1 >= $WARM && \$1 < $HALF")
    P99_SECOND=$(claims_p99 "\$1 >= $HALF")
    MB() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1048576 }'; }
    echo "steady load: $RATE rows/s offered for ${SECONDS_TOTAL}s, --retention $RETENTION"
    echo "  table + indexes over the last ${PLATEAU}s: mean $(MB "$MEAN"), min $(MB "$LOW"), max $(MB "$HIGH")"
    echo "  most succeeded rows past the retention in a sample: $MAX_PAST (one minute of traffic: $((RATE * 60)))"
    echo "  most dead tuples in a sample: $MAX_DEAD"
    echo "  claim of 500 rows, p99: ${P99_FIRST} ms (${WARM} s to half-time), ${P99_SECOND} ms (second half)"
    awk -v m="$MEAN" -v lo="$LOW" -v hi="$HIGH" 'BEGIN { exit !(lo >= 0.9 * m && hi <= 1.1 * m) }' &&
        verdict ok "size plateaus (last ${PLATEAU}s within +-10 %)" ||
        verdict FAIL "size plateaus (last ${PLATEAU}s within +-10 %)"
    [ "$MAX_PAST" -lt $((RATE * 60)) ] &&
        verdict ok "succeeded rows past the retention under one minute of traffic" ||
        verdict FAIL "succeeded rows past the retention under one minute of traffic"
    awk -v a="$P99_FIRST" -v b="$P99_SECOND" 'BEGIN { exit !(b <= 2 * a || b <= a + 5) }' &&
        verdict ok "claim p99 flat" || verdict FAIL "claim p99 flat"
    ;;
horizon)
    TOTAL=$((WARMUP + HOLD + RECOVERY))
    log "horizon: $RATE rows/s; a transaction holds the horizon from ${WARMUP}s for ${HOLD}s, then ${RECOVERY}s more"
    start_relay --retention "$RETENTION" --horizon-warning "$WARNING"
    start_producer $((RATE * (TOTAL + 30))) "$RATE" 10
    sample_for "$WARMUP" warmup
    psql -X -q "$DB" >/dev/null 2>&1 <<EOF &
SET application_name = 'longrun-holder';
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM outbox.job WHERE job_id < 0;
SELECT pg_sleep($HOLD);
COMMIT;
EOF
    HOLDER_PID=$!
    sample_for "$HOLD" hold
    wait "$HOLDER_PID" 2>/dev/null || true
    HOLDER_PID=""
    sample_for "$RECOVERY" recovery
    stop_producer
    kill -0 "$RELAY_PID" 2>/dev/null || { tail -n 20 "$WORK/relay.log" >&2; die "the relay died"; }

    PEAK_DEAD=$(awk -F'\t' 'NR > 1 && $5 > m { m = $5 } END { print m + 0 }' "$SAMPLES")
    END_DEAD=$(awk -F'\t' '$2 == "recovery" { v = $5 } END { print v + 0 }' "$SAMPLES")
    MIN_RECOVERY_DEAD=$(awk -F'\t' '$2 == "recovery" && (n++ == 0 || $5 < m) { m = $5 } END { print m + 0 }' "$SAMPLES")
    HOLD_PAST=$(awk -F'\t' '$2 == "hold" && $6 > m { m = $6 } END { print m + 0 }' "$SAMPLES")
    END_PAST=$(awk -F'\t' '$2 == "recovery" { v = $6 } END { print v + 0 }' "$SAMPLES")
    SIZE_HOLD_END=$(awk -F'\t' '$2 == "hold" { v = $3 + $4 } END { print v + 0 }' "$SAMPLES")
    SIZE_END=$(awk -F'\t' '$2 == "recovery" { v = $3 + $4 } END { print v + 0 }' "$SAMPLES")
    P99_WARM=$(claims_p99 "\$2 == \"warmup\"")
    P99_HOLD=$(claims_p99 "\$2 == \"hold\"")
    RECOVERY_FROM=$(awk -F'\t' '$2 == "recovery" { print $1; exit }' "$SAMPLES")
    P99_LATE=$(claims_p99 "\$2 == \"recovery\" && \$1 >= $((RECOVERY_FROM + RECOVERY / 2))")
    WARNED=$(grep -c "holds back vacuum" "$WORK/relay.log" || true)
    MB() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1048576 }'; }
    echo "horizon: $RATE rows/s, --retention $RETENTION; one transaction open for ${HOLD}s after ${WARMUP}s"
    echo "  relay horizon warnings logged: $WARNED ($(grep -m 1 "holds back vacuum" "$WORK/relay.log" | cut -c1-160))"
    echo "  dead tuples: peak $PEAK_DEAD, lowest after the transaction ended $MIN_RECOVERY_DEAD, at the end $END_DEAD"
    echo "  succeeded rows past the retention: at most $HOLD_PAST while held, $END_PAST at the end"
    echo "  table + indexes: $(MB "$SIZE_HOLD_END") when the transaction ended, $(MB "$SIZE_END") at the end"
    echo "  claim of 500 rows, p99: ${P99_WARM} ms warm-up, ${P99_HOLD} ms held, ${P99_LATE} ms in the second half of the recovery"
    [ "$WARNED" -ge 1 ] && verdict ok "the relay warned about the open transaction" ||
        verdict FAIL "the relay warned about the open transaction"
    [ "$MIN_RECOVERY_DEAD" -le $((PEAK_DEAD / 2)) ] &&
        verdict ok "dead tuples fell below half their peak after the transaction ended" ||
        verdict FAIL "dead tuples fell below half their peak after the transaction ended"
    [ "$END_PAST" -lt $((RATE * 60)) ] &&
        verdict ok "succeeded rows past the retention back under one minute of traffic" ||
        verdict FAIL "succeeded rows past the retention back under one minute of traffic"
    awk -v a="$P99_WARM" -v b="$P99_LATE" 'BEGIN { exit !(b <= 2 * a || b <= a + 5) }' &&
        verdict ok "claims back to their warm-up p99" ||
        verdict FAIL "claims back to their warm-up p99"
    ;;
burst)
    log "burst: $BURST_ROWS rows in 1000-row transactions at about $BURST_RATE rows/s, --retention 5s, relay $RELAY"
    start_relay --retention 5s
    LOAD_START=$(date +%s)
    start_producer "$BURST_ROWS" "$BURST_RATE" 1000
    while kill -0 "$PRODUCER_PID" 2>/dev/null; do
        sleep "$SAMPLE_EVERY"
        sample load
    done
    wait "$PRODUCER_PID" || { cat "$WORK/producer.out" >&2; die "the producer failed"; }
    PRODUCER_PID=""
    LOAD_SECONDS=$(($(date +%s) - LOAD_START))
    sample_for 100 after
    read -r SUCCEEDED READY TOTAL < <(sql "SELECT count(*) FILTER (WHERE state = 'succeeded'),
        count(*) FILTER (WHERE state <> 'succeeded'), count(*) FROM outbox.job" | tr '|' ' ')
    MAX_READY=$(awk -F'\t' 'NR > 1 && $7 > m { m = $7 } END { print m + 0 }' "$SAMPLES")
    LAST=$(tail -n 1 "$SAMPLES")
    echo "burst: $BURST_ROWS rows, 1000-row transactions in ${LOAD_SECONDS}s ($((BURST_ROWS / LOAD_SECONDS)) rows/s), relay --retention 5s"
    echo "  most ready rows in a sample during the load: $MAX_READY"
    echo "  100 s after the load stopped: $SUCCEEDED succeeded rows left ($READY not succeeded),"
    echo "  table $(echo "$LAST" | awk -F'\t' '{ printf "%.1f MB", $3 / 1048576 }'), indexes $(echo "$LAST" | awk -F'\t' '{ printf "%.1f MB", $4 / 1048576 }'), dead tuples $(echo "$LAST" | cut -f5)"
    ;;
esac
echo "  samples: $SAMPLES"
exit "$FAILED"
