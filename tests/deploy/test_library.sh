#!/bin/bash
# test_library.sh - liboutbox as an application links it: a program that calls only
# outbox_enqueue() builds against the installed tree with `pkg-config outbox`, dynamically
# and with --static, needs neither librabbitmq, hiredis nor libuuid, and commits its row;
# liboutbox.so.0 carries its soname and exports exactly the functions outbox.h declares,
# and liboutbox.a defines no other global name (a program with its own buffer_clear() links).
. "$(dirname "$0")/lib.sh"

PREFIX=$SCRATCH/prefix
make --no-print-directory install BUILD="$BUILD" BIN="$BIN" LIB="$LIB" PREFIX="$PREFIX" >/dev/null ||
    fail "make install PREFIX=$PREFIX failed"
libdir=$PREFIX/lib
for file in liboutbox.a liboutbox.so.0 liboutbox.so pkgconfig/outbox.pc; do
    [ -e "$libdir/$file" ] || fail "make install did not install lib/$file"
done
[ "$(readlink "$libdir/liboutbox.so")" = liboutbox.so.0 ] || fail "lib/liboutbox.so is not a link to liboutbox.so.0"
soname=$(readelf -d "$libdir/liboutbox.so.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = liboutbox.so.0 ] || fail "liboutbox.so.0 has the soname '$soname'"

export PKG_CONFIG_PATH=$libdir/pkgconfig
requires=$(pkg-config --print-requires --print-requires-private outbox | awk '{ print $1 }' | sort -u | xargs)
[ "$requires" = libpq ] || fail "outbox.pc requires '$requires', expected libpq alone"
pass "liboutbox.so.0, liboutbox.a and outbox.pc (requires libpq alone) installed"

# Exactly what outbox.h declares, no internal outbox_* helper and nothing else.
exported=$(nm -D --defined-only "$libdir/liboutbox.so.0" | awk '{ print $3 }' | sort)
[ -n "$exported" ] || fail "liboutbox.so.0 exports nothing"
stray=$(echo "$exported" | grep -v '^outbox_' || true)
[ -z "$stray" ] || fail "liboutbox.so.0 exports names beyond outbox_*: $(echo $stray)"
declared=$(sed -n 's/^[A-Za-z].*[ *]\(outbox_[a-z0-9_]*\)(.*/\1/p' "$PREFIX/include/outbox.h" | sort -u)
[ "$exported" = "$declared" ] ||
    fail "liboutbox.so.0 exports differ from outbox.h: $(diff <(echo "$declared") <(echo "$exported") | grep '^[<>]' | xargs)"
pass "liboutbox.so.0 exports the $(echo "$exported" | wc -l) functions of outbox.h and nothing else"

program=$SCRATCH/enqueue.c
cat >"$program" <<'EOF'
#include <stdio.h>
#include <outbox.h>

int
main(int argc, char **argv)
{
    struct outbox_message message = {.queue = "library", .payload_json = "{\"linked\": true}"};
    struct outbox_error err;
    int64_t job_id;
    PGconn *conn;
    PGresult *res;

    if (argc != 2)
        return 2;
    conn = PQconnectdb(argv[1]);
    if (PQstatus(conn) != CONNECTION_OK)
        return 3;
    PQclear(PQexec(conn, "BEGIN"));
    if (outbox_enqueue(conn, &message, &job_id, &err) != 0) {
        fprintf(stderr, "enqueue failed: %s\n", err.message);
        return 4;
    }
    res = PQexec(conn, "COMMIT");
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        return 5;
    PQclear(res);
    PQfinish(conn);
    printf("%lld\n", (long long)job_id);
    return 0;
}
EOF
# --no-as-needed: every library pkg-config names is loaded, as a toolchain without
# --as-needed by default would link it, so ldd below sees all that outbox.pc asks for.
# A sanitizer build (make asan passes SAN) installs a library that needs the same flags.
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Werror ${SAN:-} -o "$SCRATCH/enqueue" "$program" -Wl,--no-as-needed \
    $(pkg-config --cflags --libs outbox) ||
    fail "a program calling outbox_enqueue() does not build with pkg-config --cflags --libs outbox"
# The static link takes liboutbox.a and what --static adds for it; libpq itself stays
# shared, since its own static closure (libpgcommon, krb5) is not on every host.
static_libs=$(pkg-config --static --libs outbox)
echo "$static_libs" | grep -Eq -- '-l(rabbitmq|hiredis|uuid)' &&
    fail "pkg-config --static --libs outbox names a broker client: $static_libs"
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Werror ${SAN:-} -o "$SCRATCH/enqueue-static" "$program" $(pkg-config --cflags outbox) \
    -Wl,--no-as-needed -L"$libdir" -Wl,-Bstatic -loutbox -Wl,-Bdynamic $(pkg-config --libs libpq) \
    $(sed -n 's/^Libs.private: //p' "$libdir/pkgconfig/outbox.pc") ||
    fail "a program calling outbox_enqueue() does not link liboutbox.a statically"
pass "a program calling outbox_enqueue() builds with pkg-config, shared and static"

# liboutbox.a, like the .so, defines no global name but those of outbox.h: an application
# with its own buffer_clear() or parse_integer() links it statically.
stray=$(nm -g --defined-only "$libdir/liboutbox.a" | awk 'NF == 3 { print $3 }' | grep -v '^outbox_' | sort -u || true)
[ -z "$stray" ] || fail "liboutbox.a defines $(echo "$stray" | wc -l) global names beyond outbox_*: $(echo $stray | cut -c1-300)"
own=$SCRATCH/own_names.c
cat >"$own" <<'EOF'
#include <stdio.h>
#include <outbox.h>

/* the application's own helpers, named as the library's internal ones are */
int buffer_clear(int value);
int parse_integer(const char *text);

int
buffer_clear(int value)
{
    return value + 1;
}

int
parse_integer(const char *text)
{
    return text[0] == '7' ? 7 : 0;
}

int
main(int argc, char **argv)
{
    struct outbox_message message = {.queue = "own_names", .payload_json = "{}"};
    struct outbox_error err;
    PGconn *conn;

    if (argc != 2)
        return 2;
    conn = PQconnectdb(argv[1]);
    PQclear(PQexec(conn, "BEGIN"));
    if (outbox_enqueue(conn, &message, NULL, &err) != 0) {
        fprintf(stderr, "enqueue failed: %s\n", err.message);
        return 4;
    }
    PQclear(PQexec(conn, "COMMIT"));
    PQfinish(conn);
    printf("%d %d\n", buffer_clear(1), parse_integer("7"));
    return 0;
}
EOF
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Werror ${SAN:-} -o "$SCRATCH/own-names" "$own" $(pkg-config --cflags outbox) \
    -L"$libdir" -Wl,-Bstatic -loutbox -Wl,-Bdynamic $(pkg-config --libs libpq) \
    $(sed -n 's/^Libs.private: //p' "$libdir/pkgconfig/outbox.pc") 2>"$SCRATCH/own-names.log" ||
    fail "a program with its own buffer_clear() does not link liboutbox.a: $(grep -m1 -E 'multiple|error' "$SCRATCH/own-names.log")"
pass "liboutbox.a defines only outbox_* names: a program with its own buffer_clear() links it"

# Each binary's needs, as the loader resolves them, name no broker client.
dynamic=$(LD_LIBRARY_PATH=$libdir ldd "$SCRATCH/enqueue")
echo "$dynamic" | grep -q "liboutbox.so.0 => $libdir/liboutbox.so.0" ||
    fail "the program does not load the installed liboutbox.so.0: $(echo $dynamic)"
static=$(ldd "$SCRATCH/enqueue-static")
echo "$static" | grep -q liboutbox && fail "the static program loads liboutbox: $(echo $static)"
for needs in "$dynamic" "$static"; do
    echo "$needs" | grep -q 'libpq\.so' || fail "the program does not load libpq: $(echo $needs)"
    echo "$needs" | grep -Eq 'librabbitmq|libhiredis|libuuid' &&
        fail "a program that only enqueues loads a broker client: $(echo $needs)"
done
pass "ldd: libpq, no librabbitmq, hiredis or libuuid"

new_database library
url=$DATABASE_URL
job_id=$(LD_LIBRARY_PATH=$libdir "$SCRATCH/enqueue" "$url") || fail "the shared-linked program failed"
static_id=$("$SCRATCH/enqueue-static" "$url") || fail "the static-linked program failed"
count=$(psql -X -At "$url" -c "SELECT count(*) FROM outbox.job
    WHERE queue = 'library' AND job_id IN ($job_id, $static_id) AND payload = '{\"linked\": true}'")
[ "$count" = 2 ] || fail "outbox.job holds $count of the two enqueued rows"
pass "both programs commit their row to outbox.job"
[ "$("$SCRATCH/own-names" "$url")" = "2 7" ] || fail "the program with its own buffer_clear() failed"
[ "$(psql -X -At "$url" -c "SELECT count(*) FROM outbox.job WHERE queue = 'own_names'")" = 1 ] ||
    fail "the program with its own buffer_clear() did not commit its row"
pass "the program with its own buffer_clear() and parse_integer() runs them and enqueues"
