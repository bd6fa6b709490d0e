#!/bin/bash
# kafka.sh - the Apache Kafka broker of the test stack: fetched from Maven Central, run in KRaft mode.
#
#   kafka.sh fetch                                      resolve the broker into the cache, print its path
#   kafka.sh cached                                     exit 0 when the cache holds the broker (no fetch)
#   kafka.sh init NODE_DIR ID PORT CONTROLLER_PORT VOTERS CLUSTER_ID [SASL_PORT SSL_PORT USER PASSWORD]
#                                                       write server.properties, format the storage
#   kafka.sh start NODE_DIR                             start the node, wait until it serves
#   kafka.sh stop NODE_DIR                              stop it (TERM, then KILL)
#   kafka.sh cluster-id                                 print a new KRaft cluster id
#
# There is no Kafka in Debian: the broker and its dependencies are resolved by Maven from
# tests/harness/kafka/pom.xml into OUTBOX_KAFKA_CACHE (default
# /var/cache/outbox-relay-tests/kafka-VERSION), outside the source tree, once; every later
# run reuses the cache. A node is a combined broker + controller (process.roles=broker,controller)
# listening on 127.0.0.1 only, with its data, configuration, log and pid under NODE_DIR.
# VOTERS is the controller.quorum.voters list ("1@127.0.0.1:p1,2@127.0.0.1:p2,...").
# With SASL_PORT and SSL_PORT the node also listens there: SASL_PLAINTEXT taking USER with
# PASSWORD by PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (the SCRAM credentials are written at
# storage format time), and SSL with a certificate for localhost and 127.0.0.1 signed by a
# throwaway CA made for the node, NODE_DIR/tls/ca.pem (the key of the CA is not kept).
# Messages: one line "kafka: ..." on stderr and exit 1 when something fails.
set -eu

SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
POM=$SOURCE_DIR/tests/harness/kafka/pom.xml
VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")
CACHE=${OUTBOX_KAFKA_CACHE:-/var/cache/outbox-relay-tests/kafka-$VERSION}
HEAP=${OUTBOX_KAFKA_HEAP:-512m}
START_TIMEOUT=${OUTBOX_TEST_START_TIMEOUT:-90}
STOP_TIMEOUT=30

die() {
    echo "kafka: $*" >&2
    exit 1
}

fail_with_log() {
    echo "kafka: $1 (log $2)" >&2
    [ -f "$2" ] && tail -n 15 "$2" | sed 's/^/kafka:   | /' >&2
    exit 1
}

# The cache is complete when the marker written after a successful copy is there.
fetch() {
    local tmp log
    if [ -f "$CACHE/.complete" ]; then
        echo "$CACHE"
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || die "mvn not found: install maven (tests/harness/deps.sh)"
    command -v java >/dev/null 2>&1 || die "java not found: install openjdk-17-jre-headless (tests/harness/deps.sh)"
    mkdir -p "$(dirname "$CACHE")"
    # a lock, so that two stacks starting at once do not both download
    exec 8>"$(dirname "$CACHE")/.kafka-fetch.lock"
    flock -w 600 8 || die "timed out waiting for $(dirname "$CACHE")/.kafka-fetch.lock"
    if [ ! -f "$CACHE/.complete" ]; then
        tmp="$CACHE.partial.$$"
        log="$(dirname "$CACHE")/kafka-fetch.log"
        rm -rf "$tmp"
        if ! (cd "$SOURCE_DIR/tests/harness/kafka" &&
            mvn -q -B -Dstyle.color=never dependency:copy-dependencies -DincludeScope=runtime \
                -DoutputDirectory="$tmp") >"$log" 2>&1; then
            rm -rf "$tmp"
            fail_with_log "unable to fetch Apache Kafka $VERSION from Maven Central into $CACHE" "$log"
        fi
        [ -f "$tmp/kafka_2.13-$VERSION.jar" ] || die "the fetch of Apache Kafka $VERSION holds no kafka_2.13-$VERSION.jar"
        touch "$tmp/.complete"
        rm -rf "$CACHE"
        mv "$tmp" "$CACHE"
    fi
    exec 8>&-
    echo "$CACHE"
}

java_run() {
    local node=$1
    shift
    exec 9>&-
    exec java -Xms128m -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$node/log4j2.properties" -Dkafka.logs.dir="$node" \
        -cp "$CACHE/*" "$@"
}

# A CA made for the node and a server certificate it signs (EC keys: made in milliseconds),
# the key and chain in one PEM file the broker reads as its keystore.
make_certificates() {
    local tls=$1
    mkdir -p "$tls"
    (
        cd "$tls" &&
            openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
                -subj "/CN=outbox test CA" -keyout ca.key -out ca.pem &&
            openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
                -subj "/CN=localhost" -keyout server.key -out server.csr &&
            printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext &&
            openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 7 \
                -extfile server.ext -out server.pem &&
            cat server.key server.pem >keystore.pem &&
            rm -f ca.key ca.srl server.csr server.ext server.key
    ) >"$tls/openssl.log" 2>&1 || fail_with_log "unable to make the certificates of $tls" "$tls/openssl.log"
}

# The SASL_PLAINTEXT and SSL listeners' settings, appended to server.properties.
secure_properties() {
    local node=$1 user=$2 password=$3
    cat <<EOF
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$user="$password";
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location=$node/tls/keystore.pem
EOF
}

command_init() {
    local node=$1 id=$2 port=$3 controller_port=$4 voters=$5 cluster_id=$6
    local sasl_port=${7:-} ssl_port=${8:-} user=${9:-} password=${10:-}
    local replicas listeners advertised protocols scram=()
    [ -f "$CACHE/.complete" ] || fetch >/dev/null
    replicas=$(echo "$voters" | tr ',' '\n' | wc -l)
    [ "$replicas" -le 3 ] || replicas=3
    mkdir -p "$node/data"
    listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
    advertised=PLAINTEXT://127.0.0.1:$port
    protocols=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
    if [ -n "$sasl_port" ]; then
        listeners=$listeners,SASL_PLAINTEXT://127.0.0.1:$sasl_port,SSL://127.0.0.1:$ssl_port
        advertised=$advertised,SASL_PLAINTEXT://127.0.0.1:$sasl_port,SSL://127.0.0.1:$ssl_port
        protocols=$protocols,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL
        scram=(--add-scram "SCRAM-SHA-256=[name=$user,password=$password]"
            --add-scram "SCRAM-SHA-512=[name=$user,password=$password]")
        make_certificates "$node/tls"
    fi
    cat >"$node/server.properties" <<EOF
# outbox test stack: one combined broker + controller node
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$node/data
# the relay never creates topics: a missing one must stay missing
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=$replicas
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
background.threads=2
log.retention.hours=1
EOF
    cat >"$node/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $node/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = info
logger.state.name = state.change.logger
logger.state.level = warn
EOF
    [ -z "$sasl_port" ] || secure_properties "$node" "$user" "$password" >>"$node/server.properties"
    if ! (java_run "$node" kafka.tools.StorageTool format -t "$cluster_id" \
        -c "$node/server.properties" --ignore-formatted "${scram[@]}") >"$node/format.log" 2>&1; then
        fail_with_log "unable to format the storage of node $id" "$node/format.log"
    fi
}

pid_alive() {
    [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null
}

port_of() {
    sed -n 's/^listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\),.*/\1/p' "$1/server.properties"
}

command_start() {
    local node=$1 pid i port
    [ -f "$node/server.properties" ] || die "no node in $node (kafka.sh init first)"
    port=$(port_of "$node")
    : >>"$node/server.log"
    # started from this point: the readiness line must be a new one
    local lines
    lines=$(wc -l <"$node/server.log")
    (cd "$node" && java_run "$node" kafka.Kafka "$node/server.properties" \
        </dev/null >>"$node/stdout.log" 2>&1) &
    pid=$!
    echo "$pid" >"$node/kafka.pid"
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        pid_alive "$pid" || fail_with_log "kafka node exited while starting on 127.0.0.1:$port" "$node/server.log"
        if tail -n +"$((lines + 1))" "$node/server.log" | grep -q "Kafka Server started"; then
            return 0
        fi
        sleep 0.1
    done
    command_stop "$node"
    fail_with_log "kafka failed to start on 127.0.0.1:$port" "$node/server.log"
}

command_stop() {
    local node=$1 pid i
    [ -f "$node/kafka.pid" ] || return 0
    pid=$(tr -dc 0-9 <"$node/kafka.pid")
    if pid_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
            pid_alive "$pid" || break
            sleep 0.1
        done
        pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$node/kafka.pid"
}

case "${1:-}" in
fetch) fetch ;;
cached) [ -f "$CACHE/.complete" ] && command -v java >/dev/null 2>&1 ;;
cluster-id)
    # what StorageTool random-uuid prints: 16 random bytes, base64url without padding, never
    # starting with '-' (the storage tool would read such an id as an option)
    while :; do
        id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
        case "$id" in -*) ;; *) break ;; esac
    done
    echo "$id"
    ;;
init)
    [ $# -eq 7 ] || [ $# -eq 11 ] ||
        die "usage: kafka.sh init NODE_DIR ID PORT CONTROLLER_PORT VOTERS CLUSTER_ID [SASL_PORT SSL_PORT USER PASSWORD]"
    shift
    command_init "$@"
    ;;
start)
    [ $# -eq 2 ] || die "usage: kafka.sh start NODE_DIR"
    command_start "$2"
    ;;
stop)
    [ $# -eq 2 ] || die "usage: kafka.sh stop NODE_DIR"
    command_stop "$2"
    ;;
*)
    sed -n '3,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
