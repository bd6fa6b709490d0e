#!/bin/bash
# test_install.sh - `make install` lays out programs, library, header, pkg-config file,
# SQL, man pages and the unit; the man pages list every option of --help; the README's
# C example builds with `pkg-config --cflags --libs outbox` and enqueues a row.
. "$(dirname "$0")/lib.sh"

PREFIX=$SCRATCH/prefix
make --no-print-directory install BUILD="$BUILD" BIN="$BIN" LIB="$LIB" PREFIX="$PREFIX" >/dev/null ||
    fail "make install PREFIX=$PREFIX failed"
for file in bin/outbox-relay bin/outboxctl lib/liboutbox.a include/outbox.h lib/pkgconfig/outbox.pc \
    share/outbox-relay/sql/001_outbox.sql share/man/man8/outbox-relay.8 share/man/man1/outboxctl.1 \
    lib/systemd/system/outbox-relay@.service share/doc/outbox-relay/examples/outbox-relay.env; do
    [ -f "$PREFIX/$file" ] || fail "make install did not install $file"
done
for migration in sql/[0-9][0-9][0-9]_*.sql; do
    cmp -s "$migration" "$PREFIX/share/outbox-relay/$migration" || fail "$migration not installed"
done
grep -q "^ExecStart=$PREFIX/bin/outbox-relay\$" "$PREFIX/lib/systemd/system/outbox-relay@.service" ||
    fail "the unit's ExecStart does not name the installed program"
"$PREFIX/bin/outbox-relay" --version | grep -q '^outbox-relay [0-9]' || fail "installed outbox-relay --version"
"$PREFIX/bin/outboxctl" --version | grep -q '^outboxctl [0-9]' || fail "installed outboxctl --version"
pass "make install PREFIX"

# DESTDIR stages the same tree under another root.
make --no-print-directory install BUILD="$BUILD" BIN="$BIN" LIB="$LIB" PREFIX=/usr \
    DESTDIR="$SCRATCH/stage" >/dev/null || fail "make install DESTDIR failed"
[ -x "$SCRATCH/stage/usr/bin/outbox-relay" ] && [ -f "$SCRATCH/stage/usr/include/outbox.h" ] ||
    fail "make install DESTDIR=... PREFIX=/usr did not stage under DESTDIR"
grep -q '^ExecStart=/usr/bin/outbox-relay$' "$SCRATCH/stage/usr/lib/systemd/system/outbox-relay@.service" ||
    fail "a DESTDIR install must not leak DESTDIR into the unit"
pass "make install DESTDIR"

# The man pages come from --help: every option and command must be in them.
relay_man=$PREFIX/share/man/man8/outbox-relay.8
ctl_man=$PREFIX/share/man/man1/outboxctl.1
for option in $("$BIN/outbox-relay" --help | grep -o -- '^  --[a-z-]*'); do
    grep -q "^\\\\fB$(echo "$option" | sed 's/-/\\\\-/g')" "$relay_man" ||
        fail "outbox-relay(8) lacks $option"
done
for command in $("$BIN/outboxctl" --help | sed -n '/^commands:/,/^$/p' | grep -o '^  [a-z][a-z]*' | sort -u); do
    grep -q "^\\\\fB$command" "$ctl_man" || fail "outboxctl(1) lacks the command $command"
done
if command -v man >/dev/null 2>&1; then
    MANWIDTH=100 man -l "$relay_man" 2>&1 >/dev/null | grep . && fail "man reports problems in outbox-relay(8)"
    MANWIDTH=100 man -l "$relay_man" 2>/dev/null | grep -q 'EXIT STATUS' || fail "outbox-relay(8) does not render"
fi
pass "man pages list every option of --help"

# The README's C example, built against the installed library through pkg-config.
example=$SCRATCH/example.c
{
    printf '#include <stdio.h>\n#include <outbox.h>\n\nint\nmain(int argc, char **argv)\n{\n'
    printf '    PGconn *conn = PQconnectdb(argv[1]);\n\n    (void)argc;\n'
    printf '    if (PQstatus(conn) != CONNECTION_OK)\n        return 3;\n'
    awk '/^In C, on your own connection/ { found = 1 } found && /^```c/ { inside = 1; next }
         inside && /^```/ { exit } inside { print "    " $0 }' README.md
    printf '    PQfinish(conn);\n    return 0;\n}\n'
} >"$example"
grep -q outbox_enqueue "$example" || fail "no C example found in README.md"
PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
export PKG_CONFIG_PATH
# A sanitizer build (make asan passes SAN) installs a library that needs the same flags.
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Werror ${SAN:-} -o "$SCRATCH/example" "$example" $(pkg-config --cflags --libs outbox) ||
    fail "the README's C example does not build with pkg-config --cflags --libs outbox"
new_database example
url=$DATABASE_URL
LD_LIBRARY_PATH=$PREFIX/lib "$SCRATCH/example" "$url" || fail "the README's C example failed (exit $?)"
count=$(psql -X -At "$url" -c "SELECT count(*) FROM outbox.job WHERE queue = 'orders'")
[ "$count" = 1 ] || fail "the README's C example committed $count rows, expected 1"
pass "README C example builds with pkg-config and enqueues"
