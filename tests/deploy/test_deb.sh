#!/bin/bash
# test_deb.sh - `make deb` builds outbox-relay_VERSION_ARCH.deb (and liboutbox0, liboutbox-dev),
# lintian finds no error or warning, the library's packages need no broker client, and the
# programs unpacked from outbox-relay run --version and --check against the test stack.
. "$(dirname "$0")/lib.sh"

out=$SCRATCH/deb
make --no-print-directory deb BUILD="$BUILD" BIN="$BIN" LIB="$LIB" DEB_OUT="$out" >/dev/null ||
    fail "make deb failed"
version=$(sed -n 's/^VERSION *:= *//p' Makefile)
arch=$(dpkg --print-architecture)
deb=$out/outbox-relay_${version}_${arch}.deb
[ -f "$deb" ] || fail "make deb did not write $deb"
[ -f "$out/liboutbox-dev_${version}_${arch}.deb" ] || fail "make deb did not write liboutbox-dev"
shlib=$out/liboutbox0_${version}_${arch}.deb
[ -f "$shlib" ] || fail "make deb did not write liboutbox0"
dpkg-deb --field "$deb" Depends | grep -q libpq5 || fail "the package does not depend on libpq5"
contents=$(dpkg-deb --contents "$shlib")
echo "$contents" | grep -q '/liboutbox\.so\.0$' || fail "liboutbox0 lacks liboutbox.so.0"
depends=$(dpkg-deb --field "$shlib" Depends)
echo "$depends" | grep -q libpq5 || fail "liboutbox0 does not depend on libpq5: $depends"
echo "$depends" | grep -Eq 'rabbitmq|hiredis|uuid' && fail "liboutbox0 depends on a broker client: $depends"
depends=$(dpkg-deb --field "$out/liboutbox-dev_${version}_${arch}.deb" Depends)
[ "$depends" = "liboutbox0 (= $version), libpq-dev" ] || fail "liboutbox-dev depends on: $depends"
pass "make deb"

if command -v lintian >/dev/null 2>&1; then
    tags=$(lintian --fail-on none "$out"/*.deb 2>&1 | grep -v 'running with root privileges' || true)
    [ -z "$tags" ] || fail "lintian: $tags"
    pass "lintian clean"
else
    fail "lintian is missing (package lintian)"
fi

# Unpacked without a chroot: the files land where the package says.
root=$SCRATCH/root
dpkg -x "$deb" "$root"
for file in usr/bin/outbox-relay usr/bin/outboxctl lib/systemd/system/outbox-relay@.service \
    usr/share/man/man8/outbox-relay.8.gz usr/share/outbox-relay/sql/001_outbox.sql; do
    [ -e "$root/$file" ] || fail "the package lacks /$file"
done
grep -q '^ExecStart=/usr/bin/outbox-relay$' "$root/lib/systemd/system/outbox-relay@.service" ||
    fail "the packaged unit does not start /usr/bin/outbox-relay"
"$root/usr/bin/outbox-relay" --version | grep -qx "outbox-relay $version" ||
    fail "packaged outbox-relay --version"
"$root/usr/bin/outboxctl" --version | grep -qx "outboxctl $version" || fail "packaged outboxctl --version"
new_database deb
url=$DATABASE_URL
OUTBOX_DATABASE_URL=$url OUTBOX_BROKER=$OUTBOX_TEST_REDIS_URL \
    "$root/usr/bin/outbox-relay" --metrics-addr off --check | grep -qx 'configuration OK' ||
    fail "packaged outbox-relay --check against the test stack"
"$root/usr/bin/outboxctl" --database-url "$url" status >/dev/null || fail "packaged outboxctl status"
pass "packaged programs run --version and --check"
