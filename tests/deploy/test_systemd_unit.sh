#!/bin/bash
# test_systemd_unit.sh - the installed outbox-relay@.service passes `systemd-analyze
# verify`, and `systemd-analyze security` rates its sandbox at exposure 2.0 or better.
# (The READY/STOPPING/WATCHDOG messages themselves: tests/integration/test_service.c.)
. "$(dirname "$0")/lib.sh"

command -v systemd-analyze >/dev/null || fail "systemd-analyze is missing (package systemd)"
make --no-print-directory install BUILD="$BUILD" BIN="$BIN" LIB="$LIB" PREFIX="$SCRATCH/prefix" \
    >/dev/null || fail "make install failed"
unit=$SCRATCH/outbox-relay@orders.service
cp "$SCRATCH/prefix/lib/systemd/system/outbox-relay@.service" "$unit"

systemd-analyze verify --man=no "$unit" || fail "systemd-analyze verify rejects the unit"
pass "systemd-analyze verify"

for setting in Type=notify DynamicUser=yes ProtectSystem=strict NoNewPrivileges=yes \
    'EnvironmentFile=/etc/outbox-relay/%i.env' Restart=on-failure RestartPreventExitStatus=2 \
    WatchdogSec=; do
    grep -q "^$setting" "$unit" || fail "the unit lacks $setting"
done
report=$(systemd-analyze security --offline=yes "$unit" 2>&1) || true
exposure=$(echo "$report" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "systemd-analyze security gave no exposure level: $report"
echo "systemd-analyze security: exposure $exposure"
systemd-analyze security --offline=yes --threshold=20 "$unit" >/dev/null 2>&1 ||
    fail "the unit's exposure $exposure is above 2.0"
pass "systemd-analyze security exposure $exposure"
