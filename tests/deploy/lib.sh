# lib.sh - shared by the tests/deploy scripts: sourced, never run.
#
# Each script runs from tests/run.sh's integration phase with the stack's
# OUTBOX_TEST_* environment, OUTBOX_SOURCE_DIR and OUTBOX_BIN; BUILD, BIN and LIB
# name the build (make test passes them). Failures print one line and exit 1.
set -eu

SOURCE_DIR=${OUTBOX_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$SOURCE_DIR"
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
LIB=${LIB:-lib}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/outbox-deploy.XXXXXX")
CLEANUP=""

cleanup() {
    local status=$?
    eval "true$CLEANUP"
    rm -rf "$SCRATCH"
    exit "$status"
}
trap cleanup EXIT INT TERM

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

pass() {
    echo "ok: $*"
}

# A fresh database cloned from the stack's template (migrated), dropped on exit;
# its URL in DATABASE_URL (not printed: a subshell could not register the drop).
new_database() {
    local name="deploy_$(basename "$0" .sh)_$$_$1"
    psql -q -X -v ON_ERROR_STOP=1 "$OUTBOX_TEST_PG_URL" \
        -c "CREATE DATABASE $name TEMPLATE $OUTBOX_TEST_TEMPLATE_DB" >/dev/null
    CLEANUP="$CLEANUP; psql -q -X '$OUTBOX_TEST_PG_URL' -c 'DROP DATABASE IF EXISTS $name WITH (FORCE)' >/dev/null 2>&1 || true"
    DATABASE_URL="postgresql://postgres@127.0.0.1:$OUTBOX_TEST_PG_PORT/$name"
}

# A free loopback port, below the stack's range (20000-32000) and the ephemeral ports.
free_port() {
    local port
    for _ in $(seq 1 50); do
        port=$((10000 + RANDOM % 9000))
        if ! ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
            echo "$port"
            return 0
        fi
    done
    fail "no free port"
}

# Waits up to $2 seconds for command $1 (a string) to succeed.
wait_until() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        if eval "$1" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}
