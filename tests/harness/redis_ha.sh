#!/bin/bash
# redis_ha.sh - throwaway Redis Sentinel and Redis Cluster deployments for the tests.
#
#   redis_ha.sh sentinel DIR         a primary, one replica and three sentinels (master "outbox")
#   redis_ha.sh cluster DIR          three masters, each with one replica
#   redis_ha.sh start-node DIR NAME  start one server again on its port and config (e.g. after kill -9)
#   redis_ha.sh stop DIR             stop everything started in DIR
#
# Runs as root; the servers run as user redis when it exists. Every server listens on
# 127.0.0.1 only, on a free port from OUTBOX_TEST_PORT_RANGE (default 20000-32000) whose
# cluster bus port (port + 10000) is free too and below the kernel's ephemeral ports, picked
# under the same lock as tests/harness/stack.sh. Every server requires the password
# outbox-test-secret (sentinels too). Nothing is persisted: a killed server restarts empty.
#
# After start, DIR/env exports OUTBOX_TEST_REDIS_HA_PASSWORD and
#   sentinel: OUTBOX_TEST_SENTINEL_URL (redis+sentinel://...), OUTBOX_TEST_SENTINEL_PORTS,
#             OUTBOX_TEST_SENTINEL_PRIMARY_PORT, OUTBOX_TEST_SENTINEL_REPLICA_PORT
#   cluster:  OUTBOX_TEST_CLUSTER_URL (redis+cluster://...), OUTBOX_TEST_CLUSTER_PORTS
# and DIR/<name>.pid holds the pid of server <name> (primary, replica, sentinel1..3, node1..6).
set -eu

PASSWORD=outbox-test-secret
MASTER_NAME=outbox
START_TIMEOUT=${OUTBOX_TEST_START_TIMEOUT:-60}

die() {
    echo "redis_ha: $*" >&2
    exit 1
}

port_in_use() {
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
}

PICKED_PORTS=" "
# Prints a free port whose bus port (port + 10000) is free too, and below the kernel's
# ephemeral ports, where an outgoing connection could take it before the node binds it.
pick_port() {
    local range=${OUTBOX_TEST_PORT_RANGE:-20000-32000}
    local low=${range%-*} high=${range#*-} span port i ephemeral
    ephemeral=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$high" -lt $((ephemeral - 10000)) ] || high=$((ephemeral - 10001))
    [ "$low" -le "$high" ] || die "OUTBOX_TEST_PORT_RANGE leaves no port whose bus port (+10000) is below $ephemeral"
    span=$((high - low + 1))
    port=$((low + (RANDOM * 32768 + RANDOM) % span))
    for ((i = 0; i < span && i < 2000; i++)); do
        case "$PICKED_PORTS" in
        *" $port "*) ;;
        *)
            if ! port_in_use "$port" && ! port_in_use $((port + 10000)); then
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

take_lock() {
    exec 9>"${TMPDIR:-/tmp}/outbox-test-stack.lock"
    flock -w 300 9 || die "timed out waiting for the port lock"
}

run_as_redis() {
    if id redis >/dev/null 2>&1; then
        setpriv --reuid=redis --regid=redis --init-groups -- "$@" 9>&-
    else
        "$@" 9>&-
    fi
}

cli() {
    local port=$1
    shift
    REDISCLI_AUTH=$PASSWORD timeout 10 redis-cli -h 127.0.0.1 -p "$port" "$@"
}

wait_ping() {
    local port=$1 i
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        [ "$(cli "$port" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.1
    done
    die "redis on port $port did not start (logs in $DIR)"
}

# Writes DIR/<name>.conf for a data server; extra lines from stdin.
server_conf() {
    local name=$1 port=$2
    {
        cat <<EOF
bind 127.0.0.1
port $port
requirepass $PASSWORD
masterauth $PASSWORD
dir $DIR/$name
daemonize yes
pidfile $DIR/$name.pid
logfile $DIR/$name.log
appendonly no
save ""
EOF
        cat
    } >"$DIR/$name.conf"
    mkdir -p "$DIR/$name"
    echo "$port" >"$DIR/$name.port"
}

start_node() {
    local name=$1 mode
    mode=$(cat "$DIR/$name.mode")
    : >>"$DIR/$name.log"
    chown -R redis: "$DIR" 2>/dev/null || true
    rm -f "$DIR/$name.pid"
    if [ "$mode" = sentinel ]; then
        run_as_redis redis-sentinel "$DIR/$name.conf" >>"$DIR/$name.log" 2>&1
    else
        run_as_redis redis-server "$DIR/$name.conf" >>"$DIR/$name.log" 2>&1
    fi
    wait_ping "$(cat "$DIR/$name.port")"
}

command_sentinel() {
    local primary replica s ports="" i
    take_lock
    primary=$(pick_port)
    replica=$(pick_port)
    server_conf primary "$primary" </dev/null
    echo server >"$DIR/primary.mode"
    server_conf replica "$replica" <<EOF
replicaof 127.0.0.1 $primary
EOF
    echo server >"$DIR/replica.mode"
    start_node primary
    start_node replica
    for i in 1 2 3; do
        s=$(pick_port)
        mkdir -p "$DIR/sentinel$i"
        cat >"$DIR/sentinel$i.conf" <<EOF
bind 127.0.0.1
port $s
daemonize yes
pidfile $DIR/sentinel$i.pid
logfile $DIR/sentinel$i.log
dir $DIR/sentinel$i
requirepass $PASSWORD
sentinel monitor $MASTER_NAME 127.0.0.1 $primary 2
sentinel auth-pass $MASTER_NAME $PASSWORD
sentinel down-after-milliseconds $MASTER_NAME 1000
sentinel failover-timeout $MASTER_NAME 10000
sentinel parallel-syncs $MASTER_NAME 1
sentinel known-replica $MASTER_NAME 127.0.0.1 $replica
EOF
        echo "$s" >"$DIR/sentinel$i.port"
        echo sentinel >"$DIR/sentinel$i.mode"
        start_node "sentinel$i"
        ports="$ports${ports:+,}$s"
    done
    flock -u 9
    # the replica is in sync and every sentinel knows both servers before anyone uses them
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        if cli "$replica" info replication | grep -q '^master_link_status:up' &&
            [ "$(cli "$s" sentinel replicas "$MASTER_NAME" 2>/dev/null | grep -c "^127.0.0.1:$replica$")" = 1 ]; then
            break
        fi
        sleep 0.1
    done
    cat >"$DIR/env" <<EOF
export OUTBOX_TEST_REDIS_HA_PASSWORD='$PASSWORD'
export OUTBOX_TEST_SENTINEL_URL='redis+sentinel://default:$PASSWORD@127.0.0.1:${ports//,/,127.0.0.1:}/$MASTER_NAME'
export OUTBOX_TEST_SENTINEL_PORTS='$ports'
export OUTBOX_TEST_SENTINEL_PRIMARY_PORT=$primary
export OUTBOX_TEST_SENTINEL_REPLICA_PORT=$replica
EOF
}

command_cluster() {
    local i port ports="" seeds=""
    take_lock
    for i in 1 2 3 4 5 6; do
        port=$(pick_port)
        server_conf "node$i" "$port" <<EOF
cluster-enabled yes
cluster-config-file $DIR/node$i/nodes.conf
cluster-node-timeout 2000
EOF
        echo server >"$DIR/node$i.mode"
        start_node "node$i"
        ports="$ports${ports:+,}$port"
        seeds="$seeds 127.0.0.1:$port"
    done
    flock -u 9
    # shellcheck disable=SC2086
    REDISCLI_AUTH=$PASSWORD timeout 60 redis-cli --cluster create $seeds --cluster-replicas 1 \
        --cluster-yes >"$DIR/create.log" 2>&1 || die "cluster create failed (log $DIR/create.log)"
    # every node sees the cluster ok, with its three replicas
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        local settled=1 node
        for node in ${ports//,/ }; do
            if [ "$(cli "$node" cluster info | tr -d '\r' | grep '^cluster_state:')" != cluster_state:ok ] ||
                [ "$(cli "$node" cluster nodes | awk '$3 ~ /slave/' | wc -l)" != 3 ]; then
                settled=0
                break
            fi
        done
        [ "$settled" = 1 ] && break
        sleep 0.1
    done
    cat >"$DIR/env" <<EOF
export OUTBOX_TEST_REDIS_HA_PASSWORD='$PASSWORD'
export OUTBOX_TEST_CLUSTER_URL='redis+cluster://default:$PASSWORD@127.0.0.1:${ports//,/,127.0.0.1:}'
export OUTBOX_TEST_CLUSTER_PORTS='$ports'
EOF
}

command_stop() {
    local pidfile pid i
    for pidfile in "$DIR"/*.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(tr -dc 0-9 <"$pidfile")
        [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        rm -f "$pidfile"
    done
}

[ $# -ge 2 ] || { sed -n '3,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
COMMAND=$1
DIR=$2
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
chmod 0755 "$DIR"
case "$COMMAND" in
sentinel) command_sentinel ;;
cluster) command_cluster ;;
start-node) start_node "${3:?start-node needs a name}" ;;
stop) command_stop ;;
*) die "unknown command '$COMMAND'" ;;
esac
