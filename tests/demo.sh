#!/bin/sh
# demo.sh - the whole relay on a throwaway stack, in about a minute.
#
# Starts PostgreSQL, RabbitMQ, Redis, NATS (and Kafka when cached) as local processes in a temp
# dir, migrates, runs producers that commit orders with their outbox rows (and
# roll every tenth transaction back), runs the relay to RabbitMQ, then to
# Redis Streams and NATS JetStream, shows a consumer receiving every committed
# row exactly as the database says, a consumer using the inbox to apply each message once
# while a relay is killed and rows are published again, and stops everything
# on every exit path. With KEEP=1 the stack stays up at the end with a relay
# and the console, and the commands to try are printed, until Ctrl-C.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
TOOLS="$BUILD/tests/tools"
ROWS=${DEMO_ROWS:-20000}

STACK=$(mktemp -d /tmp/outbox-demo.XXXXXX)
RELAY_PID=""
CONSOLE_PID=""
cleanup() {
    [ -n "$CONSOLE_PID" ] && kill "$CONSOLE_PID" 2>/dev/null && wait "$CONSOLE_PID" 2>/dev/null
    [ -n "$RELAY_PID" ] && kill "$RELAY_PID" 2>/dev/null && wait "$RELAY_PID" 2>/dev/null
    "$ROOT/tests/harness/stack.sh" stop "$STACK" >/dev/null 2>&1 || true
    rm -rf "$STACK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

DEMO_STARTED=$(date +%s)
step() { printf '\n== [%3d s] %s\n' "$(($(date +%s) - DEMO_STARTED))" "$*"; }

# A free loopback port: in OUTBOX_TEST_PORT_RANGE ("LOW-HIGH") when set, as the servers' are,
# else the kernel's pick.
free_port() {
    python3 - <<'PYTHON'
import os, random, socket
low, high = (int(p) for p in (os.environ.get("OUTBOX_TEST_PORT_RANGE") or "0-0").split("-"))
for port in random.sample(range(low, high + 1), min(200, high - low + 1)) if low else [0]:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    print(s.getsockname()[1])
    break
PYTHON
}

# KEEP=1: the stack stays up with a relay to RabbitMQ and the console, until Ctrl-C.
keep_running() {
    CONSOLE_PORT=$(free_port)
    METRICS_PORT=$(free_port)
    od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$STACK/console-token"
    chmod 600 "$STACK/console-token"
    "$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_AMQP_URL" \
        --metrics-addr "127.0.0.1:$METRICS_PORT" --log-level warn &
    RELAY_PID=$!
    "$BIN/outboxctl" --database-url "$DB" serve --listen "127.0.0.1:$CONSOLE_PORT" \
        --auth-token-file "$STACK/console-token" --allow-actions 2> "$STACK/console.log" &
    CONSOLE_PID=$!
    step "the stack stays up (KEEP=1): a relay to RabbitMQ and the console; Ctrl-C stops all"
    cat <<EOF
console:   http://127.0.0.1:$CONSOLE_PORT/   token: $(cat "$STACK/console-token")
           curl -H "Authorization: Bearer \$(cat $STACK/console-token)" \\
                http://127.0.0.1:$CONSOLE_PORT/api/v1/queues
relay:     curl http://127.0.0.1:$METRICS_PORT/healthz   (and /metrics)

Try, in another shell:
  export OUTBOX_DATABASE_URL='$DB' PATH="$BIN:\$PATH"
  psql "\$OUTBOX_DATABASE_URL" -c "SELECT outbox.enqueue('orders', '{\"order_id\": 7}')"
  outboxctl status
  outboxctl pause orders --reason 'trying it'     # then enqueue again: the row waits
  outboxctl resume orders
  outboxctl replay --queue orders --since '10 minutes' --dry-run
  outboxctl dead list
  $TOOLS/outbox_consumer --broker '$OUTBOX_TEST_AMQP_URL' --queue orders --expect 1 --show
EOF
    if command -v xdg-open >/dev/null 2>&1 && [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
        xdg-open "http://127.0.0.1:$CONSOLE_PORT/login" >/dev/null 2>&1 || true
    fi
    while kill -0 "$RELAY_PID" 2>/dev/null && kill -0 "$CONSOLE_PID" 2>/dev/null; do
        sleep 1
    done
    echo "the relay or the console stopped (see $STACK/console.log); stopping the stack" >&2
    exit 1
}

# Kafka joins when its broker is in the cache already (make test fetches it): a first demo on
# a fresh machine does not wait for the download
KAFKA=""
if "$ROOT/tests/harness/kafka.sh" cached; then
    KAFKA=kafka
fi
step "starting PostgreSQL 15, RabbitMQ, Redis, NATS${KAFKA:+ and Kafka} in $STACK"
"$ROOT/tests/harness/stack.sh" start "$STACK" postgres rabbitmq redis nats $KAFKA \
    > "$STACK/start.log" 2>&1 &
STACK_PID=$!
# DEMO_BUILD (make demo's): the programs and tools compile while the servers start
if [ -n "${DEMO_BUILD:-}" ]; then
    step "building the programs and the demo's tools while the servers start"
    sh -c "$DEMO_BUILD" > "$STACK/build.log" 2>&1 || { cat "$STACK/build.log" >&2; exit 1; }
fi
wait "$STACK_PID" || { cat "$STACK/start.log" >&2; echo "the servers did not start" >&2; exit 1; }
. "$STACK/env"
DB="${OUTBOX_TEST_PG_URL%/*}/demo"
psql -q "$OUTBOX_TEST_PG_URL" -c "CREATE DATABASE demo"

step "outboxctl migrate"
"$BIN/outboxctl" --database-url "$DB" migrate

step "producers: $ROWS orders, each committed with its outbox row; every 10th transaction rolls back"
"$TOOLS/outbox_producer" --database-url "$DB" --queue orders --count "$ROWS" --threads 16 \
    --rollback-every 10
COMMITTED=$(psql -qAt "$DB" -c "SELECT count(*) FROM outbox.job WHERE queue = 'orders'")
ORDERS=$(psql -qAt "$DB" -c "SELECT count(*) FROM demo.orders")
echo "orders in the database: $ORDERS, outbox rows: $COMMITTED (rolled-back ones left no trace)"

step "outboxctl status (before the relay)"
"$BIN/outboxctl" --database-url "$DB" status

step "relay to RabbitMQ ($OUTBOX_TEST_AMQP_URL), consumer on queue 'orders'"
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_AMQP_URL" --queue orders --declare --expect 0
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_AMQP_URL" --metrics-addr off \
    --log-level warn &
RELAY_PID=$!
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_AMQP_URL" --queue orders --expect "$COMMITTED" \
    --idle-timeout 30 --ids-file "$STACK/amqp-ids"
kill -TERM "$RELAY_PID"; wait "$RELAY_PID"; RELAY_PID=""
psql -qAt "$DB" -c "SELECT job_id FROM outbox.job WHERE queue = 'orders'" | sort -n > "$STACK/db-ids"
sort -n "$STACK/amqp-ids" > "$STACK/amqp-ids.sorted"
if cmp -s "$STACK/db-ids" "$STACK/amqp-ids.sorted"; then
    echo "every committed row arrived in RabbitMQ; no rolled-back row did"
else
    echo "MISMATCH between the database and RabbitMQ" >&2
    exit 1
fi

step "effectively once: a consumer with the inbox, while a relay dies with SIGKILL"
PGOPTIONS='-c client_min_messages=warning' \
    "$TOOLS/outbox_producer" --database-url "$DB" --queue shipments --count 5000 --threads 8 \
    --rollback-every 10
SHIPMENTS=$(psql -qAt "$DB" -c "SELECT count(*) FROM outbox.job WHERE queue = 'shipments'")
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_AMQP_URL" --queue shipments --declare --expect 0
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_AMQP_URL" --metrics-addr off \
    --log-level error --lease 5 --batch-size 100 &
RELAY_PID=$!
sleep 1
kill -KILL "$RELAY_PID"; wait "$RELAY_PID" 2>/dev/null || true; RELAY_PID=""
echo "relay killed with SIGKILL; its unmarked rows come back after their 5 s lease"
echo "re-driving a third of the published rows as if their relay had died before marking them"
psql -q "$DB" -c "UPDATE outbox.job SET state = 'ready', finished_at = NULL
                  WHERE queue = 'shipments' AND state = 'succeeded' AND job_id % 3 = 0"
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_AMQP_URL" --metrics-addr off \
    --log-level warn --lease 5 &
RELAY_PID=$!
echo "consumer 'shipping': each message in one transaction with outbox.inbox_accept()"
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_AMQP_URL" --queue shipments --idle-timeout 12 \
    --expect "$SHIPMENTS" --inbox "$DB" --consumer shipping
kill -TERM "$RELAY_PID"; wait "$RELAY_PID"; RELAY_PID=""
EFFECTS=$(psql -qAt "$DB" -c "SELECT count(*) || ' rows for ' || count(DISTINCT message_id)
                               || ' messages' FROM demo.shipments")
echo "demo.shipments holds $EFFECTS; $SHIPMENTS were committed"
if [ "$EFFECTS" != "$SHIPMENTS rows for $SHIPMENTS messages" ]; then
    echo "MISMATCH: the consumer's side effects are not exactly one per message" >&2
    exit 1
fi

step "the same rows relayed to Redis Streams (stream 'events:orders'), twice"
REDRIVE="UPDATE outbox.job SET state = 'ready', finished_at = NULL WHERE queue = 'orders'"
psql -q "$DB" -c "$REDRIVE"
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_REDIS_URL" \
    --stream-prefix events: --metrics-addr off --log-level warn --once
echo "re-driving every row as if a relay had died before marking them..."
psql -q "$DB" -c "$REDRIVE"
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_REDIS_URL" \
    --stream-prefix events: --metrics-addr off --log-level warn --once
echo "...and the stream still holds each job once (job_id is the dedup key):"
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_REDIS_URL" --queue orders \
    --stream-prefix events: --expect "$COMMITTED" --idle-timeout 5

step "the same rows relayed to NATS JetStream (stream ORDERS over 'events.>'), twice"
# the relay never creates streams: this one stands for what an operator makes with nats stream
# add, with a duplicate window (10 min) longer than a row can stay published but unmarked
# (--lease 60 s plus --retry-max 5 m), as the relay asks of it
"$TOOLS/nats_bench" stream-create --broker "$OUTBOX_TEST_NATS_URL" --stream ORDERS \
    --subject 'events.>' --duplicate-window 600
psql -q "$DB" -c "$REDRIVE"
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_NATS_URL" \
    --subject-prefix events. --metrics-addr off --log-level warn --once
"$TOOLS/nats_bench" stream-count --broker "$OUTBOX_TEST_NATS_URL" --stream ORDERS
echo "re-driving every row as if a relay had died before marking them; JetStream acks each as a"
echo "duplicate of its Nats-Msg-Id (<database id>:<epoch>:<job id>) and stores nothing twice:"
psql -q "$DB" -c "$REDRIVE"
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_NATS_URL" \
    --subject-prefix events. --metrics-addr off --log-level info --once 2>&1 |
    grep 'duplicates' | head -n 3
"$TOOLS/nats_bench" stream-count --broker "$OUTBOX_TEST_NATS_URL" --stream ORDERS

if [ -n "$KAFKA" ]; then
    step "the same rows relayed to Kafka (topic 'events.orders', 3 partitions)"
    # the relay never creates topics: this one stands for what an operator makes
    "$TOOLS/kafka_throughput" create-topic "$OUTBOX_TEST_KAFKA_URL" events.orders 3
    psql -q "$DB" -c "$REDRIVE"
    "$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_KAFKA_URL" \
        --topic-prefix events. --metrics-addr off --log-level warn --once
    RECORDS=$("$TOOLS/kafka_throughput" count "$OUTBOX_TEST_KAFKA_URL" events.orders)
    echo "topic events.orders: $RECORDS for $COMMITTED committed rows, each with its message id in the"
    echo "message-id header (Kafka is at least once: a relay dying before its mark sends a row again)"
    [ "$RECORDS" = "records=$COMMITTED" ] || {
        echo "MISMATCH between the database and Kafka" >&2
        exit 1
    }
else
    step "Kafka: skipped, its broker is not in the cache yet (make test fetches it)"
fi

step "one routed, traced event: topic exchange 'events', queue 'eu-orders' bound to 'order.*.eu'"
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_AMQP_URL" --queue eu-orders --declare \
    --bind 'events:order.*.eu' --expect 0
ROUTED="BEGIN;
SET LOCAL outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT outbox.enqueue('orders', '{\"order_id\": 1842}', exchange => 'events',
                      routing_key => 'order.created.eu');
COMMIT;"
printf '%s\n' "$ROUTED"
psql -q "$DB" -c "$ROUTED" >/dev/null
"$BIN/outbox-relay" --database-url "$DB" --broker "$OUTBOX_TEST_AMQP_URL" --metrics-addr off \
    --log-level warn --once
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_AMQP_URL" --queue eu-orders --expect 1 \
    --idle-timeout 10 --show

step "outboxctl status (after)"
"$BIN/outboxctl" --database-url "$DB" status
echo
if [ "${KEEP:-0}" != 1 ]; then
    echo "demo finished; stopping the stack (make demo KEEP=1 keeps it running to try things)"
    exit 0
fi
keep_running
