#!/bin/bash
# databases.sh - one relay for many databases (outbox-relay --databases):
#
#  idle: DATABASES_BENCH_COUNT (200) idle databases, --max-db-connections 16:
#        the relay's RSS, the CPU PostgreSQL spends on the relay's idle work
#        (the postmaster's own and reaped children's CPU plus the live
#        backends', over DATABASES_BENCH_SECONDS with no row written, less
#        the same window with no relay), then, with one row a fifth of a
#        second going into a random idle database, what each such row costs
#        PostgreSQL on the relay's side (less the same rows with no relay)
#        and commit -> publish (p50/p99).
#  busy: DATABASES_BENCH_BUSY (10) of them hold DATABASES_BENCH_ROWS (20 000)
#        rows each, all due at one time once the relay has looked at every
#        database, nothing else written (as in the run it is held against):
#        the aggregate drain, against one relay (--database-url, default
#        concurrency, --once) draining the same total from one database;
#        DATABASES_BENCH_RUNS (3) of each in turns, and their medians (one
#        drain of either varies by a fifth from run to run on a small host).
#  hot:  one of them holds that total: its drain, and commit -> publish of
#        single rows going into the quiet databases meanwhile (p50/p99).
#
#  session: a pooled application session of one database updates a business row
#        and 0.3 s later enqueues, every 1.5 s, DATABASES_BENCH_SESSION_ROUNDS (20)
#        times: commit -> publish (p50/p99) of those rows (the backend reported the
#        update's statistics a moment before the enqueue; sql/023 has the insert's
#        report go at its commit).
#
#  roles: the idle run again, each database's list line logging in as a role of its own
#        (database per tenant, each with its relay role): PostgreSQL CPU on the relay's
#        idle work and commit -> publish, against the idle run's one role.
#  stalled: DATABASES_BENCH_LOCKED (3) databases held by a session's LOCK TABLE outbox.job
#        and DATABASES_BENCH_HUNG (10) listed servers that accept connections and never
#        answer, beside the others, budget 4: commit -> publish of single rows going into
#        the healthy databases (a bad tenant may cost its own rows, not others').
#
# DATABASES_BENCH_IDLE=0 skips the idle run, DATABASES_BENCH_SESSION=0 the session run,
# DATABASES_BENCH_ROLES=0 the roles run, DATABASES_BENCH_STALLED=0 the stalled run;
# DATABASES_BENCH_BUSY=0 runs those alone.
#
# Needs OUTBOX_TEST_PG_URL, OUTBOX_TEST_PG_PORT, OUTBOX_TEST_REDIS_URL,
# OUTBOX_TEST_STACK_DIR (a stack of tests/harness/stack.sh with outbox_template)
# and BIN. Prints result lines on stdout; fails only when a step fails.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-bin}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
COUNT=${DATABASES_BENCH_COUNT:-200}
BUSY=${DATABASES_BENCH_BUSY:-10}
ROWS=${DATABASES_BENCH_ROWS:-20000}
SECONDS_IDLE=${DATABASES_BENCH_SECONDS:-20}
BUDGET=${DATABASES_BENCH_BUDGET:-16}
RUNS=${DATABASES_BENCH_RUNS:-3}
ADMIN_URL=${OUTBOX_TEST_PG_URL:?OUTBOX_TEST_PG_URL is not set}
REDIS_URL=${OUTBOX_TEST_REDIS_URL:?OUTBOX_TEST_REDIS_URL is not set}
STACK=${OUTBOX_TEST_STACK_DIR:?OUTBOX_TEST_STACK_DIR is not set}
BASE=${ADMIN_URL%/*}
PREFIX=bdb$$
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/outbox-databases-bench.XXXXXX")
LIST=$SCRATCH/databases.list
relay_pid=""

redis_cli() {
    local rest=${REDIS_URL#redis://} password="" hostport
    case "$rest" in *@*) password=${rest%%@*}; password=${password#:}; rest=${rest#*@} ;; esac
    hostport=${rest%%/*}
    redis-cli -h "${hostport%:*}" -p "${hostport##*:}" ${password:+-a "$password"} \
        --no-auth-warning "$@"
}

stall_pids=""

cleanup() {
    [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null && wait "$relay_pid" 2>/dev/null
    # shellcheck disable=SC2086
    [ -n "$stall_pids" ] && kill $stall_pids 2>/dev/null
    for i in $(seq 1 "$COUNT"); do
        psql -X -q "$ADMIN_URL" -c "DROP ROLE IF EXISTS ${PREFIX}_r$i" >/dev/null 2>&1 || true
    done
    for i in $(seq 0 "$COUNT") single; do
        psql -X -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS ${PREFIX}_$i WITH (FORCE)" \
            >/dev/null 2>&1 || true
    done
    # the streams, and the relay's dedup keys beside them ({PREFIX:queue}:outbox-dedup:...)
    redis_cli --scan --pattern "*$PREFIX:*" | sed 's/^/DEL /' | redis_cli >/dev/null
    rm -rf "$SCRATCH"
}
trap cleanup EXIT

# A database from the template with an identity of its own.
make_database() {
    psql -X -q -v ON_ERROR_STOP=1 "$ADMIN_URL" \
        -c "CREATE DATABASE $1 TEMPLATE outbox_template" >/dev/null
    psql -X -q -v ON_ERROR_STOP=1 "$BASE/$1" -c "SELECT outbox.identity_set('$1')" >/dev/null
}

# CPU seconds of the PostgreSQL server: the postmaster, its reaped children, its live ones.
postgres_cpu() {
    local master ticks
    master=$(head -1 "$STACK/pg/postmaster.pid")
    ticks=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$master/stat")
    for child in $(pgrep -P "$master"); do
        ticks=$((ticks + $(awk '{print $14 + $15}' "/proc/$child/stat" 2>/dev/null || echo 0)))
    done
    echo "scale=3; $ticks / $(getconf CLK_TCK)" | bc
}

# Inserts one row stamped with its commit time into database $1.
stamp_row() {
    psql -X -q "$BASE/$1" -c "SELECT outbox.enqueue('probe', jsonb_build_object('t',
        (extract(epoch from clock_timestamp()) * 1000)::bigint))" >/dev/null
}

# p50 and p99 of publish - commit (ms) over the probe stream's entries.
probe_latency() {
    redis_cli xrange "$PREFIX:probe" - + | awk '
        /^[0-9]+-[0-9]+$/ { id = $1; sub(/-.*/, "", id) }
        /"t": / { t = $0; sub(/.*"t": /, "", t); sub(/[^0-9].*/, "", t); print id - t }' |
        sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "none"; exit }
            p99 = int(NR * 0.99 + 0.5); if (p99 > NR) p99 = NR
            printf "p50 %d ms, p99 %d ms over %d rows\n", v[int(NR * 0.5 + 0.5)], v[p99], NR }'
}

# PostgreSQL CPU (% of a core) over DATABASES_BENCH_SECONDS with nothing written.
quiet_window() {
    local before after
    before=$(postgres_cpu)
    sleep "$SECONDS_IDLE"
    after=$(postgres_cpu)
    echo "scale=2; ($after - $before) * 100 / $SECONDS_IDLE" | bc
}

# PostgreSQL CPU (% of a core) while one row a fifth of a second goes into a random idle database.
probe_window() {
    local before started ended after
    before=$(postgres_cpu)
    started=$(date +%s.%N)
    while [ "$(echo "$(date +%s.%N) - $started < $SECONDS_IDLE" | bc)" = 1 ]; do
        stamp_row "${PREFIX}_$((RANDOM % COUNT + 1))"
        sleep 0.2
    done
    after=$(postgres_cpu)
    ended=$(date +%s.%N)
    echo "scale=2; ($after - $before) * 100 / ($ended - $started)" | bc
}

start_relay() {
    "$BIN/outbox-relay" "$@" --broker "$REDIS_URL" --stream-prefix "$PREFIX:" --metrics-addr off \
        >"$SCRATCH/relay.log" 2>&1 &
    relay_pid=$!
}

stop_relay() {
    kill "$relay_pid" && wait "$relay_pid" || true
    relay_pid=""
}

echo "databases: making $COUNT databases" >&2
: >"$LIST"
for i in $(seq 1 "$COUNT"); do
    make_database "${PREFIX}_$i"
    echo "d$i $BASE/${PREFIX}_$i" >>"$LIST"
done

# ---- idle ----
if [ "${DATABASES_BENCH_IDLE:-1}" = 1 ]; then
    quiet=$(quiet_window)    # the server's own idle cost, no relay
    baseline=$(probe_window) # the rows' own cost, no relay
    psql -X -q "$ADMIN_URL" -c "SELECT 1" >/dev/null
    for i in $(seq 1 "$COUNT"); do psql -X -q "$BASE/${PREFIX}_$i" -c "DELETE FROM outbox.job" >/dev/null; done
    start_relay --databases "$LIST" --max-db-connections "$BUDGET"
    sleep 10
    idle=$(quiet_window)
    spent=$(probe_window)
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$relay_pid/status")
    sleep 2
    rows=$(redis_cli xlen "$PREFIX:probe")
    echo "databases idle: $COUNT databases, budget $BUDGET: relay RSS $((rss / 1024)) MiB;" \
         "PostgreSQL CPU on the relay's idle work $(echo "scale=2; $idle - $quiet" | bc) % of a core" \
         "($idle % with the relay, $quiet % without, no rows written);" \
         "one row a fifth of a second into a random idle database: $spent % with the relay," \
         "$baseline % for the rows alone, so $(echo "scale=1; ($spent - $baseline) * 10 * $SECONDS_IDLE / $rows" | bc) ms" \
         "of PostgreSQL CPU a row on the relay's side; commit -> publish $(probe_latency)"
    stop_relay
    redis_cli del "$PREFIX:probe" >/dev/null
fi

# ---- session: a busy pooled session's rows ----
if [ "${DATABASES_BENCH_SESSION:-1}" = 1 ]; then
    psql -X -q "$BASE/${PREFIX}_1" -c "CREATE TABLE public.account (id int PRIMARY KEY,
        balance int); INSERT INTO public.account VALUES (1, 0)" >/dev/null
    start_relay --databases "$LIST" --max-db-connections "$BUDGET"
    sleep 10
    coproc SESSION { psql -X -q "$BASE/${PREFIX}_1" >/dev/null; }
    for round in $(seq 1 "${DATABASES_BENCH_SESSION_ROUNDS:-20}"); do
        echo "UPDATE public.account SET balance = balance + 1;" >&"${SESSION[1]}"
        sleep 0.3
        echo "SELECT outbox.enqueue('probe', jsonb_build_object('t',
            (extract(epoch from clock_timestamp()) * 1000)::bigint));" >&"${SESSION[1]}"
        sleep 1.2
    done
    sleep 2
    echo "databases session: $COUNT databases, budget $BUDGET; a session that updated a" \
         "business row 0.3 s before each enqueue: commit -> publish $(probe_latency)"
    kill "$SESSION_PID" 2>/dev/null || true
    wait "$SESSION_PID" 2>/dev/null || true
    stop_relay
    redis_cli del "$PREFIX:probe" >/dev/null
fi

# ---- roles: a login role per tenant database ----
if [ "${DATABASES_BENCH_ROLES:-1}" = 1 ]; then
    echo "databases: a relay role per database" >&2
    : >"$SCRATCH/roles.list"
    for i in $(seq 1 "$COUNT"); do
        psql -X -q -v ON_ERROR_STOP=1 "$BASE/${PREFIX}_$i" -f "$ROOT/sql/roles/outbox_relay_role.sql" \
            -c "CREATE ROLE ${PREFIX}_r$i LOGIN IN ROLE outbox_relay" >/dev/null
        echo "d$i ${BASE/postgres@/${PREFIX}_r$i@}/${PREFIX}_$i" >>"$SCRATCH/roles.list"
    done
    quiet=$(quiet_window)
    baseline=$(probe_window)
    for i in $(seq 1 "$COUNT"); do psql -X -q "$BASE/${PREFIX}_$i" -c "DELETE FROM outbox.job" >/dev/null; done
    start_relay --databases "$SCRATCH/roles.list" --max-db-connections "$BUDGET"
    sleep 10
    idle=$(quiet_window)
    spent=$(probe_window)
    sleep 2
    echo "databases roles: $COUNT databases, a relay login role each, budget $BUDGET:" \
         "PostgreSQL CPU on the relay's idle work $(echo "scale=2; $idle - $quiet" | bc) % of a core" \
         "($idle % with the relay, $quiet % without, no rows written); one row a fifth of a second" \
         "into a random idle database: $spent % with the relay, $baseline % for the rows alone;" \
         "commit -> publish $(probe_latency)"
    stop_relay
    redis_cli del "$PREFIX:probe" >/dev/null
fi

# ---- stalled: tenants holding their table locked and servers that never answer ----
if [ "${DATABASES_BENCH_STALLED:-1}" = 1 ]; then
    locked=${DATABASES_BENCH_LOCKED:-3} hung=${DATABASES_BENCH_HUNG:-10}
    echo "databases: $locked databases locked, $hung servers that never answer" >&2
    cp "$LIST" "$SCRATCH/stalled.list"
    for i in $(seq 1 "$hung"); do
        port=$((OUTBOX_TEST_PG_PORT + 100 + i))
        # listens and takes connections, never says a word
        python3 -c "import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port)); s.listen(64); held = []
while True: held.append(s.accept()[0])" &
        stall_pids="$stall_pids $!"
        echo "hung$i postgresql://postgres@127.0.0.1:$port/hung?connect_timeout=10" >>"$SCRATCH/stalled.list"
    done
    for i in $(seq 1 "$locked"); do
        psql -X -q "$BASE/${PREFIX}_$i" -c "BEGIN; LOCK TABLE outbox.job; SELECT pg_sleep(3600)" \
            >/dev/null 2>&1 &
        stall_pids="$stall_pids $!"
    done
    start_relay --databases "$SCRATCH/stalled.list" --max-db-connections 4
    sleep 10
    started=$(date +%s.%N)
    while [ "$(echo "$(date +%s.%N) - $started < $SECONDS_IDLE" | bc)" = 1 ]; do
        stamp_row "${PREFIX}_$((locked + 1 + RANDOM % (COUNT - locked)))"
        sleep 0.2
    done
    sleep 2
    echo "databases stalled: $((COUNT - locked)) healthy databases beside $locked held by LOCK" \
         "TABLE outbox.job and $hung servers that never answer, budget 4: the healthy ones'" \
         "commit -> publish $(probe_latency)"
    stop_relay
    # shellcheck disable=SC2086
    kill $stall_pids 2>/dev/null
    wait 2>/dev/null
    stall_pids=""
    psql -X -q "$ADMIN_URL" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE query LIKE '%pg_sleep(3600)%' AND pid <> pg_backend_pid()" >/dev/null
    redis_cli del "$PREFIX:probe" >/dev/null
fi

# Loads database $1 with $2 rows due at $3 (epoch seconds), analyzed as autovacuum would
# have it in a steady state: else the claim's plan depends on whether autovacuum reached
# the table before the run. An earlier run's rows go first, their room vacuumed for reuse.
load_database() {
    psql -X -q "$BASE/$1" -c "DELETE FROM outbox.job" -c "VACUUM outbox.job" \
        -c "SELECT count(outbox.enqueue('load', '{}',
        run_at => to_timestamp($3))) FROM generate_series(1, $2)" \
        -c "ANALYZE outbox.job" >/dev/null
}

# Each timed drain starts from a checkpoint: one that starts within a drain (every
# max_wal_size of WAL) makes each page's next change write the whole page, and would
# slow whichever side it fell in.
checkpoint() {
    psql -X -q "$ADMIN_URL" -c CHECKPOINT >/dev/null
}

# Drains $1 databases of $2 rows each with the relay of the list; the rows are due at one
# time, once they are loaded (about a second per 20 000 rows) and the relay has started and
# looked at every database (each a connect), so the drain is the steady state's. With $3 = probe, one row a tenth of a second goes into a
# random quiet database meanwhile. Sets rate (rows/s).
drain_list() {
    local due started
    due=$(($(date +%s) + 20 + $1 * $2 / 20000))
    for i in $(seq 1 "$1"); do load_database "${PREFIX}_$i" "$2" "$due"; done
    start_relay --databases "$LIST" --max-db-connections "$BUDGET"
    while [ "$(date +%s)" -lt "$((due - 2))" ]; do sleep 0.1; done
    checkpoint
    while [ "$(date +%s)" -lt "$due" ]; do sleep 0.1; done
    started=$(date +%s.%N)
    while [ "$(redis_cli xlen "$PREFIX:load")" -lt $(($1 * $2)) ]; do
        if [ "$3" = probe ]; then
            stamp_row "${PREFIX}_$(($1 + 1 + RANDOM % (COUNT - $1)))"
        fi
        sleep 0.1
    done
    rate=$(echo "scale=0; $1 * $2 / ($(date +%s.%N) - $started)" | bc)
    sleep 2
    stop_relay
    redis_cli del "$PREFIX:load" >/dev/null
}

# ---- against one relay on one database ----
if [ "$BUSY" -eq 0 ]; then # DATABASES_BENCH_BUSY=0: the idle run alone
    exit 0
fi
total=$((BUSY * ROWS))
make_database "${PREFIX}_single"

# Drains the same total from one database with one relay. Sets single (rows/s).
drain_single() {
    local started
    load_database "${PREFIX}_single" "$total" "$(date +%s)"
    checkpoint
    started=$(date +%s.%N)
    "$BIN/outbox-relay" --database-url "$BASE/${PREFIX}_single" --once --broker "$REDIS_URL" \
        --stream-prefix "$PREFIX:" --metrics-addr off >>"$SCRATCH/relay.log" 2>&1
    single=$(echo "scale=0; $total / ($(date +%s.%N) - $started)" | bc)
    redis_cli del "$PREFIX:load" >/dev/null
}

median() {
    tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# ---- busy: BUSY databases drain, as the single relay drains, with nothing else written ----
singles="" lists=""
for run in $(seq 1 "$RUNS"); do
    drain_single
    drain_list "$BUSY" "$ROWS" quiet
    singles="$singles $single" lists="$lists $rate"
    echo "databases: run $run: $rate rows/s from the list, $single rows/s from one database" >&2
done
rate=$(echo $lists | median) single=$(echo $singles | median)
echo "databases busy: $BUSY of $COUNT databases with $ROWS rows each, budget $BUDGET:" \
     "$rate rows/s against $single rows/s of one relay on one database" \
     "(ratio $(echo "scale=2; $rate / $single" | bc); medians of $RUNS runs in turns:" \
     "list$lists, one database$singles)"

# ---- hot: one database drains the same total; single rows go into the quiet ones ----
drain_list 1 "$total" probe
echo "databases hot: 1 of $COUNT databases with $total rows, budget $BUDGET:" \
     "$rate rows/s (ratio $(echo "scale=2; $rate / $single" | bc)); quiet databases meanwhile:" \
     "commit -> publish $(probe_latency)"
