#!/bin/bash
# stack.sh - throwaway PostgreSQL 15, RabbitMQ 3.10, Redis 7 and Kafka 4.1 servers for the tests.
#
#   stack.sh start DIR [SERVICE...]                    start them (no names: postgres rabbitmq redis nats kafka)
#   stack.sh stop DIR                                  stop everything started in DIR
#   stack.sh stop-service DIR NAME                     stop one server, keep its data and port
#   stack.sh start-service DIR NAME                    start it again on the same port and data
#   stack.sh restart-service DIR NAME                  stop + start (postgres: pg_ctl restart -m fast)
#   stack.sh kill-service DIR NAME                     kill -9 one server (postgres: stop -m immediate),
#                                                      keep its data and port for start-service
#   stack.sh rabbitmqctl DIR ARGS...                   rabbitmqctl against the stack's node
#   stack.sh cluster-rabbitmqctl DIR N ARGS...         rabbitmqctl against cluster node N (1-3)
#   stack.sh crash-primary DIR                         pg_ctl stop -m immediate the primary
#   stack.sh promote-standby DIR                       pg_ctl promote the standby, wait for it
#   stack.sh kill-kafka-node DIR N                     kill -9 kafka-cluster node N (1-3), keep its data
#   stack.sh start-kafka-node DIR N                    start kafka-cluster node N again
#
# Services: postgres, rabbitmq, redis; and for the high-availability tests
#   rabbitmq-cluster   three RabbitMQ nodes joined into one cluster (one epmd, one cookie)
#   postgres-standby   a synchronous streaming standby of postgres (start it after postgres)
#   nats               nats-server with JetStream (file storage under DIR/nats)
#   nats-cluster       three JetStream nats-servers (n1..n3) routed into one cluster, a store each
#   kafka-cluster      three combined broker + controller Kafka nodes in one KRaft cluster
# kafka (in the default set) is one combined broker + controller node in KRaft mode, fetched
# from Maven Central on first use into a cache outside the source tree (tests/harness/kafka.sh).
#
# Runs as root. Every server listens on 127.0.0.1 only, on a free port picked at start
# (OUTBOX_TEST_PORT_RANGE, default 20000-32000, below the kernel's ephemeral ports), and
# keeps all its state under DIR, so several stacks can run side by side and the packaged
# system services are never used. Port picking and start-up are serialized across stacks
# with a lock so that two stacks cannot pick the same port.
#
# After start, DIR/env is a sourceable file exporting OUTBOX_TEST_* (URLs, ports, node),
# and PostgreSQL holds database outbox_template with every sql/NNN_*.sql applied and
# recorded in outbox.schema_migrations, ready to be cloned by CREATE DATABASE ... TEMPLATE.
set -eu

SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
PG_BIN=${OUTBOX_PG_BIN:-/usr/lib/postgresql/15/bin}
RABBIT_BIN=${OUTBOX_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
REDIS_PASSWORD=outbox-test-secret
# the SASL user of the kafka service (PLAIN and SCRAM), see tests/harness/kafka.sh
KAFKA_SASL_USER=relay
KAFKA_SASL_PASSWORD=outbox-kafka-secret
TEMPLATE_DB=outbox_template
ALL_SERVICES="postgres rabbitmq redis nats kafka"
# stop stops every service it finds, the standby before its primary
STOP_ORDER="postgres-standby postgres rabbitmq-cluster rabbitmq redis nats nats-cluster kafka-cluster kafka"
START_TIMEOUT=${OUTBOX_TEST_START_TIMEOUT:-90}
STOP_TIMEOUT=30

die() {
    echo "stack: $*" >&2
    exit 1
}

# A server did not come up: one line saying so, then the end of its log.
fail_with_log() {
    local message=$1 log=$2
    echo "stack: $message (log $log)" >&2
    if [ -f "$log" ]; then
        tail -n 15 "$log" | sed 's/^/stack:   | /' >&2
    fi
    exit 1
}

# Runs a command as another user without a login shell; setpriv execs, so a
# backgrounded call's $! is the server's own pid.
as_user() {
    local user=$1
    shift
    setpriv --reuid="$user" --regid="$user" --init-groups -- "$@" 9>&-
}

pid_alive() {
    [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null
}

# TERM, then KILL after STOP_TIMEOUT seconds, for the pid in a pid file.
stop_pidfile() {
    local pidfile=$1 pid i
    [ -f "$pidfile" ] || return 0
    pid=$(head -n 1 "$pidfile" 2>/dev/null | tr -dc 0-9)
    if pid_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
            pid_alive "$pid" || break
            sleep 0.1
        done
        if pid_alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
        fi
    fi
    rm -f "$pidfile"
}

port_in_use() {
    local port=$1
    if command -v ss >/dev/null 2>&1; then
        [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
    fi
}

# Prints a port nobody listens on and this stack has not handed out yet.
PICKED_PORTS=" "
pick_port() {
    local range=${OUTBOX_TEST_PORT_RANGE:-20000-32000}
    local low=${range%-*} high=${range#*-} span port i
    span=$((high - low + 1))
    [ "$span" -gt 0 ] || die "bad OUTBOX_TEST_PORT_RANGE '$range'"
    port=$((low + (RANDOM * 32768 + RANDOM) % span))
    for ((i = 0; i < span && i < 2000; i++)); do
        case "$PICKED_PORTS" in
        *" $port "*) ;;
        *)
            if ! port_in_use "$port"; then
                PICKED_PORTS="$PICKED_PORTS$port "
                echo "$port"
                return 0
            fi
            ;;
        esac
        port=$((port + 1))
        [ "$port" -le "$high" ] || port=$low
    done
    die "no free port in $range"
}

# Serializes port picking + start-up between stacks on this machine.
take_lock() {
    exec 9>"${TMPDIR:-/tmp}/outbox-test-stack.lock"
    flock -w 300 9 || die "timed out waiting for ${TMPDIR:-/tmp}/outbox-test-stack.lock"
    trap 'flock -u 9 2>/dev/null || true' EXIT
}

# DIR/ports holds what start picked, so start-service and stop find it again.
load_ports() {
    PG_PORT="" AMQP_PORT="" AMQP_DIST_PORT="" EPMD_PORT="" AMQP_NODE="" REDIS_PORT=""
    PG_STANDBY_PORT="" CLUSTER_PORTS="" CLUSTER_DIST_PORTS="" CLUSTER_EPMD_PORT="" CLUSTER_NODES=""
    NATS_PORT="" NATS_CLUSTER_PORTS="" NATS_ROUTE_PORTS=""
    KAFKA_PORT="" KAFKA_CONTROLLER_PORT="" KAFKA_CLUSTER_PORTS="" KAFKA_CLUSTER_CONTROLLER_PORTS=""
    KAFKA_SASL_PORT="" KAFKA_SSL_PORT=""
    if [ -f "$DIR/ports" ]; then
        # shellcheck disable=SC1091
        . "$DIR/ports"
    fi
}

save_ports() {
    cat >"$DIR/ports.tmp" <<EOF
PG_PORT=$PG_PORT
AMQP_PORT=$AMQP_PORT
AMQP_DIST_PORT=$AMQP_DIST_PORT
EPMD_PORT=$EPMD_PORT
AMQP_NODE=$AMQP_NODE
REDIS_PORT=$REDIS_PORT
PG_STANDBY_PORT=$PG_STANDBY_PORT
CLUSTER_PORTS="$CLUSTER_PORTS"
CLUSTER_DIST_PORTS="$CLUSTER_DIST_PORTS"
CLUSTER_EPMD_PORT=$CLUSTER_EPMD_PORT
CLUSTER_NODES="$CLUSTER_NODES"
NATS_PORT=$NATS_PORT
NATS_CLUSTER_PORTS="$NATS_CLUSTER_PORTS"
NATS_ROUTE_PORTS="$NATS_ROUTE_PORTS"
KAFKA_PORT=$KAFKA_PORT
KAFKA_CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT
KAFKA_CLUSTER_PORTS="$KAFKA_CLUSTER_PORTS"
KAFKA_CLUSTER_CONTROLLER_PORTS="$KAFKA_CLUSTER_CONTROLLER_PORTS"
KAFKA_SASL_PORT=$KAFKA_SASL_PORT
KAFKA_SSL_PORT=$KAFKA_SSL_PORT
EOF
    mv "$DIR/ports.tmp" "$DIR/ports"
}

write_env() {
    {
        echo "# outbox test stack in $DIR; source this file"
        echo "export OUTBOX_TEST_STACK_DIR='$DIR'"
        if [ -n "$PG_PORT" ]; then
            echo "export OUTBOX_TEST_PG_PORT=$PG_PORT"
            echo "export OUTBOX_TEST_PG_SOCKET_DIR='$DIR/pg-socket'"
            echo "export OUTBOX_TEST_PG_URL='postgresql://postgres@127.0.0.1:$PG_PORT/postgres'"
            echo "export OUTBOX_TEST_TEMPLATE_DB=$TEMPLATE_DB"
        fi
        if [ -n "$AMQP_PORT" ]; then
            echo "export OUTBOX_TEST_AMQP_PORT=$AMQP_PORT"
            echo "export OUTBOX_TEST_AMQP_DIST_PORT=$AMQP_DIST_PORT"
            echo "export OUTBOX_TEST_EPMD_PORT=$EPMD_PORT"
            echo "export OUTBOX_TEST_AMQP_NODE='$AMQP_NODE'"
            echo "export OUTBOX_TEST_AMQP_URL='amqp://guest:guest@127.0.0.1:$AMQP_PORT/'"
        fi
        if [ -n "$PG_STANDBY_PORT" ]; then
            echo "export OUTBOX_TEST_PG_STANDBY_PORT=$PG_STANDBY_PORT"
            # libpq tries the hosts in order and keeps the one that accepts writes
            echo "export OUTBOX_TEST_PG_HA_URL='postgresql://postgres@127.0.0.1:$PG_PORT,127.0.0.1:$PG_STANDBY_PORT/postgres?target_session_attrs=read-write'"
        fi
        if [ -n "$CLUSTER_PORTS" ]; then
            local port list=""
            for port in $CLUSTER_PORTS; do
                list="$list${list:+,}127.0.0.1:$port"
            done
            echo "export OUTBOX_TEST_AMQP_CLUSTER_PORTS='$CLUSTER_PORTS'"
            echo "export OUTBOX_TEST_AMQP_CLUSTER_NODES='$CLUSTER_NODES'"
            echo "export OUTBOX_TEST_AMQP_CLUSTER_URL='amqp://guest:guest@$list/'"
        fi
        if [ -n "$REDIS_PORT" ]; then
            echo "export OUTBOX_TEST_REDIS_PORT=$REDIS_PORT"
            echo "export OUTBOX_TEST_REDIS_PASSWORD='$REDIS_PASSWORD'"
            echo "export OUTBOX_TEST_REDIS_URL='redis://:$REDIS_PASSWORD@127.0.0.1:$REDIS_PORT/0'"
        fi
        if [ -n "$NATS_PORT" ]; then
            echo "export OUTBOX_TEST_NATS_PORT=$NATS_PORT"
            echo "export OUTBOX_TEST_NATS_URL='nats://127.0.0.1:$NATS_PORT'"
        fi
        if [ -n "$NATS_CLUSTER_PORTS" ]; then
            local nats_port nats_list=""
            for nats_port in $NATS_CLUSTER_PORTS; do
                nats_list="$nats_list${nats_list:+,}127.0.0.1:$nats_port"
            done
            echo "export OUTBOX_TEST_NATS_CLUSTER_PORTS='$NATS_CLUSTER_PORTS'"
            echo "export OUTBOX_TEST_NATS_CLUSTER_URL='nats://$nats_list'"
        fi
        if [ -n "$KAFKA_PORT" ]; then
            echo "export OUTBOX_TEST_KAFKA_PORT=$KAFKA_PORT"
            echo "export OUTBOX_TEST_KAFKA_URL='kafka://127.0.0.1:$KAFKA_PORT'"
        fi
        if [ -n "$KAFKA_SASL_PORT" ]; then
            # SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256/512) and SSL listeners of the same node
            echo "export OUTBOX_TEST_KAFKA_SASL_PORT=$KAFKA_SASL_PORT"
            echo "export OUTBOX_TEST_KAFKA_SASL_USER='$KAFKA_SASL_USER'"
            echo "export OUTBOX_TEST_KAFKA_SASL_PASSWORD='$KAFKA_SASL_PASSWORD'"
            echo "export OUTBOX_TEST_KAFKA_SSL_PORT=$KAFKA_SSL_PORT"
            echo "export OUTBOX_TEST_KAFKA_SSL_CA_FILE='$DIR/kafka/tls/ca.pem'"
        fi
        if [ -n "$KAFKA_CLUSTER_PORTS" ]; then
            local kafka_port kafka_list=""
            for kafka_port in $KAFKA_CLUSTER_PORTS; do
                kafka_list="$kafka_list${kafka_list:+,}127.0.0.1:$kafka_port"
            done
            echo "export OUTBOX_TEST_KAFKA_CLUSTER_PORTS='$KAFKA_CLUSTER_PORTS'"
            echo "export OUTBOX_TEST_KAFKA_CLUSTER_URL='kafka://$kafka_list'"
        fi
    } >"$DIR/env.tmp"
    mv "$DIR/env.tmp" "$DIR/env"
}

# ---------------------------------------------------------------- PostgreSQL

pg_psql() {
    local database=$1
    shift
    psql -X -q -v ON_ERROR_STOP=1 "postgresql://postgres@127.0.0.1:$PG_PORT/$database" "$@"
}

pg_init() {
    mkdir -p "$DIR/pg-socket" "$DIR/pg"
    chown postgres: "$DIR/pg-socket" "$DIR/pg"
    chmod 0700 "$DIR/pg"
    chmod 0755 "$DIR/pg-socket"
    : >"$DIR/pg.log"
    chown postgres: "$DIR/pg.log"
    if ! as_user postgres "$PG_BIN/initdb" -A trust -U postgres -E UTF8 --no-locale --no-sync \
        -D "$DIR/pg" >"$DIR/initdb.log" 2>&1; then
        fail_with_log "initdb failed" "$DIR/initdb.log"
    fi
    cat >>"$DIR/pg/postgresql.conf" <<EOF

# outbox test stack
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$DIR/pg-socket'
max_connections = 200
# producers' PREPARE TRANSACTION (the torture run, the horizon tests)
max_prepared_transactions = 20
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
EOF
}

pg_start() {
    if ! as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w -t "$START_TIMEOUT" \
        start >/dev/null 2>&1; then
        fail_with_log "postgres failed to start on 127.0.0.1:$PG_PORT" "$DIR/pg.log"
    fi
}

pg_stop() {
    [ -f "$DIR/pg/postmaster.pid" ] || return 0
    as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg" -m fast -w -t "$STOP_TIMEOUT" stop >/dev/null 2>&1 ||
        as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg" -m immediate -w -t "$STOP_TIMEOUT" stop \
            >/dev/null 2>&1 || true
    if [ -f "$DIR/pg/postmaster.pid" ]; then
        local pid
        pid=$(head -n 1 "$DIR/pg/postmaster.pid" | tr -dc 0-9)
        pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null
        rm -f "$DIR/pg/postmaster.pid"
    fi
}

# ---------------------------------------------------------------- PostgreSQL standby

STANDBY_NAME=standby

# A copy of the primary (pg_basebackup -R writes primary_conninfo and standby.signal)
# on its own port, named STANDBY_NAME towards the primary.
standby_init() {
    mkdir -p "$DIR/pg-standby" "$DIR/pg-standby-socket"
    chown postgres: "$DIR/pg-standby" "$DIR/pg-standby-socket"
    chmod 0700 "$DIR/pg-standby"
    chmod 0755 "$DIR/pg-standby-socket"
    : >"$DIR/pg-standby.log"
    chown postgres: "$DIR/pg-standby.log"
    if ! as_user postgres "$PG_BIN/pg_basebackup" -d "host=127.0.0.1 port=$PG_PORT user=postgres application_name=$STANDBY_NAME" \
        -D "$DIR/pg-standby" -R -X stream -c fast --no-sync >"$DIR/basebackup.log" 2>&1; then
        fail_with_log "pg_basebackup from 127.0.0.1:$PG_PORT failed" "$DIR/basebackup.log"
    fi
    cat >>"$DIR/pg-standby/postgresql.conf" <<EOF

# outbox test stack: the standby
port = $PG_STANDBY_PORT
unix_socket_directories = '$DIR/pg-standby-socket'
EOF
}

# Starts the standby, then makes the primary wait for it at every commit.
standby_start() {
    local i state=""
    if ! as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg-standby" -l "$DIR/pg-standby.log" -w \
        -t "$START_TIMEOUT" start >/dev/null 2>&1; then
        fail_with_log "postgres standby failed to start on 127.0.0.1:$PG_STANDBY_PORT" "$DIR/pg-standby.log"
    fi
    pg_psql postgres -c "ALTER SYSTEM SET synchronous_standby_names = '$STANDBY_NAME'" \
        -c "SELECT pg_reload_conf()" >/dev/null || die "unable to set synchronous_standby_names"
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        state=$(pg_psql postgres -Atc "SELECT sync_state FROM pg_stat_replication
                                       WHERE application_name = '$STANDBY_NAME'" 2>/dev/null) || true
        [ "$state" = sync ] && return 0
        sleep 0.1
    done
    fail_with_log "the standby on 127.0.0.1:$PG_STANDBY_PORT is not a synchronous standby (state '$state')" \
        "$DIR/pg-standby.log"
}

standby_stop() {
    local data=$DIR/pg-standby
    [ -f "$data/postmaster.pid" ] || return 0
    as_user postgres "$PG_BIN/pg_ctl" -D "$data" -m fast -w -t "$STOP_TIMEOUT" stop >/dev/null 2>&1 ||
        as_user postgres "$PG_BIN/pg_ctl" -D "$data" -m immediate -w -t "$STOP_TIMEOUT" stop \
            >/dev/null 2>&1 || true
    if [ -f "$data/postmaster.pid" ]; then
        local pid
        pid=$(head -n 1 "$data/postmaster.pid" | tr -dc 0-9)
        pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null
        rm -f "$data/postmaster.pid"
    fi
}

# Builds outbox_template: every migration in order, each in one transaction with its
# schema_migrations row, the same bookkeeping outboxctl migrate keeps.
pg_template() {
    local file name version
    pg_psql postgres -c "CREATE DATABASE $TEMPLATE_DB" >/dev/null ||
        die "unable to create database $TEMPLATE_DB"
    pg_psql "$TEMPLATE_DB" >/dev/null <<'EOF' || die "unable to create outbox.schema_migrations"
CREATE SCHEMA IF NOT EXISTS outbox;
CREATE TABLE outbox.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
EOF
    for file in "$SOURCE_DIR"/sql/[0-9][0-9][0-9]_*.sql; do
        [ -f "$file" ] || continue
        name=$(basename "$file" .sql)
        version=$((10#${name%%_*}))
        if ! pg_psql "$TEMPLATE_DB" --single-transaction -f "$file" \
            -c "INSERT INTO outbox.schema_migrations (version, name) VALUES ($version, '$name')" \
            >"$DIR/migrate.log" 2>&1; then
            fail_with_log "migration $name failed" "$DIR/migrate.log"
        fi
    done
}

# ---------------------------------------------------------------- RabbitMQ

# Sets RABBIT_BASE and RABBIT_ENV: the whole environment every rabbitmq process of
# this stack runs with, so nothing is read from /etc/rabbitmq or /var/lib/rabbitmq.
rabbit_env() {
    RABBIT_BASE=${RABBIT_DIR:-$DIR/rabbitmq}
    RABBIT_ENV=(
        PATH="$PATH" LANG=C.UTF-8 HOME="$RABBIT_BASE"
        ERL_EPMD_PORT="$EPMD_PORT"
        RABBITMQ_NODENAME="$AMQP_NODE"
        RABBITMQ_USE_LONGNAME=false
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
        RABBITMQ_NODE_PORT="$AMQP_PORT"
        RABBITMQ_DIST_PORT="$AMQP_DIST_PORT"
        RABBITMQ_CONF_ENV_FILE="$RABBIT_BASE/rabbitmq-env.conf"
        RABBITMQ_CONFIG_FILE="$RABBIT_BASE/rabbitmq.conf"
        RABBITMQ_ADVANCED_CONFIG_FILE="$RABBIT_BASE/advanced.config"
        RABBITMQ_MNESIA_BASE="$RABBIT_BASE/mnesia"
        RABBITMQ_LOG_BASE="$RABBIT_BASE/log"
        RABBITMQ_PID_FILE="$RABBIT_BASE/rabbitmq.pid"
        RABBITMQ_ENABLED_PLUGINS_FILE="$RABBIT_BASE/enabled_plugins"
        RABBITMQ_FEATURE_FLAGS_FILE="$RABBIT_BASE/feature_flags"
        RABBITMQ_PLUGINS_EXPAND_DIR="$RABBIT_BASE/plugins-expand"
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}${RABBIT_EXTRA_ERL_ARGS:+ $RABBIT_EXTRA_ERL_ARGS}"
    )
}

RABBIT_AS_USER=(setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups --)

# rabbitmqctl against this stack's node, for at most CTL_TIMEOUT seconds.
CTL_TIMEOUT=60
rabbitmqctl_run() {
    rabbit_env
    (cd "$RABBIT_BASE" && exec 9>&- && exec timeout "$CTL_TIMEOUT" "${RABBIT_AS_USER[@]}" \
        env -i "${RABBIT_ENV[@]}" "$RABBIT_BIN/rabbitmqctl" -n "$AMQP_NODE" "$@")
}

rabbit_init() {
    rabbit_env
    local base=$RABBIT_BASE
    mkdir -p "$base/mnesia" "$base/log" "$base/plugins-expand"
    : >"$base/rabbitmq-env.conf"
    echo "[]." >"$base/enabled_plugins"
    echo "[]." >"$base/advanced.config"
    cat >"$base/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
loopback_users = none
max_message_size = 1048576
disk_free_limit.absolute = 10MB
log.console = false
log.file.level = info
EOF
    # Erlang wants a cookie only its owner can read; the nodes of a cluster share one.
    if [ -n "${RABBIT_COOKIE:-}" ]; then
        printf '%s' "$RABBIT_COOKIE" >"$base/.erlang.cookie"
    else
        head -c 24 /dev/urandom | od -An -tx1 | tr -dc 0-9a-f >"$base/.erlang.cookie"
    fi
    chmod 0400 "$base/.erlang.cookie"
    chown -R rabbitmq: "$base"
}

# Our own epmd on a private port, loopback only, so stacks never share one; its pid in
# the file pidfile.
epmd_start() {
    local pidfile=$1 i
    rabbit_env
    (cd "$RABBIT_BASE" && exec 9>&- && exec setsid "${RABBIT_AS_USER[@]}" env -i "${RABBIT_ENV[@]}" \
        epmd -address 127.0.0.1 -port "$EPMD_PORT" </dev/null >"$pidfile.log" 2>&1) &
    echo $! >"$pidfile"
    for ((i = 0; i < 100; i++)); do
        port_in_use "$EPMD_PORT" && break
        sleep 0.1
    done
    port_in_use "$EPMD_PORT" || fail_with_log "epmd failed to start on port $EPMD_PORT" "$pidfile.log"
}

# Starts the node in the background; rabbit_wait waits for it. The nodes of a cluster
# share an epmd that the cluster starts (RABBIT_SHARED_EPMD set).
rabbit_launch() {
    local base
    rabbit_env
    base=$RABBIT_BASE
    rm -f "$base/rabbitmq.pid"
    [ -n "${RABBIT_SHARED_EPMD:-}" ] || epmd_start "$base/epmd.pid"
    (cd "$base" && exec 9>&- && exec setsid "${RABBIT_AS_USER[@]}" env -i "${RABBIT_ENV[@]}" \
        "$RABBIT_BIN/rabbitmq-server" </dev/null >"$base/server.log" 2>&1) &
    echo $! >"$base/launcher.pid"
}

# A node that fails to boot is stopped and launched once more: on a loaded host a
# restart on the same data and port (the chaos tests' broker fault) has been seen to
# die before it wrote its log. Both attempts' output is kept and shown on failure.
rabbit_start() {
    rabbit_wait_ports_free
    rabbit_launch
    rabbit_wait && return 0
    echo "stack: rabbitmq on 127.0.0.1:$AMQP_PORT did not start; stopping it and trying once more" >&2
    rabbit_show_failure
    rabbit_stop
    rabbit_launch
    rabbit_wait_or_fail
}

# A node stopped a moment ago (start-service after stop-service) may hold its AMQP and
# distribution ports while its VM exits; a new node on them would die before it logs.
rabbit_wait_ports_free() {
    local i
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        port_in_use "$AMQP_PORT" || port_in_use "$AMQP_DIST_PORT" || return 0
        sleep 0.1
    done
    echo "stack: 127.0.0.1:$AMQP_PORT or :$AMQP_DIST_PORT still in use after ${STOP_TIMEOUT} s" >&2
}

# Succeeds when the node launched by rabbit_launch is up within START_TIMEOUT.
rabbit_wait() {
    local status=0
    rabbit_env
    CTL_TIMEOUT=$((START_TIMEOUT + 10))
    rabbitmqctl_run wait --timeout "$START_TIMEOUT" "$RABBIT_BASE/rabbitmq.pid" \
        >"$RABBIT_BASE/wait.log" 2>&1 || status=$?
    CTL_TIMEOUT=60
    return "$status"
}

rabbit_wait_or_fail() {
    rabbit_wait && return 0
    rabbit_show_failure
    rabbit_stop
    fail_with_log "rabbitmq failed to start on 127.0.0.1:$AMQP_PORT" "$RABBIT_BASE/log/$AMQP_NODE.log"
}

# What a failed boot left: rabbitmqctl wait's answer and the server's own output.
rabbit_show_failure() {
    local log
    for log in "$RABBIT_BASE/wait.log" "$RABBIT_BASE/server.log"; do
        [ -s "$log" ] || continue
        echo "stack: $log:" >&2
        tail -n 10 "$log" | sed 's/^/stack:   | /' >&2
    done
}

rabbit_stop() {
    local base=${RABBIT_DIR:-$DIR/rabbitmq} pid
    [ -d "$base" ] || return 0
    if [ -f "$base/rabbitmq.pid" ]; then
        pid=$(tr -dc 0-9 <"$base/rabbitmq.pid")
        if pid_alive "$pid"; then
            CTL_TIMEOUT=$STOP_TIMEOUT
            rabbitmqctl_run shutdown >/dev/null 2>&1 || true
            CTL_TIMEOUT=60
        fi
    fi
    stop_pidfile "$base/rabbitmq.pid"
    stop_pidfile "$base/launcher.pid"
    stop_pidfile "$base/epmd.pid"
}

# ---------------------------------------------------------------- RabbitMQ cluster

CLUSTER_SIZE=3

# Runs a command with the rabbit_* functions pointed at cluster node N (1-based).
with_cluster_node() {
    local index=$1
    shift
    local RABBIT_DIR=$DIR/rabbitmq-$index RABBIT_SHARED_EPMD=1 EPMD_PORT=$CLUSTER_EPMD_PORT
    local AMQP_PORT AMQP_DIST_PORT AMQP_NODE
    # The schedulers sleep instead of spinning: three nodes on a few shared cores.
    local RABBIT_EXTRA_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
    AMQP_PORT=$(echo "$CLUSTER_PORTS" | cut -d' ' -f"$index")
    AMQP_DIST_PORT=$(echo "$CLUSTER_DIST_PORTS" | cut -d' ' -f"$index")
    AMQP_NODE=$(echo "$CLUSTER_NODES" | cut -d' ' -f"$index")
    [ -n "$AMQP_NODE" ] || die "no cluster node $index"
    "$@"
}

cluster_init() {
    local i RABBIT_COOKIE
    RABBIT_COOKIE=$(head -c 24 /dev/urandom | od -An -tx1 | tr -dc 0-9a-f)
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        with_cluster_node "$i" rabbit_init
    done
}

cluster_start() {
    local i first
    with_cluster_node 1 epmd_start "$DIR/rabbitmq-epmd.pid"
    # the nodes boot side by side, then each is waited for
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        with_cluster_node "$i" rabbit_launch
    done
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        with_cluster_node "$i" rabbit_wait_or_fail
    done
    # joined once; a restarted node finds its cluster in its own data
    [ -f "$DIR/rabbitmq-cluster.joined" ] && return 0
    first=$(echo "$CLUSTER_NODES" | cut -d' ' -f1)
    for ((i = 2; i <= CLUSTER_SIZE; i++)); do
        if ! { with_cluster_node "$i" rabbitmqctl_run stop_app &&
            with_cluster_node "$i" rabbitmqctl_run join_cluster "$first" &&
            with_cluster_node "$i" rabbitmqctl_run start_app; } >"$DIR/rabbitmq-$i/join.log" 2>&1; then
            fail_with_log "rabbitmq node $i failed to join $first" "$DIR/rabbitmq-$i/join.log"
        fi
    done
    if ! with_cluster_node 1 rabbitmqctl_run await_online_nodes "$CLUSTER_SIZE" \
        --timeout "$((START_TIMEOUT * 1000))" >"$DIR/rabbitmq-1/await.log" 2>&1; then
        fail_with_log "rabbitmq cluster did not reach $CLUSTER_SIZE nodes" "$DIR/rabbitmq-1/await.log"
    fi
    touch "$DIR/rabbitmq-cluster.joined"
}

# The nodes stop side by side: one after the other, each waits for the others' goodbyes.
cluster_stop() {
    local i
    [ -n "$CLUSTER_NODES" ] || return 0
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        with_cluster_node "$i" rabbit_stop &
    done
    wait
    stop_pidfile "$DIR/rabbitmq-epmd.pid"
}

# ---------------------------------------------------------------- Redis

redis_init() {
    mkdir -p "$DIR/redis"
    cat >"$DIR/redis/redis.conf" <<EOF
bind 127.0.0.1
port $REDIS_PORT
requirepass $REDIS_PASSWORD
dir $DIR/redis
daemonize yes
pidfile $DIR/redis/redis.pid
logfile $DIR/redis/redis.log
# the append-only file keeps streams and dedup records across a restart, as in production
appendonly yes
appendfsync everysec
save ""
EOF
    if id redis >/dev/null 2>&1; then
        chown -R redis: "$DIR/redis"
    fi
}

redis_ping() {
    REDISCLI_AUTH=$REDIS_PASSWORD timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null
}

redis_start() {
    local user=root i
    id redis >/dev/null 2>&1 && user=redis
    if ! as_user "$user" redis-server "$DIR/redis/redis.conf" >"$DIR/redis/start.log" 2>&1; then
        cat "$DIR/redis/start.log" >>"$DIR/redis/redis.log"
        fail_with_log "redis failed to start on 127.0.0.1:$REDIS_PORT" "$DIR/redis/redis.log"
    fi
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        [ "$(redis_ping)" = PONG ] && return 0
        sleep 0.1
    done
    redis_stop
    fail_with_log "redis failed to start on 127.0.0.1:$REDIS_PORT" "$DIR/redis/redis.log"
}

redis_stop() {
    [ -f "$DIR/redis/redis.pid" ] || return 0
    REDISCLI_AUTH=$REDIS_PASSWORD timeout 10 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" \
        shutdown nosave >/dev/null 2>&1 || true
    stop_pidfile "$DIR/redis/redis.pid"
}

# ---------------------------------------------------------------- NATS

nats_init() {
    mkdir -p "$DIR/nats/store"
    cat >"$DIR/nats/nats.conf" <<EOF
listen: 127.0.0.1:$NATS_PORT
pid_file: "$DIR/nats/nats.pid"
log_file: "$DIR/nats/nats.log"
jetstream {
    store_dir: "$DIR/nats/store"
    max_memory_store: 256MB
    max_file_store: 4GB
}
EOF
}

nats_start() {
    local i
    nats-server -c "$DIR/nats/nats.conf" >>"$DIR/nats/start.log" 2>&1 9>&- &
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        if port_in_use "$NATS_PORT" && grep -q "Server is ready" "$DIR/nats/nats.log" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    nats_stop
    fail_with_log "nats failed to start on 127.0.0.1:$NATS_PORT" "$DIR/nats/nats.log"
}

nats_stop() {
    stop_pidfile "$DIR/nats/nats.pid"
    # the next start's readiness check reads the log from here on
    [ ! -f "$DIR/nats/nats.log" ] || mv "$DIR/nats/nats.log" "$DIR/nats/nats.log.old"
}

# nats-cluster: node i (1-based) listens on the i-th of NATS_CLUSTER_PORTS, routes on the
# i-th of NATS_ROUTE_PORTS to the two others, keeps its store in DIR/nats-cluster/n<i>.
nats_cluster_init() {
    local i=0 port routes route
    for port in $NATS_CLUSTER_PORTS; do
        i=$((i + 1))
        routes=""
        for route in $NATS_ROUTE_PORTS; do
            routes="$routes${routes:+, }nats-route://127.0.0.1:$route"
        done
        mkdir -p "$DIR/nats-cluster/n$i/store"
        cat >"$DIR/nats-cluster/n$i/nats.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:$port
pid_file: "$DIR/nats-cluster/n$i/nats.pid"
log_file: "$DIR/nats-cluster/n$i/nats.log"
jetstream {
    store_dir: "$DIR/nats-cluster/n$i/store"
    max_memory_store: 256MB
    max_file_store: 4GB
}
cluster {
    name: outbox-ha
    listen: 127.0.0.1:$(echo $NATS_ROUTE_PORTS | cut -d' ' -f$i)
    routes: [$routes]
}
EOF
    done
}

nats_cluster_start() {
    local i count=0 ready
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        nats-server -c "$DIR/nats-cluster/n$i/nats.conf" >>"$DIR/nats-cluster/n$i/start.log" 2>&1 9>&- &
    done
    # ready: every node serves clients and the cluster has a JetStream meta leader
    for ((count = 0; count < START_TIMEOUT * 10; count++)); do
        ready=0
        for ((i = 1; i <= CLUSTER_SIZE; i++)); do
            grep -q "Server is ready" "$DIR/nats-cluster/n$i/nats.log" 2>/dev/null && ready=$((ready + 1))
        done
        if [ "$ready" -eq "$CLUSTER_SIZE" ] &&
            grep -qi "new JetStream cluster metadata leader\|is new JetStream cluster metadata leader\|JetStream cluster new metadata leader" \
                "$DIR"/nats-cluster/n*/nats.log 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    nats_cluster_stop
    fail_with_log "nats-cluster failed to form" "$DIR/nats-cluster/n1/nats.log"
}

nats_cluster_stop() {
    local i
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        stop_pidfile "$DIR/nats-cluster/n$i/nats.pid"
        [ ! -f "$DIR/nats-cluster/n$i/nats.log" ] ||
            mv "$DIR/nats-cluster/n$i/nats.log" "$DIR/nats-cluster/n$i/nats.log.old"
    done
}

# ---------------------------------------------------------------- Kafka (tests/harness/kafka.sh)

KAFKA_SH=$SOURCE_DIR/tests/harness/kafka.sh

kafka_init() {
    local cluster_id
    cluster_id=$("$KAFKA_SH" cluster-id) || die "unable to make a kafka cluster id"
    "$KAFKA_SH" init "$DIR/kafka" 1 "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" \
        "1@127.0.0.1:$KAFKA_CONTROLLER_PORT" "$cluster_id" \
        "$KAFKA_SASL_PORT" "$KAFKA_SSL_PORT" "$KAFKA_SASL_USER" "$KAFKA_SASL_PASSWORD" || exit 1
}

kafka_start() {
    "$KAFKA_SH" start "$DIR/kafka" || exit 1
}

kafka_stop() {
    [ -d "$DIR/kafka" ] && "$KAFKA_SH" stop "$DIR/kafka"
    return 0
}

# The voters of the cluster: "1@127.0.0.1:c1,2@127.0.0.1:c2,3@127.0.0.1:c3".
kafka_cluster_voters() {
    local i=0 port voters=""
    for port in $KAFKA_CLUSTER_CONTROLLER_PORTS; do
        i=$((i + 1))
        voters="$voters${voters:+,}$i@127.0.0.1:$port"
    done
    echo "$voters"
}

kafka_cluster_init() {
    local cluster_id voters i
    cluster_id=$("$KAFKA_SH" cluster-id) || die "unable to make a kafka cluster id"
    voters=$(kafka_cluster_voters)
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        "$KAFKA_SH" init "$DIR/kafka-$i" "$i" "$(echo "$KAFKA_CLUSTER_PORTS" | cut -d' ' -f"$i")" \
            "$(echo "$KAFKA_CLUSTER_CONTROLLER_PORTS" | cut -d' ' -f"$i")" "$voters" "$cluster_id" || exit 1
    done
}

# The nodes boot side by side: each waits for a quorum of controllers before it serves.
kafka_cluster_start() {
    local i pids="" status=0 pid
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        "$KAFKA_SH" start "$DIR/kafka-$i" &
        pids="$pids $!"
    done
    for pid in $pids; do
        wait "$pid" || status=1
    done
    [ "$status" -eq 0 ] || exit 1
}

kafka_cluster_stop() {
    local i
    for ((i = 1; i <= CLUSTER_SIZE; i++)); do
        [ -d "$DIR/kafka-$i" ] && "$KAFKA_SH" stop "$DIR/kafka-$i" &
    done
    wait
    return 0
}

# ---------------------------------------------------------------- commands

check_service() {
    case "$1" in
    postgres | rabbitmq | redis | rabbitmq-cluster | postgres-standby | nats | nats-cluster | kafka | kafka-cluster) ;;
    *) die "unknown service '$1' (postgres, rabbitmq, redis, nats, kafka, rabbitmq-cluster, postgres-standby, nats-cluster or kafka-cluster)" ;;
    esac
}

service_start() {
    case "$1" in
    postgres) pg_start ;;
    rabbitmq) rabbit_start ;;
    redis) redis_start ;;
    rabbitmq-cluster) cluster_start ;;
    postgres-standby) standby_start ;;
    nats) nats_start ;;
    nats-cluster) nats_cluster_start ;;
    kafka) kafka_start ;;
    kafka-cluster) kafka_cluster_start ;;
    esac
}

service_stop() {
    case "$1" in
    postgres) pg_stop ;;
    rabbitmq) rabbit_stop ;;
    redis) redis_stop ;;
    rabbitmq-cluster) cluster_stop ;;
    postgres-standby) standby_stop ;;
    nats) nats_stop ;;
    nats-cluster) nats_cluster_stop ;;
    kafka) kafka_stop ;;
    kafka-cluster) kafka_cluster_stop ;;
    esac
}

# kill -9 of a server, as a crash; start-service brings it back on its data and port.
service_kill() {
    local pidfile=""
    case "$1" in
    postgres)
        as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg" -m immediate -w -t "$STOP_TIMEOUT" stop \
            >/dev/null 2>&1 || true
        return 0
        ;;
    redis) pidfile=$DIR/redis/redis.pid ;;
    nats) pidfile=$DIR/nats/nats.pid ;;
    kafka) pidfile=$DIR/kafka/kafka.pid ;;
    *)
        # a RabbitMQ node killed leaves its launcher and epmd: stopped as a whole instead
        service_stop "$1"
        return 0
        ;;
    esac
    local pid i
    pid=$(tr -dc 0-9 <"$pidfile" 2>/dev/null || true)
    pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null
    for ((i = 0; i < 100; i++)); do
        pid_alive "$pid" || break
        sleep 0.1
    done
    rm -f "$pidfile"
    [ "$1" != nats ] || [ ! -f "$DIR/nats/nats.log" ] || mv "$DIR/nats/nats.log" "$DIR/nats/nats.log.old"
}

service_configured() {
    case "$1" in
    postgres) [ -n "$PG_PORT" ] ;;
    rabbitmq) [ -n "$AMQP_PORT" ] ;;
    redis) [ -n "$REDIS_PORT" ] ;;
    rabbitmq-cluster) [ -n "$CLUSTER_NODES" ] ;;
    postgres-standby) [ -n "$PG_STANDBY_PORT" ] ;;
    nats) [ -n "$NATS_PORT" ] ;;
    nats-cluster) [ -n "$NATS_CLUSTER_PORTS" ] ;;
    kafka) [ -n "$KAFKA_PORT" ] ;;
    kafka-cluster) [ -n "$KAFKA_CLUSTER_PORTS" ] ;;
    esac
}

command_start() {
    local services="$*" service
    [ -n "$services" ] || services=$ALL_SERVICES
    for service in $services; do
        check_service "$service"
    done
    [ "$(id -u)" = 0 ] || die "must run as root (servers run as users postgres, rabbitmq and redis)"
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    # The servers' users must reach their subdirectories.
    chmod 0755 "$DIR"
    setpriv --reuid=postgres --regid=postgres --init-groups -- test -x "$DIR" ||
        die "user postgres cannot reach $DIR: use a directory under a world-searchable path (e.g. TMPDIR=/tmp)"
    load_ports
    take_lock
    for service in $services; do
        service_configured "$service" && die "$service already set up in $DIR; use start-service"
        case "$service" in
        postgres)
            PG_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$PG_PORT "
            save_ports
            pg_init
            pg_start
            pg_template
            ;;
        rabbitmq)
            AMQP_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$AMQP_PORT "
            AMQP_DIST_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$AMQP_DIST_PORT "
            EPMD_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$EPMD_PORT "
            AMQP_NODE="outbox-test-$$@localhost"
            save_ports
            rabbit_init
            rabbit_start
            ;;
        redis)
            REDIS_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$REDIS_PORT "
            save_ports
            redis_init
            redis_start
            ;;
        rabbitmq-cluster)
            local i port
            CLUSTER_EPMD_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$CLUSTER_EPMD_PORT "
            for ((i = 1; i <= CLUSTER_SIZE; i++)); do
                port=$(pick_port)
                PICKED_PORTS="$PICKED_PORTS$port "
                CLUSTER_PORTS="$CLUSTER_PORTS${CLUSTER_PORTS:+ }$port"
                port=$(pick_port)
                PICKED_PORTS="$PICKED_PORTS$port "
                CLUSTER_DIST_PORTS="$CLUSTER_DIST_PORTS${CLUSTER_DIST_PORTS:+ }$port"
                CLUSTER_NODES="$CLUSTER_NODES${CLUSTER_NODES:+ }outbox-ha-$$-$i@localhost"
            done
            save_ports
            cluster_init
            cluster_start
            ;;
        postgres-standby)
            [ -n "$PG_PORT" ] || die "postgres-standby needs postgres: start DIR postgres postgres-standby"
            PG_STANDBY_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$PG_STANDBY_PORT "
            save_ports
            standby_init
            standby_start
            ;;
        nats)
            NATS_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$NATS_PORT "
            save_ports
            nats_init
            nats_start
            ;;
        nats-cluster)
            local n nats_port
            for ((n = 1; n <= CLUSTER_SIZE; n++)); do
                nats_port=$(pick_port)
                PICKED_PORTS="$PICKED_PORTS$nats_port "
                NATS_CLUSTER_PORTS="$NATS_CLUSTER_PORTS${NATS_CLUSTER_PORTS:+ }$nats_port"
                nats_port=$(pick_port)
                PICKED_PORTS="$PICKED_PORTS$nats_port "
                NATS_ROUTE_PORTS="$NATS_ROUTE_PORTS${NATS_ROUTE_PORTS:+ }$nats_port"
            done
            save_ports
            nats_cluster_init
            nats_cluster_start
            ;;
        kafka)
            KAFKA_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$KAFKA_PORT "
            KAFKA_CONTROLLER_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$KAFKA_CONTROLLER_PORT "
            KAFKA_SASL_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$KAFKA_SASL_PORT "
            KAFKA_SSL_PORT=$(pick_port)
            PICKED_PORTS="$PICKED_PORTS$KAFKA_SSL_PORT "
            save_ports
            kafka_init
            kafka_start
            ;;
        kafka-cluster)
            local k kafka_port
            for ((k = 1; k <= CLUSTER_SIZE; k++)); do
                kafka_port=$(pick_port)
                PICKED_PORTS="$PICKED_PORTS$kafka_port "
                KAFKA_CLUSTER_PORTS="$KAFKA_CLUSTER_PORTS${KAFKA_CLUSTER_PORTS:+ }$kafka_port"
                kafka_port=$(pick_port)
                PICKED_PORTS="$PICKED_PORTS$kafka_port "
                KAFKA_CLUSTER_CONTROLLER_PORTS="$KAFKA_CLUSTER_CONTROLLER_PORTS${KAFKA_CLUSTER_CONTROLLER_PORTS:+ }$kafka_port"
            done
            save_ports
            kafka_cluster_init
            kafka_cluster_start
            ;;
        esac
        write_env
    done
}

command_stop() {
    [ -d "$DIR" ] || return 0
    load_ports
    local service nested
    # stacks a test started inside this one (tests/ha) go first
    for nested in "$DIR"/*/ports; do
        if [ -f "$nested" ]; then
            "$0" stop "$(dirname "$nested")" || true
        fi
    done
    for service in $STOP_ORDER; do
        service_stop "$service"
    done
}

command_service() {
    local command=$1 service=${2:-}
    [ -n "$service" ] || die "usage: stack.sh $command DIR NAME"
    check_service "$service"
    [ -d "$DIR" ] || die "no stack in $DIR"
    DIR=$(cd "$DIR" && pwd)
    load_ports
    service_configured "$service" || die "$service was not started in $DIR"
    case "$command" in
    stop-service) service_stop "$service" ;;
    start-service) service_start "$service" ;;
    kill-service) service_kill "$service" ;;
    restart-service)
        if [ "$service" = postgres ]; then
            as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -m fast -w \
                -t "$START_TIMEOUT" restart >/dev/null 2>&1 ||
                fail_with_log "postgres failed to restart on 127.0.0.1:$PG_PORT" "$DIR/pg.log"
        else
            service_stop "$service"
            service_start "$service"
        fi
        ;;
    esac
}

usage() {
    sed -n '3,18p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[ $# -ge 2 ] || usage
COMMAND=$1
DIR=$2
shift 2
case "$COMMAND" in
start) command_start "$@" ;;
stop) command_stop ;;
stop-service | start-service | restart-service | kill-service) command_service "$COMMAND" "$@" ;;
rabbitmqctl)
    [ -d "$DIR" ] || die "no stack in $DIR"
    DIR=$(cd "$DIR" && pwd)
    load_ports
    [ -n "$AMQP_NODE" ] || die "rabbitmq was not started in $DIR"
    rabbitmqctl_run "$@"
    ;;
cluster-rabbitmqctl)
    [ -d "$DIR" ] || die "no stack in $DIR"
    DIR=$(cd "$DIR" && pwd)
    load_ports
    [ -n "$CLUSTER_NODES" ] || die "rabbitmq-cluster was not started in $DIR"
    [ $# -ge 1 ] || usage
    NODE_INDEX=$1
    shift
    with_cluster_node "$NODE_INDEX" rabbitmqctl_run "$@"
    ;;
crash-primary)
    [ -d "$DIR" ] || die "no stack in $DIR"
    DIR=$(cd "$DIR" && pwd)
    load_ports
    [ -n "$PG_PORT" ] || die "postgres was not started in $DIR"
    as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg" -m immediate -w -t "$STOP_TIMEOUT" stop >/dev/null
    ;;
promote-standby)
    [ -d "$DIR" ] || die "no stack in $DIR"
    DIR=$(cd "$DIR" && pwd)
    load_ports
    [ -n "$PG_STANDBY_PORT" ] || die "postgres-standby was not started in $DIR"
    as_user postgres "$PG_BIN/pg_ctl" -D "$DIR/pg-standby" -w -t "$START_TIMEOUT" promote >/dev/null
    ;;
kill-kafka-node | start-kafka-node)
    [ -d "$DIR" ] || die "no stack in $DIR"
    DIR=$(cd "$DIR" && pwd)
    case "${1:-}" in 1 | 2 | 3) ;; *) die "usage: stack.sh $COMMAND DIR N (1-3)" ;; esac
    [ -f "$DIR/kafka-$1/server.properties" ] || die "kafka-cluster was not started in $DIR"
    if [ "$COMMAND" = kill-kafka-node ]; then
        kill -KILL "$(tr -dc 0-9 <"$DIR/kafka-$1/kafka.pid")" || die "kafka node $1 is not running"
    else
        "$KAFKA_SH" start "$DIR/kafka-$1"
    fi
    ;;
*) usage ;;
esac
