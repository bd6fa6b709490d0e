#!/bin/bash
# screenshot.sh - makes docs/console.png, the console's overview that the README shows, again:
# three migrated databases with a shop's rows (several queues, dead rows, a paused queue, rows
# held by two relays, an hour of traffic), `outboxctl --databases FILE serve` over them, and
# Debian's headless Chromium (screenshot.mjs, playwright-core from npm; never a browser
# download) on the first database's overview, the database selector in the header. Not a
# test: `make console-screenshot` runs it. With OUTBOX_TEST_PG_URL unset it starts a
# PostgreSQL of its own (tests/harness/stack.sh) and stops it at the end. Writes $1, by
# default docs/console.png (a relative path is from the source tree).
. "$(dirname "$0")/../deploy/lib.sh"

BROWSER_DIR=$SOURCE_DIR/tests/browser
OUTPUT=$(realpath -m "${1:-docs/console.png}")
for tool in node npm psql curl; do
    command -v "$tool" >/dev/null || fail "$tool is missing (see tests/harness/deps.sh)"
done
[ -x /usr/bin/chromium ] || fail "/usr/bin/chromium is missing: apt-get install chromium"
[ -x "$BIN/outboxctl" ] || fail "$BIN/outboxctl is missing: make all"

# npm ci again only when the lock file changed since the last install (as test_console.sh)
stamp=$BROWSER_DIR/node_modules/.outbox-lock
if ! cmp -s "$BROWSER_DIR/package-lock.json" "$stamp" 2>/dev/null; then
    (cd "$BROWSER_DIR" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund \
        --loglevel=error) >"$SCRATCH/npm.log" 2>&1 || fail "npm ci: $(tail -n 3 "$SCRATCH/npm.log")"
    cp "$BROWSER_DIR/package-lock.json" "$stamp"
fi

# the stack of its own, if any, stops last: after the console and the databases' drops
OWN_STACK=""
cleanup_and_stop() {
    local status=$?
    eval "true$CLEANUP"
    if [ -n "$OWN_STACK" ]; then
        tests/harness/stack.sh stop "$OWN_STACK" >/dev/null 2>&1
        rm -rf "$OWN_STACK"
    fi
    rm -rf "$SCRATCH"
    exit "$status"
}
trap cleanup_and_stop EXIT INT TERM
if [ -z "${OUTBOX_TEST_PG_URL:-}" ]; then
    OWN_STACK=$(mktemp -d "${TMPDIR:-/tmp}/outbox-screenshot-stack.XXXXXX")
    chmod 755 "$OWN_STACK"
    tests/harness/stack.sh start "$OWN_STACK" postgres >"$SCRATCH/stack.log" 2>&1 ||
        fail "PostgreSQL did not start: $(tail -n 3 "$SCRATCH/stack.log")"
    set -a
    . "$OWN_STACK/env"
    set +a
fi

# seed FILE URL: runs the SQL of FILE (under tests/browser/screenshot/) on URL
seed() {
    psql -X -q -v ON_ERROR_STOP=1 "$2" -f "$BROWSER_DIR/screenshot/$1" >/dev/null ||
        fail "unable to seed $1"
}

list=$SCRATCH/databases.list
: >"$list"
for name in shop payments shipping; do
    new_database "$name"
    seed "$name.sql" "$DATABASE_URL"
    printf '%s %s\n' "$name" "$DATABASE_URL" >>"$list"
done

token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
(umask 077 && printf '%s\n' "$token" >"$SCRATCH/token")
port=$(free_port)
"$BIN/outboxctl" --databases "$list" serve --listen "127.0.0.1:$port" \
    --auth-token-file "$SCRATCH/token" --allow-actions >"$SCRATCH/console.log" 2>&1 &
console_pid=$!
CLEANUP="$CLEANUP; kill $console_pid 2>/dev/null; wait $console_pid 2>/dev/null"
wait_until "curl -fsS http://127.0.0.1:$port/static/console.css" 10 ||
    fail "the console did not start: $(tail -n 3 "$SCRATCH/console.log")"

mkdir -p "$(dirname "$OUTPUT")"
CONSOLE_URL="http://127.0.0.1:$port" CONSOLE_TOKEN="$token" EXPECT_QUEUE=orders \
    SCREENSHOT="$SCRATCH/console.png" timeout 120 node "$BROWSER_DIR/screenshot.mjs" ||
    fail "the browser did not take the picture: $(tail -n 3 "$SCRATCH/console.log")"
mv "$SCRATCH/console.png" "$OUTPUT"
pass "the console's overview saved as $OUTPUT"
