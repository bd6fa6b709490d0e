#!/bin/bash
# redis_ha.sh - drain rates to one Redis server, to a Sentinel-watched primary and to a
# Redis Cluster, with and without --redis-wait 1, measured in one run.
#
#   tests/bench/redis_ha.sh        (as root; BUILD and BIN as make sets them)
#
# Starts PostgreSQL and Redis (tests/harness/stack.sh) and a Sentinel deployment (primary,
# replica, three sentinels) and a Cluster (three masters with a replica each) with
# tests/harness/redis_ha.sh, all in one temp dir stopped on every exit path. Each drain is a
# backlog of BENCH_N rows (default 100000) over 8 queues, relayed by `outbox-relay --once`
# with default options, checked row by row (all succeeded) and entry by entry (the streams
# hold BENCH_N entries); then the Redis sink alone, without a database (sink_redis_throughput:
# batches of 500 over 8 streams), which shows the cost of --redis-wait without PostgreSQL's
# share. The targets run in turns, BENCH_ROUNDS times (default 3), and the medians are reported.
# A measuring script: it fails only when a step or a check fails.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
N=${BENCH_N:-100000}
ROUNDS=${BENCH_ROUNDS:-3}
QUEUES=8
PASSWORD=outbox-test-secret

log() { printf 'bench-ha: %s\n' "$*" >&2; }
die() {
    printf 'bench-ha: error: %s\n' "$*" >&2
    exit 1
}
[ -x "$BIN/outbox-relay" ] || die "missing $BIN/outbox-relay (run make)"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
SINK_TOOL=$BUILD/tests/tools/sink_redis_throughput
[ -x "$SINK_TOOL" ] || die "missing $SINK_TOOL (run make test-binaries)"

STACK=$(mktemp -d /tmp/outbox-bench-ha.XXXXXX)
chmod 755 "$STACK"
cleanup() {
    local status=$?
    "$ROOT/tests/harness/redis_ha.sh" stop "$STACK/sentinel" >/dev/null 2>&1 || true
    "$ROOT/tests/harness/redis_ha.sh" stop "$STACK/cluster" >/dev/null 2>&1 || true
    "$ROOT/tests/harness/stack.sh" stop "$STACK" >/dev/null 2>&1 || true
    rm -rf "$STACK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting PostgreSQL, Redis, a Sentinel deployment and a Cluster in $STACK"
"$ROOT/tests/harness/stack.sh" start "$STACK" postgres redis >"$STACK/stack.log" 2>&1 ||
    die "the stack did not start ($(tail -n 3 "$STACK/stack.log"))"
"$ROOT/tests/harness/redis_ha.sh" sentinel "$STACK/sentinel" || die "sentinel deployment failed"
"$ROOT/tests/harness/redis_ha.sh" cluster "$STACK/cluster" || die "cluster deployment failed"
# shellcheck disable=SC1091
. "$STACK/env"
# shellcheck disable=SC1091
. "$STACK/sentinel/env"
# shellcheck disable=SC1091
. "$STACK/cluster/env"
DB="${OUTBOX_TEST_PG_URL%/*}/outbox_bench_ha"
psql -X -q -v ON_ERROR_STOP=1 "$OUTBOX_TEST_PG_URL" -c "CREATE DATABASE outbox_bench_ha" >/dev/null
"$BIN/outboxctl" --database-url "$DB" migrate >/dev/null
sql() { psql -X -qAt -v ON_ERROR_STOP=1 "$DB" -c "$1"; }

PAYLOAD='{"order_id": 1234567, "event": "order.created", "customer": "c-0004711", "amount_cents": 129900, "currency": "EUR", "items": [{"sku": "sku-01", "qty": 2}], "pad": "xxxxxxxxxxxxxxxxxx"}'

# cli PORT ARGS...: redis-cli against one server of the run
cli() { REDISCLI_AUTH=$PASSWORD timeout 60 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

# entries PORTS: the entries of streams b0..b7 summed over the servers on PORTS (masters);
# each server counts the streams it owns (XLEN on a cluster master refuses the others)
entries() {
    local port q total=0 n
    for port in $1; do
        for ((q = 0; q < QUEUES; q++)); do
            n=$(cli "$port" XLEN "b$q" 2>/dev/null) || n=0
            case "$n" in '' | *[!0-9]*) n=0 ;; esac
            total=$((total + n))
        done
    done
    echo "$total"
}

# flush PORTS: empties every listed server (masters only)
flush() {
    local port
    for port in $1; do cli "$port" FLUSHALL >/dev/null 2>&1 || true; done
}

cluster_masters() {
    cli "${OUTBOX_TEST_CLUSTER_PORTS%%,*}" CLUSTER NODES | awk '$3 ~ /master/ { split($2, a, "[:@]"); print a[2] }'
}

# drain NAME BROKER MASTER_PORTS [RELAY OPTIONS...]: rows/s of one drain, into RATE
drain() {
    local name=$1 broker=$2 ports=$3 start end got
    shift 3
    flush "$ports"
    sql "TRUNCATE outbox.job" >/dev/null
    sql "INSERT INTO outbox.job (queue, payload)
         SELECT 'b' || (g % $QUEUES), '$PAYLOAD'::jsonb FROM generate_series(1, $N) AS g" >/dev/null
    sql "VACUUM ANALYZE outbox.job" >/dev/null
    start=$(date +%s.%N)
    timeout 600 "$BIN/outbox-relay" --database-url "$DB" --broker "$broker" --metrics-addr off \
        --log-level warn --once "$@" 2>"$STACK/relay-$name.log" ||
        die "outbox-relay --once to $name failed: $(tail -n 3 "$STACK/relay-$name.log")"
    end=$(date +%s.%N)
    got=$(sql "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'")
    [ "$got" = "$N" ] || die "$name: $got of $N rows succeeded"
    got=$(entries "$ports")
    [ "$got" = "$N" ] || die "$name: the streams hold $got entries, expected $N"
    RATE=$(awk -v n="$N" -v s="$end" -v t="$start" 'BEGIN { printf "%.0f", n / (s - t) }')
}

# sink_alone NAME URL WAIT: msg/s of the sink alone, into RATE
sink_alone() {
    local out
    out=$(timeout 600 "$SINK_TOOL" "$2" "$N" 200 500 "$3" "$QUEUES") ||
        die "sink_redis_throughput to $1 failed: $out"
    RATE=$(printf '%s\n' "$out" | sed -n 's/^sink .* = \([0-9]*\) msg\/s$/\1/p')
    [ -n "$RATE" ] || die "sink_redis_throughput to $1 printed no rate: $out"
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

SENTINEL_PRIMARY=$OUTBOX_TEST_SENTINEL_PRIMARY_PORT
MASTERS=$(cluster_masters | tr '\n' ' ')
declare -A RATES SINK_RATES
TARGETS="single sentinel sentinel-wait1 cluster cluster-wait1"
for ((round = 1; round <= ROUNDS; round++)); do
    for target in $TARGETS; do
        case "$target" in
        single) drain "$target" "$OUTBOX_TEST_REDIS_URL" "$OUTBOX_TEST_REDIS_PORT" ;;
        sentinel) drain "$target" "$OUTBOX_TEST_SENTINEL_URL" "$SENTINEL_PRIMARY" --redis-wait 0 ;;
        sentinel-wait1) drain "$target" "$OUTBOX_TEST_SENTINEL_URL" "$SENTINEL_PRIMARY" --redis-wait 1 ;;
        cluster) drain "$target" "$OUTBOX_TEST_CLUSTER_URL" "$MASTERS" --redis-wait 0 ;;
        cluster-wait1) drain "$target" "$OUTBOX_TEST_CLUSTER_URL" "$MASTERS" --redis-wait 1 ;;
        esac
        log "round $round: $target $RATE rows/s"
        RATES[$target]="${RATES[$target]:-} $RATE"
        case "$target" in
        single) sink_alone "$target" "$OUTBOX_TEST_REDIS_URL" 0 ;;
        sentinel) sink_alone "$target" "$OUTBOX_TEST_SENTINEL_URL" 0 ;;
        sentinel-wait1) sink_alone "$target" "$OUTBOX_TEST_SENTINEL_URL" 1 ;;
        cluster) sink_alone "$target" "$OUTBOX_TEST_CLUSTER_URL" 0 ;;
        cluster-wait1) sink_alone "$target" "$OUTBOX_TEST_CLUSTER_URL" 1 ;;
        esac
        log "round $round: $target sink alone $RATE msg/s"
        SINK_RATES[$target]="${SINK_RATES[$target]:-} $RATE"
    done
done

printf '\ndrain of %d rows over %d queues by outbox-relay --once (median of %d; rows/s)\n' "$N" "$QUEUES" "$ROUNDS"
for target in $TARGETS; do
    # shellcheck disable=SC2086
    printf '  %-16s %8s   (runs:%s)\n' "$target" "$(median ${RATES[$target]})" "${RATES[$target]}"
done

printf '\nthe Redis sink alone: %d messages in batches of 500 over %d streams (median of %d; msg/s)\n' "$N" "$QUEUES" "$ROUNDS"
for target in $TARGETS; do
    # shellcheck disable=SC2086
    printf '  %-16s %8s   (runs:%s)\n' "$target" "$(median ${SINK_RATES[$target]})" "${SINK_RATES[$target]}"
done
