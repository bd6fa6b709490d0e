#!/bin/bash
# test_systemd_credentials.sh - the documented way to give outbox-relay@.service a broker
# password works for the unit's transient user (DynamicUser=yes). A root-only file under
# /etc/outbox-relay is unreadable to that user, so OUTBOX_BROKER_PASSWORD_FILE cannot name it;
# the packaged drop-in examples/credentials.conf hands the relay a copy with LoadCredential=.
# systemd does not run here: the test does what LoadCredential= does (a private directory
# owned by the service's user, the file copied in by root) and runs the relay as a uid of the
# DynamicUser range with setpriv, as the drop-in's paths say. Needs root.
. "$(dirname "$0")/lib.sh"

command -v setpriv >/dev/null || fail "setpriv is missing (package util-linux)"
command -v systemd-analyze >/dev/null || fail "systemd-analyze is missing (package systemd)"
[ "$(id -u)" = 0 ] || fail "needs root to run the relay as the unit's transient user"
make --no-print-directory install BUILD="$BUILD" BIN="$BIN" LIB="$LIB" PREFIX="$SCRATCH/prefix" \
    >/dev/null || fail "make install failed"
dropin=$SCRATCH/prefix/share/doc/outbox-relay/examples/credentials.conf
[ -f "$dropin" ] || fail "make install did not install examples/credentials.conf"

# The unit with the drop-in applied still passes systemd-analyze verify.
unit=$SCRATCH/outbox-relay@orders.service
cat "$SCRATCH/prefix/lib/systemd/system/outbox-relay@.service" "$dropin" >"$unit"
systemd-analyze verify --man=no "$unit" || fail "systemd-analyze verify rejects the unit with the drop-in"
pass "the unit with the credentials drop-in passes systemd-analyze verify"

credential=$(sed -n 's/^LoadCredential=//p' "$dropin")
password_file=$(sed -n 's/^Environment=OUTBOX_BROKER_PASSWORD_FILE=//p' "$dropin")
name=${credential%%:*}
source=${credential#*:}
[ -n "$name" ] && [ "$source" = "/etc/outbox-relay/%i.broker-password" ] ||
    fail "the drop-in's LoadCredential= is not the documented file: '$credential'"
[ "$password_file" = "%d/$name" ] ||
    fail "the drop-in's OUTBOX_BROKER_PASSWORD_FILE is not its credential: '$password_file'"

# /etc/outbox-relay as docs/deploy.md makes it (install -d -m 700), under the root-only scratch.
etc=$SCRATCH/etc/outbox-relay
install -d -m 700 "$etc"
secret_file=$etc/orders.broker-password
install -m 600 /dev/null "$secret_file"
printf '%s\n' "$OUTBOX_TEST_REDIS_PASSWORD" >"$secret_file"

service_uid=61934 # in systemd's DynamicUser range, 61184-65519
relay_bin=$(cd "$BIN" && pwd)/outbox-relay
new_database credentials
as_service() {
    setpriv --reuid "$service_uid" --regid "$service_uid" --clear-groups \
        env -i PATH=/usr/bin:/bin "$@" "$relay_bin" --check --database-url "$DATABASE_URL" \
        --broker "redis://127.0.0.1:$OUTBOX_TEST_REDIS_PORT/0" --metrics-addr off
}

# The file itself: what the service would see without credentials.
set +e
output=$(as_service OUTBOX_BROKER_PASSWORD_FILE="$secret_file" 2>&1)
status=$?
set -e
[ "$status" = 2 ] && echo "$output" | grep -q 'Permission denied' ||
    fail "the root-only file was readable to uid $service_uid (exit $status): $output"
pass "the unit's user cannot read /etc/outbox-relay (why the drop-in exists)"

# LoadCredential=: a directory of the service's user, the file copied in by root.
credentials=$(mktemp -d /tmp/outbox-credentials.XXXXXX)
CLEANUP="$CLEANUP; rm -rf '$credentials'"
install -m 400 -o "$service_uid" -g "$service_uid" "$secret_file" "$credentials/$name"
chown "$service_uid:$service_uid" "$credentials"
chmod 500 "$credentials"
set +e
output=$(as_service OUTBOX_BROKER_PASSWORD_FILE="${password_file//%d/$credentials}" 2>&1)
status=$?
set -e
[ "$status" = 0 ] && echo "$output" | grep -q 'configuration OK' ||
    fail "the relay as uid $service_uid with the credential did not pass --check (exit $status): $output"
# and the password is the one that logged in: without it the same check is refused
set +e
output=$(as_service 2>&1)
status=$?
set -e
[ "$status" != 0 ] || fail "--check passed without the password: the test proves nothing"
pass "the relay as the unit's user reads the broker password from its credential"
