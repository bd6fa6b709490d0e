#!/bin/bash
# test_image.sh - the image as a user runs it, against the stack's PostgreSQL, Redis and RabbitMQ
# (reached with --network host): what the image holds (no shell, user 10001, HEALTHCHECK, OCI
# labels, its compressed size), then per broker 10 000 rows relayed, every one once, by a
# container that runs as uid 10001 and reads its broker password from a mounted file; the health
# check answers; and a SIGTERM in the middle of a backlog stops it within the grace time, exit 0,
# with every row published or back to ready. Prints the figures the README quotes.
. "$(dirname "$0")/../deploy/lib.sh"
. tests/container/podman.sh

ROWS=10000
GRACE=30 # seconds, as docs/deploy.md advises and the chart and compose file give
VERSION=$(sed -n 's/^VERSION *:= *//p' Makefile)
TOOLS=$BUILD/tests/tools
make --no-print-directory BUILD="$BUILD" BIN="$BIN" LIB="$LIB" "$TOOLS/outbox_consumer" >/dev/null ||
    fail "unable to build $TOOLS/outbox_consumer"

sql() {
    psql -qAtX -v ON_ERROR_STOP=1 "$DATABASE_URL" -c "$1"
}

# --- what the image is ---------------------------------------------------------------------
inspect=$(podman image inspect --format '{{.Config.User}}|{{json .Config.Entrypoint}}|{{index .Config.Labels "org.opencontainers.image.version"}}|{{index .Config.Labels "org.opencontainers.image.source"}}|{{json .Config.Healthcheck.Test}}' "$TEST_IMAGE")
[ "${inspect%%|*}" = "10001:10001" ] || fail "the image's user is not 10001:10001: $inspect"
case "$inspect" in
*'|["outbox-relay"]|'"$VERSION"'|'*'|["CMD","outbox-relay","--healthcheck"]') ;;
*) fail "entrypoint, version label or HEALTHCHECK unexpected: $inspect" ;;
esac
pass "user 10001, ENTRYPOINT outbox-relay, version label $VERSION, HEALTHCHECK outbox-relay --healthcheck"
if podman_run --rm --entrypoint /bin/sh "$TEST_IMAGE" -c true >/dev/null 2>&1; then
    fail "the image has a shell"
fi
podman_run --rm --entrypoint outboxctl "$TEST_IMAGE" --help >/dev/null || fail "outboxctl does not run"
pass "no shell in the image; outboxctl runs"
unpacked=$(podman image inspect --format '{{.Size}}' "$TEST_IMAGE")
compressed=$(podman save --format docker-archive "$TEST_IMAGE" 2>/dev/null | gzip -6 | wc -c)
echo "figure: image $(awk -v b="$compressed" 'BEGIN { printf "%.1f", b / 1048576 }') MiB compressed" \
    "(gzip of podman save), $(awk -v b="$unpacked" 'BEGIN { printf "%.1f", b / 1048576 }') MiB unpacked"
[ "$compressed" -le $((60 * 1048576)) ] || fail "the image is above 60 MiB compressed"

# --- one broker -----------------------------------------------------------------------------
# leg NAME BROKER_URL PASSWORD QUEUE CONSUMER_URL [relay variable=value...]: enqueue ROWS rows,
# run the image until all are published, then count them at the broker (the consumer gets
# CONSUMER_EXTRA too).
leg() {
    local name=$1 broker=$2 password=$3 queue=$4 consumer_url=$5
    shift 5
    local container="outbox-image-test-$name-$$" port secret started first now pid env_args=()
    for setting in "$@"; do
        env_args+=(-e "$setting")
    done
    new_database "$name"
    port=$(free_port)
    secret=$SCRATCH/$name-password
    printf '%s\n' "$password" > "$secret"
    chown 10001:10001 "$secret"
    chmod 0400 "$secret"
    sql "SELECT count(outbox.enqueue('$queue', jsonb_build_object('n', g))) FROM generate_series(1, $ROWS) g" >/dev/null

    started=$(date +%s.%N)
    podman_run -d --name "$container" \
        -v "$secret:/run/secrets/broker-password:ro" \
        -e OUTBOX_DATABASE_URL="$DATABASE_URL" -e OUTBOX_BROKER="$broker" \
        -e OUTBOX_BROKER_PASSWORD_FILE=/run/secrets/broker-password \
        -e OUTBOX_METRICS_ADDR="127.0.0.1:$port" "${env_args[@]}" "$TEST_IMAGE" >/dev/null ||
        fail "$name: podman run failed"
    CLEANUP="$CLEANUP; podman rm -f -t 0 $container >/dev/null 2>&1"
    wait_until "[ \"\$(sql \"SELECT count(*) FROM outbox.job WHERE state = 'succeeded'\")\" -gt 0 ]" 60 ||
        { podman logs "$container" >&2; fail "$name: nothing published within 60 s"; }
    first=$(date +%s.%N)
    echo "figure: $name: start to first publish $(awk -v a="$started" -v b="$first" 'BEGIN { printf "%.2f", b - a }') s (podman run to the first row marked)"
    wait_until "[ \"\$(sql \"SELECT count(*) FROM outbox.job WHERE state = 'succeeded'\")\" -eq $ROWS ]" 120 ||
        { podman logs "$container" >&2; fail "$name: $ROWS rows not published within 120 s"; }
    now=$(date +%s.%N)
    echo "figure: $name: $ROWS rows in $(awk -v a="$first" -v b="$now" 'BEGIN { printf "%.2f", b - a }') s after the first"

    "$TOOLS/outbox_consumer" --broker "$consumer_url" --queue "$queue" $CONSUMER_EXTRA --expect "$ROWS" \
        --idle-timeout 15 --ids-file "$SCRATCH/$name-ids" > "$SCRATCH/$name-count" ||
        fail "$name: the consumer failed: $(cat "$SCRATCH/$name-count")"
    grep -q "received=$ROWS unique=$ROWS duplicates=0 " "$SCRATCH/$name-count" ||
        fail "$name: not every row once: $(cat "$SCRATCH/$name-count")"
    sql "SELECT job_id FROM outbox.job" | sort -n > "$SCRATCH/$name-db-ids"
    sort -n "$SCRATCH/$name-ids" | cmp -s - "$SCRATCH/$name-db-ids" ||
        fail "$name: the ids at the broker are not the table's"
    pass "$name: $ROWS rows relayed by the container, each once, password read from a mounted file"

    pid=$(podman inspect --format '{{.State.Pid}}' "$container")
    [ "$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")" = 10001 ] ||
        fail "$name: the relay does not run as uid 10001: $(grep '^Uid:' "/proc/$pid/status")"
    [ "$(awk '/^Gid:/ { print $2 }' "/proc/$pid/status")" = 10001 ] || fail "$name: gid is not 10001"
    echo "figure: $name: RSS $(awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status") MiB," \
        "peak $(awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status") MiB after $ROWS rows"
    podman healthcheck run "$container" >/dev/null || fail "$name: podman healthcheck run says unhealthy"
    curl -fsS "http://127.0.0.1:$port/healthz" | grep -qx ok || fail "$name: /healthz is not ok"
    pass "$name: runs as uid 10001 (pid $pid), HEALTHCHECK healthy, /healthz ok"
    LEG_CONTAINER=$container
}

# SIGTERM while a backlog is being published: exit 0 within GRACE seconds, nothing left running,
# and what was marked is at the broker once.
stop_mid_backlog() {
    local name=$1 queue=$2 consumer_url=$3 container=$LEG_CONTAINER t0 t1 code
    sql "SELECT count(outbox.enqueue('$queue', jsonb_build_object('n', g))) FROM generate_series(1, 40000) g" >/dev/null
    wait_until "[ \"\$(sql \"SELECT count(*) FROM outbox.job WHERE state = 'succeeded'\")\" -gt $ROWS ]" 30 ||
        fail "$name: the second backlog is not being published"
    t0=$(date +%s.%N)
    podman stop -t "$GRACE" "$container" >/dev/null 2>&1
    t1=$(date +%s.%N)
    code=$(podman inspect --format '{{.State.ExitCode}}' "$container")
    echo "figure: $name: SIGTERM to exit $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s, status $code"
    [ "$code" = 0 ] || { podman logs "$container" | tail -n 20 >&2; fail "$name: exit status $code after SIGTERM"; }
    awk -v a="$t0" -v b="$t1" -v g="$GRACE" 'BEGIN { exit !(b - a < g) }' ||
        fail "$name: the relay outlived the $GRACE s grace time"
    podman logs "$container" 2>&1 | grep -q 'stopping.*SIGTERM' || fail "$name: no 'stopping' log line"
    [ "$(sql "SELECT count(*) FROM outbox.job WHERE state = 'running'")" = 0 ] ||
        fail "$name: rows left running after the stop"
    "$TOOLS/outbox_consumer" --broker "$consumer_url" --queue "$queue" $CONSUMER_EXTRA --idle-timeout 3 \
        --ids-file "$SCRATCH/$name-stop-ids" > "$SCRATCH/$name-stop-count" || true
    sql "SELECT job_id FROM outbox.job WHERE state = 'succeeded'" | sort -n > "$SCRATCH/$name-marked"
    sort -n "$SCRATCH/$name-stop-ids" | cmp -s - "$SCRATCH/$name-marked" ||
        fail "$name: the broker does not hold exactly the marked rows: $(cat "$SCRATCH/$name-stop-count")"
    pass "$name: SIGTERM mid-backlog: exit 0 within ${GRACE} s, $(wc -l < "$SCRATCH/$name-marked") rows published once, the rest ready"
}

prefix="image$$:"
CONSUMER_EXTRA="--stream-prefix $prefix"
leg redis "redis://127.0.0.1:$OUTBOX_TEST_REDIS_PORT/0" "$OUTBOX_TEST_REDIS_PASSWORD" orders \
    "$OUTBOX_TEST_REDIS_URL" OUTBOX_STREAM_PREFIX="$prefix"
stop_mid_backlog redis orders "$OUTBOX_TEST_REDIS_URL"
CONSUMER_EXTRA=""

queue="image-orders-$$"
"$TOOLS/outbox_consumer" --broker "$OUTBOX_TEST_AMQP_URL" --queue "$queue" --declare --expect 0 >/dev/null ||
    fail "unable to declare queue $queue"
leg amqp "amqp://guest@127.0.0.1:$OUTBOX_TEST_AMQP_PORT/" guest "$queue" "$OUTBOX_TEST_AMQP_URL"
podman stop -t "$GRACE" "$LEG_CONTAINER" >/dev/null 2>&1
[ "$(podman inspect --format '{{.State.ExitCode}}' "$LEG_CONTAINER")" = 0 ] || fail "amqp: exit status after SIGTERM"
pass "amqp: stopped with exit 0"
