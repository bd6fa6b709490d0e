#!/bin/sh
# check_docs.sh - the options block of docs/reference.md must be exactly `outbox-relay --help`.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-bin}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac

expected=$(mktemp)
documented=$(mktemp)
trap 'rm -f "$expected" "$documented"' EXIT
"$BIN/outbox-relay" --help > "$expected"
# the fenced block right after the marker comment
awk '/^<!-- the block below is `bin\/outbox-relay --help`/ { marker = 1; next }
     marker && /^```/ { if (inside) exit; inside = 1; next }
     inside { print }' "$ROOT/docs/reference.md" > "$documented"
if ! diff -u "$documented" "$expected"; then
    echo "check_docs: docs/reference.md's options block differs from 'outbox-relay --help' (above);" >&2
    echo "check_docs: paste the --help output into docs/reference.md" >&2
    exit 1
fi
echo "check_docs: docs/reference.md options match --help"
