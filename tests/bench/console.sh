#!/bin/bash
# console.sh - how fast the console answers on a big table: seeds
# CONSOLE_BENCH_ROWS (1 000 000) rows over CONSOLE_BENCH_QUEUES (1 000) queues in
# their own database (90 % succeeded, 9 % ready, 0.9 % dead, 0.1 % running under 4
# relays, a tenth with ordering keys), the newest CONSOLE_BENCH_RECENT (556 000) of
# them created and finished in the last hour, so that about 500 000 rows were
# published in it, the rest over the 23 hours before; analyzes it, starts
# `outboxctl serve` and times every page and every GET of the API,
# CONSOLE_BENCH_REQUESTS (20) times each (target: median <= 100 ms); then
# GET /api/v1/session and /static/console.css while CONSOLE_BENCH_CLIENTS (16)
# clients reload the overview beside them (none may wait for another).
#
# Needs OUTBOX_TEST_PG_URL (the "postgres" database of a test server) and BIN.
# Prints one result line per page on stdout; tests/bench/run.sh appends them
# to its report. Fails only when a step fails, never because a figure is high.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-bin}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
ROWS=${CONSOLE_BENCH_ROWS:-1000000}
QUEUES=${CONSOLE_BENCH_QUEUES:-1000}
RECENT=${CONSOLE_BENCH_RECENT:-556000}
CLIENTS=${CONSOLE_BENCH_CLIENTS:-16}
REQUESTS=${CONSOLE_BENCH_REQUESTS:-20}
ADMIN_URL=${OUTBOX_TEST_PG_URL:?OUTBOX_TEST_PG_URL is not set}
NAME=outbox_bench_console_$$
DB=${ADMIN_URL%/*}/$NAME
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/outbox-console-bench.XXXXXX")
console_pid=""

cleanup() {
    [ -n "$console_pid" ] && kill "$console_pid" 2>/dev/null && wait "$console_pid" 2>/dev/null
    psql -X -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $NAME WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$SCRATCH"
}
trap cleanup EXIT

psql -X -q -v ON_ERROR_STOP=1 "$ADMIN_URL" -c "CREATE DATABASE $NAME" >/dev/null
"$BIN/outboxctl" --database-url "$DB" migrate >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -v rows="$ROWS" -v queues="$QUEUES" -v recent="$RECENT" \
    "$DB" >/dev/null <<'SQL'
-- the age of row i: the newest :recent rows over the last hour, the others the 23 hours before
CREATE FUNCTION pg_temp.age_of(i bigint, total bigint, recent bigint) RETURNS interval
    LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN i > total - recent
                THEN 3600 * (1 - (i - (total - recent))::float8 / recent) * interval '1 second'
                ELSE interval '1 hour'
                     + 82800 * (1 - i::float8 / greatest(total - recent, 1)) * interval '1 second'
           END $$;
INSERT INTO outbox.job (queue, payload, state, attempts, ordering_key, run_at, created_at,
                        finished_at, last_error, worker_id, lease_until)
SELECT 'queue-' || ((i / 1000) % :queues),
       jsonb_build_object('order', i, 'note', 'a payload of a realistic size for the console'),
       s.state, CASE WHEN s.state = 'ready' THEN 0 ELSE 1 END,
       CASE WHEN i % 10 = 3 THEN 'key-' || (i % 5000) END,
       now() - interval '1 hour', now() - pg_temp.age_of(i, :rows, :recent),
       CASE WHEN s.state IN ('succeeded', 'dead')
            THEN now() - pg_temp.age_of(i, :rows, :recent) END,
       CASE WHEN s.state = 'dead' THEN 'broker refused the message #' || i END,
       CASE WHEN s.state = 'running' THEN 'relay-' || (i % 4) END,
       CASE WHEN s.state = 'running' THEN now() + interval '30 seconds' END
  FROM generate_series(1, :rows) AS i
 CROSS JOIN LATERAL (SELECT CASE WHEN i % 100 < 90 THEN 'succeeded'
                                 WHEN i % 1000 < 989 THEN 'ready'
                                 WHEN i % 1000 < 999 THEN 'dead'
                                 ELSE 'running' END AS state) AS s;
SQL
psql -X -q "$DB" -c "VACUUM ANALYZE outbox.job" >/dev/null

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN/outboxctl" serve --listen "127.0.0.1:$port" --database-url "$DB" >"$SCRATCH/console.log" 2>&1 &
console_pid=$!
for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/static/console.css" 2>/dev/null && break
    sleep 0.1
done

# CPU time (ms) so far of the console and of its PostgreSQL backends (one per worker): on a
# shared host the wall time follows the load, the CPU time per request does not.
backend_pids() {
    psql -X -At "$DB" -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'outboxctl serve'"
}
cpu_ms() {
    local ticks files=("/proc/$console_pid/stat")
    ticks=$(getconf CLK_TCK)
    for pid in $(backend_pids); do files+=("/proc/$pid/stat"); done
    awk -v t="$ticks" '{ sum += $14 + $15 } END { printf "%.0f", sum * 1000 / t }' "${files[@]}" 2>/dev/null
}

# Median and max of REQUESTS timed GETs of path in ms, and CPU ms per request (one warm-up first).
time_path() {
    local path=$1 times before after
    curl -fsS -o /dev/null "http://127.0.0.1:$port$path"
    before=$(cpu_ms)
    times=$(for _ in $(seq 1 "$REQUESTS"); do
        curl -fsS -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$port$path"
    done | sort -n)
    after=$(cpu_ms)
    awk -v cpu=$(((after - before) / REQUESTS)) '{ t[NR] = $1 * 1000 } END {
        printf "median %.0f ms, max %.0f ms wall; %d ms CPU (console + PostgreSQL)",
            t[int((NR + 1) / 2)], t[NR], cpu }' <<<"$times"
}

size=$(psql -X -At "$DB" -c "SELECT pg_size_pretty(pg_total_relation_size('outbox.job'))")
hour=$(psql -X -At "$DB" -c "SELECT count(*) FROM outbox.job WHERE state = 'succeeded' AND finished_at >= now() - interval '1 hour'")
echo "  console at $ROWS rows / $QUEUES queues ($size), $hour published in the last hour, $REQUESTS requests each (target <= 100 ms; load average $(cut -d' ' -f1 /proc/loadavg) on $(nproc) CPUs):"
for path in / /dead /keys /replay /api/v1/overview /api/v1/queues /api/v1/blocked /api/v1/paused \
    /api/v1/relays /api/v1/chart /api/v1/streams "/api/v1/dead?limit=100"; do
    printf '    GET %-22s %s\n' "$path" "$(time_path "$path")"
done
grep -q "succeeded_estimated\":true" <(curl -fsS "http://127.0.0.1:$port/api/v1/overview") &&
    echo "    (succeeded per queue estimated from planner statistics; ready, running, dead exact)"

# none waits for another: small GETs while CLIENTS clients reload the overview beside them
busy=()
for _ in $(seq 1 "$CLIENTS"); do
    (for _ in $(seq 1 "$REQUESTS"); do curl -fsS -o /dev/null "http://127.0.0.1:$port/"; done) &
    busy+=($!)
done
sleep 0.2
for path in /api/v1/session /static/console.css; do
    beside=$(for _ in $(seq 1 "$REQUESTS"); do
        curl -fsS -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$port$path"
    done | sort -n | awk '{ t[NR] = $1 * 1000 } END { printf "median %.0f ms, max %.0f ms", t[int((NR + 1) / 2)], t[NR] }')
    echo "    GET $path beside $CLIENTS clients reloading the overview: $beside wall"
done
wait "${busy[@]}"
