#!/bin/bash
# test_prometheus.sh - the relay's metrics as Prometheus itself sees them:
#   promtool check metrics on the real /metrics output;
#   Debian's prometheus scrapes a running relay and its HTTP API reports
#   outbox_rows_published_total equal to the rows the relay published;
#   the alert rules pass promtool check rules and promtool test rules;
#   every query of the Grafana dashboard names a metric the relay exports (a
#   relay of one database or of a list, whose /metrics promtool checks too).
. "$(dirname "$0")/lib.sh"

ROWS=500
for tool in promtool prometheus curl jq; do
    command -v "$tool" >/dev/null || fail "$tool is missing (see tests/harness/deps.sh)"
done

new_database prometheus
url=$DATABASE_URL
psql -X -q -v ON_ERROR_STOP=1 "$url" \
    -c "SELECT outbox.enqueue('prom.orders', jsonb_build_object('n', i)) FROM generate_series(1, $ROWS) i" \
    >/dev/null || fail "unable to enqueue"
# a stream queue beside it, so the stream gauges are exported (and checked) too
psql -X -q -v ON_ERROR_STOP=1 "$url" -c "SELECT outbox.stream_enable('prom.events', 2)" \
    -c "SELECT outbox.enqueue('prom.events', jsonb_build_object('n', i)) FROM generate_series(1, 50) i" \
    >/dev/null || fail "unable to enqueue into a stream"
relay_port=$(free_port)
prefix="deploy-prometheus-$$:"
"$BIN/outbox-relay" --database-url "$url" --broker "$OUTBOX_TEST_REDIS_URL" \
    --stream-prefix "$prefix" --metrics-addr "127.0.0.1:$relay_port" --log-level warn \
    >"$SCRATCH/relay.log" 2>&1 &
relay_pid=$!
CLEANUP="$CLEANUP; kill $relay_pid 2>/dev/null; wait $relay_pid 2>/dev/null"
CLEANUP="$CLEANUP; redis-cli -p $OUTBOX_TEST_REDIS_PORT -a '$OUTBOX_TEST_REDIS_PASSWORD' --no-auth-warning del '${prefix}prom.orders' '${prefix}prom.events' >/dev/null 2>&1"
wait_until "psql -X -At '$url' -c \"SELECT count(*) = $ROWS FROM outbox.job WHERE state = 'succeeded'\" | grep -qx t" 60 ||
    fail "the relay did not publish $ROWS rows in 60 s: $(tail -n 5 "$SCRATCH/relay.log")"

metrics=$SCRATCH/metrics.txt
wait_until "curl -fsS 'http://127.0.0.1:$relay_port/metrics' | grep -q '^outbox_stream_lag_rows{.*prom.events'" 30 ||
    fail "no stream gauges in /metrics after 30 s: $(tail -n 5 "$SCRATCH/relay.log")"
curl -fsS "http://127.0.0.1:$relay_port/metrics" >"$metrics" || fail "GET /metrics"
promtool check metrics <"$metrics" || fail "promtool check metrics finds problems in /metrics"
pass "promtool check metrics"

# A relay of a list exports the per-database families (the dashboard's and rules' too).
new_database prometheus_list
list_url=$DATABASE_URL
psql -X -q -v ON_ERROR_STOP=1 "$list_url" \
    -c "SELECT outbox.enqueue('prom.orders', jsonb_build_object('n', i)) FROM generate_series(1, 20) i" \
    >/dev/null || fail "unable to enqueue into the list's database"
echo "tenant $list_url" >"$SCRATCH/databases.list"
list_port=$(free_port)
"$BIN/outbox-relay" --databases "$SCRATCH/databases.list" --broker "$OUTBOX_TEST_REDIS_URL" \
    --stream-prefix "$prefix" --metrics-addr "127.0.0.1:$list_port" --log-level warn \
    >"$SCRATCH/list-relay.log" 2>&1 &
list_pid=$!
CLEANUP="$CLEANUP; kill $list_pid 2>/dev/null; wait $list_pid 2>/dev/null"
list_metrics=$SCRATCH/list-metrics.txt
wait_until "curl -fsS 'http://127.0.0.1:$list_port/metrics' | grep -q '^outbox_database_ready_rows{.*tenant'" 30 ||
    fail "no per-database backlog in a list relay's /metrics after 30 s: $(tail -n 5 "$SCRATCH/list-relay.log")"
curl -fsS "http://127.0.0.1:$list_port/metrics" >"$list_metrics" || fail "GET /metrics of the list relay"
promtool check metrics <"$list_metrics" || fail "promtool check metrics finds problems in a list relay's /metrics"
pass "promtool check metrics of a relay of a list"

# Prometheus scrapes the relay every second; its API must agree with the relay.
prom_port=$(free_port)
cat >"$SCRATCH/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: outbox-relay
    static_configs:
      - targets: ['127.0.0.1:$relay_port']
YAML
prometheus --config.file="$SCRATCH/prometheus.yml" --storage.tsdb.path="$SCRATCH/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" >"$SCRATCH/prometheus.log" 2>&1 &
prom_pid=$!
CLEANUP="$CLEANUP; kill $prom_pid 2>/dev/null; wait $prom_pid 2>/dev/null"
query() {
    curl -fsS "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" |
        jq -r '.data.result[0].value[1] // empty'
}
published=""
for _ in $(seq 1 300); do
    published=$(query 'sum(outbox_rows_published_total{job="outbox-relay",queue="prom.orders"})' 2>/dev/null || true)
    [ "$published" = "$ROWS" ] && break
    sleep 0.1
done
[ "$published" = "$ROWS" ] ||
    fail "prometheus reports outbox_rows_published_total=${published:-nothing}, the relay published $ROWS: $(tail -n 3 "$SCRATCH/prometheus.log")"
[ "$(query 'up{job="outbox-relay"}')" = 1 ] || fail "prometheus does not see the relay up"
pass "prometheus scraped outbox_rows_published_total = $ROWS"

rules=deploy/prometheus/outbox-relay.rules.yml
promtool check rules "$rules" >/dev/null || fail "promtool check rules $rules"
promtool test rules deploy/prometheus/outbox-relay.rules.test.yml || fail "promtool test rules"
# Every alert has a test case.
for alert in $(sed -n 's/^ *- alert: //p' "$rules"); do
    grep -q "alertname: $alert\$" deploy/prometheus/outbox-relay.rules.test.yml ||
        fail "alert $alert has no promtool test"
done
pass "alert rules checked and unit-tested"

# Dashboard and rules name only metrics the relay exports (histogram series included).
dashboard=deploy/grafana/outbox-relay.json
jq -e '.panels | length > 0' "$dashboard" >/dev/null || fail "$dashboard is not a dashboard"
exported=$(cat "$metrics" "$list_metrics" | grep -v '^#' | sed 's/[{ ].*//' | sort -u)
named=$( (jq -r '.. | objects | (.expr?, .query?) // empty | strings' "$dashboard"; cat "$rules") |
    grep -o 'outbox_[a-z_]*' | sort -u)
[ -n "$named" ] || fail "no outbox_ metric in $dashboard"
for metric in $named; do
    echo "$exported" | grep -qx "$metric" || fail "$metric is used by the dashboard or rules but not exported"
done
pass "dashboard and rules use $(echo "$named" | wc -l) exported metrics"
