#!/bin/bash
# test_console.sh - the operator's console in a real browser: Debian's headless Chromium,
# driven by console.mjs with playwright-core from npm (installed here by `npm ci` into
# tests/browser/node_modules; never a browser download). Seeds two databases, starts
# `outboxctl --databases FILE serve` over them with a token and --allow-actions, runs the
# browser session (on the list's first database, then switching to the other), then
# checks in the databases what the clicks did. The overview's screenshot is saved as
# $BUILD/console/overview.png.
. "$(dirname "$0")/../deploy/lib.sh"

BROWSER_DIR=$SOURCE_DIR/tests/browser
for tool in node npm psql curl; do
    command -v "$tool" >/dev/null || fail "$tool is missing (see tests/harness/deps.sh)"
done
[ -x /usr/bin/chromium ] || fail "/usr/bin/chromium is missing: apt-get install chromium"

# npm ci again only when the lock file changed since the last install
stamp=$BROWSER_DIR/node_modules/.outbox-lock
if ! cmp -s "$BROWSER_DIR/package-lock.json" "$stamp" 2>/dev/null; then
    (cd "$BROWSER_DIR" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund \
        --loglevel=error) >"$SCRATCH/npm.log" 2>&1 || fail "npm ci: $(tail -n 3 "$SCRATCH/npm.log")"
    cp "$BROWSER_DIR/package-lock.json" "$stamp"
fi

new_database browser
url=$DATABASE_URL
xss='<img src=x onerror=alert(1)>'
psql -X -q -v ON_ERROR_STOP=1 -v xss="$xss" "$url" >/dev/null <<'SQL' || fail "unable to seed"
SELECT outbox.enqueue('orders', jsonb_build_object('n', i)) FROM generate_series(1, 3) AS i;
SELECT outbox.enqueue('billing', '{}');
INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts, finished_at, last_error)
VALUES ('orders', '{"html": "<b>bold</b>"}', 'dead', 3, 3, now(), :'xss');
INSERT INTO outbox.job (queue, payload, state, attempts, finished_at, created_at)
SELECT 'orders', '{}', 'succeeded', 1, now() - interval '10 minutes' + i * interval '1 minute',
       now() - interval '20 minutes' + i * interval '1 minute'
  FROM generate_series(1, 5) AS i;
SELECT outbox.stream_enable('events', 2);
SELECT outbox.enqueue('events', jsonb_build_object('n', i)) FROM generate_series(1, 7) AS i;
SQL
dead_id=$(psql -X -At "$url" -c "SELECT job_id FROM outbox.job WHERE state = 'dead'")
new_database other
other_url=$DATABASE_URL
psql -X -q -v ON_ERROR_STOP=1 "$other_url" -c "SELECT outbox.enqueue('elsewhere', '{}')" \
    >/dev/null || fail "unable to seed the other database"
printf 'main %s\nother %s\n' "$url" "$other_url" >"$SCRATCH/databases.list"
# the rows of each partition of the stream 'events', "0:N0,1:N1"
stream_lag=$(psql -X -At "$url" -c "SELECT string_agg(p || ':' || (SELECT count(*) FROM outbox.job
    WHERE queue = 'events' AND stream_partition = p), ',' ORDER BY p) FROM generate_series(0, 1) AS p")

token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
(umask 077 && printf '%s\n' "$token" >"$SCRATCH/token")
port=$(free_port)
"$BIN/outboxctl" --databases "$SCRATCH/databases.list" serve --listen "127.0.0.1:$port" \
    --auth-token-file "$SCRATCH/token" --allow-actions >"$SCRATCH/console.log" 2>&1 &
console_pid=$!
CLEANUP="$CLEANUP; kill $console_pid 2>/dev/null; wait $console_pid 2>/dev/null"
wait_until "curl -fsS http://127.0.0.1:$port/static/console.css" 10 ||
    fail "the console did not start: $(tail -n 3 "$SCRATCH/console.log")"

mkdir -p "$BUILD/console"
screenshot=$(cd "$BUILD/console" && pwd)/overview.png
rm -f "$screenshot"
CONSOLE_URL="http://127.0.0.1:$port" CONSOLE_TOKEN="$token" SCREENSHOT="$screenshot" \
    USER_DATA_DIR="$SCRATCH/chromium-profile" DEAD_JOB_ID="$dead_id" XSS_ERROR="$xss" \
    EXPECT_READY=3 EXPECT_DEAD=1 EXPECT_REPLAY=5 REPLAY_SINCE="-infinity" \
    STREAM_QUEUE=events EXPECT_STREAM_LAG="$stream_lag" OTHER_DATABASE=other OTHER_QUEUE=elsewhere \
    timeout 180 node "$BROWSER_DIR/console.mjs" || {
    echo "console log:" >&2
    tail -n 20 "$SCRATCH/console.log" >&2
    fail "the browser session failed"
}
[ -s "$screenshot" ] || fail "no screenshot at $screenshot"

# what the clicks did, seen from the database
state=$(psql -X -At "$url" -c "SELECT state FROM outbox.job WHERE job_id = $dead_id")
[ "$state" = ready ] || fail "the retried row is '$state', not ready"
psql -X -At "$url" -c "SELECT count(*) FROM outbox.paused WHERE queue = 'orders'
    AND ordering_key = 'customer-7'" | grep -qx 1 || fail "the key is not paused"
psql -X -At "$url" -c "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'" | grep -qx 0 ||
    fail "the replay left succeeded rows"
psql -X -At "$url" -c "SELECT count(*) FROM outbox.paused WHERE queue = 'billing'" | grep -qx 0 ||
    fail "a page on a rebinding name paused a queue"
grep -q "action dead/retry by session" "$SCRATCH/console.log" || fail "the retry was not logged"
psql -X -At "$other_url" -c "SELECT count(*) FROM outbox.paused" | grep -qx 0 ||
    fail "an action of the first database's pages paused the other"
pass "console in Chromium: login, counts, stream partitions, escaped last_error, retry, pause, replay, databases and switching, rebinding refused"
