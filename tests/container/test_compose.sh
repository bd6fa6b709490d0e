#!/bin/bash
# test_compose.sh - docker-compose.yml as the README runs it, under podman-compose (Debian's),
# with compose.local.yml swapping each server's official image for a stand-in built here from
# Debian 12 packages: every service comes up, `migrate` applies the schema, and the demo's rows
# (committed orders, every 10th transaction rolled back) reach RabbitMQ through the relay, each
# committed row once and no rolled-back one; /healthz answers on the published port (every
# host port chosen through its HOST_PORT_* variable); the relay's
# image reaches NATS JetStream and Kafka on the compose network (--check).
. "$(dirname "$0")/../deploy/lib.sh"
. tests/container/podman.sh

TOOLS=$BUILD/tests/tools
make --no-print-directory BUILD="$BUILD" BIN="$BIN" LIB="$LIB" "$TOOLS/outbox_consumer" \
    "$TOOLS/outbox_producer" >/dev/null || fail "unable to build the demo's producer and consumer"
command -v podman-compose >/dev/null || fail "podman-compose is missing (Debian package podman-compose)"
# Every host port through its variable (docker-compose.yml's defaults may be taken on a host):
# free ones, which also proves the override.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
for name in POSTGRES RABBITMQ RABBITMQ_UI REDIS NATS METRICS; do
    export "HOST_PORT_$name=$(free_port)"
done

# Like wait_until, for commands that take seconds each: retries command $1 until $2 seconds of
# wall time have passed.
wait_seconds() {
    local deadline=$(($(date +%s) + $2))
    until eval "$1" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 1
    done
}

# --- the servers' stand-in images ----------------------------------------------------------
KAFKA_LIBS=$(tests/harness/kafka.sh fetch) || fail "no Kafka broker (tests/harness/kafka.sh fetch)"
packages="postgresql-15,rabbitmq-server,redis-server,redis-tools,nats-server,openjdk-17-jre-headless"
base=$(test_base_image debian-servers "$packages")
debian_image "$base" "$packages" || fail "unable to make $base"
for server in postgres:15 rabbitmq:3 redis:7 nats:2 kafka:4.1.0; do
    name=${server%%:*}
    image=localhost/outbox-test/$server
    # rebuilt when its entrypoint changes: the tag carries the script's hash
    hash=$(cat "tests/container/servers/$name.sh" tests/container/servers/Containerfile | sha256sum | cut -c1-12)
    if ! podman image exists "$image-$hash"; then
        context=$SCRATCH/$name
        mkdir -p "$context"
        cp "tests/container/servers/$name.sh" "$context/entrypoint.sh"
        [ "$name" != kafka ] || cp -r "$KAFKA_LIBS" "$context/libs"
        podman build --quiet --isolation chroot --build-arg BASE="$base" -t "$image-$hash" \
            -f tests/container/servers/Containerfile "$context" >/dev/null ||
            fail "unable to build the stand-in for $server"
    fi
    podman tag "$image-$hash" "$image"
done
pass "stand-ins for postgres, rabbitmq, redis, nats and kafka from Debian packages"

# --- the README's commands ------------------------------------------------------------------
# make image IMAGE=outbox-relay:local (run.sh built it already: the same image, one more name)
podman tag "$TEST_IMAGE" localhost/outbox-relay:local
project=outboxcompose$$
compose=(podman-compose -p "$project" -f docker-compose.yml -f tests/container/compose.local.yml)
CLEANUP="$CLEANUP; ${compose[*]} down -v >/dev/null 2>&1; podman volume ls -q | grep '^${project}_' | xargs -r podman volume rm -f >/dev/null 2>&1"
up_started=$(date +%s)
"${compose[@]}" up -d > "$SCRATCH/compose-up.log" 2>&1 || { cat "$SCRATCH/compose-up.log" >&2; fail "podman-compose up failed"; }

database=postgresql://outbox:outbox@127.0.0.1:$HOST_PORT_POSTGRES/outbox
amqp=amqp://outbox:outbox@127.0.0.1:$HOST_PORT_RABBITMQ/%2f
wait_seconds "[ \"\$(podman inspect --format '{{.State.Status}} {{.State.ExitCode}}' ${project}_migrate_1)\" = 'exited 0' ]" 360 ||
    { podman logs "${project}_migrate_1" >&2; podman logs "${project}_postgres_1" | tail -n 20 >&2; fail "migrate did not succeed within 360 s"; }
pass "migrate applied the schema ($(($(date +%s) - up_started)) s after up)"
wait_seconds "'$TOOLS/outbox_consumer' --broker '$amqp' --queue orders --declare --expect 0" 360 ||
    { podman logs "${project}_rabbitmq_1" | tail -n 20 >&2; fail "RabbitMQ did not take connections within 360 s"; }

"$TOOLS/outbox_producer" --database-url "$database" --queue orders --count 2000 --threads 4 \
    --rollback-every 10 > "$SCRATCH/producer.log" 2>&1 || { cat "$SCRATCH/producer.log" >&2; fail "the producer failed"; }
committed=$(psql -qAtX "$database" -c "SELECT count(*) FROM outbox.job WHERE queue = 'orders'")
"$TOOLS/outbox_consumer" --broker "$amqp" --queue orders --expect "$committed" --idle-timeout 60 \
    --ids-file "$SCRATCH/ids" > "$SCRATCH/count" 2>&1 ||
    { podman logs "${project}_relay_1" | tail -n 30 >&2; fail "the consumer failed: $(cat "$SCRATCH/count")"; }
grep -q "unique=$committed duplicates=0 " "$SCRATCH/count" ||
    { podman logs "${project}_relay_1" | tail -n 30 >&2; fail "not every committed row once: $(cat "$SCRATCH/count")"; }
psql -qAtX "$database" -c "SELECT job_id FROM outbox.job WHERE queue = 'orders'" | sort -n > "$SCRATCH/db-ids"
sort -n "$SCRATCH/ids" | cmp -s - "$SCRATCH/db-ids" || fail "the ids in RabbitMQ are not the table's"
pass "the demo's $committed committed rows reached RabbitMQ through the compose stack, each once (of 2000, every 10th rolled back)"
curl -fsS "http://127.0.0.1:$HOST_PORT_METRICS/healthz" | grep -qx ok ||
    fail "the relay's /healthz on 127.0.0.1:$HOST_PORT_METRICS (HOST_PORT_METRICS) is not ok"
pass "/healthz ok on the published port, every host port as its HOST_PORT_* variable said"

# NATS and Kafka, from the relay's image on the compose network: --check connects and gets the
# broker's own answer about what it holds (the compose file creates no stream and no topic, and
# the relay never creates them), which it can only give once JetStream or the Kafka metadata
# answered.
check_broker() {
    local broker=$1 answer=$2
    podman run --rm --ulimit host --network "${project}_default" --health-interval disable \
        localhost/outbox-relay:local --check --metrics-addr off \
        --database-url postgresql://outbox:outbox@postgres:5432/outbox --broker "$broker" \
        > "$SCRATCH/check" 2>&1
    grep -q "$answer" "$SCRATCH/check"
}
wait_seconds "check_broker nats://nats:4222 'no jetstream stream covers'" 300 ||
    { cat "$SCRATCH/check" >&2; podman logs "${project}_nats_1" 2>&1 | tail -n 20 >&2; fail "--check against nats://nats:4222"; }
pass "the relay's image reaches JetStream at nats://nats:4222 on the compose network"
wait_seconds "check_broker kafka://kafka:9092 'kafka://kafka:9092 has no topic'" 300 ||
    { cat "$SCRATCH/check" >&2; podman logs "${project}_kafka_1" 2>&1 | tail -n 20 >&2; fail "--check against kafka://kafka:9092"; }
pass "the relay's image reaches Kafka at kafka://kafka:9092 on the compose network"
echo "compose: $(($(date +%s) - up_started)) s from up to the last check"
