#!/bin/sh
# embed-migrations.sh - turn sql/NNN_name.sql files into C source for migrate.c.
#
#   embed-migrations.sh sql/001_outbox.sql sql/002_more.sql ... > migrations.c
#
# Each file becomes a string literal and an entry { version, name, sql } of
# migrate_files[], in the order given (the Makefile passes them sorted). The
# version is the NNN prefix; a malformed name or a repeated version fails.
set -eu

if [ "$#" -eq 0 ]; then
    echo "embed-migrations: no migration files given" >&2
    exit 1
fi

LC_ALL=C awk '
# Escapes one line for a C string literal; "?" too, so no trigraph can form.
function c_string(text,    out, i, c) {
    out = ""
    for (i = 1; i <= length(text); i++) {
        c = substr(text, i, 1)
        if (c == "\\") out = out "\\\\"
        else if (c == "\"") out = out "\\\""
        else if (c == "?") out = out "\\?"
        else if (c == "\t") out = out "\\t"
        else if (c == "\r") out = out ""
        else out = out c
    }
    return out
}

function close_file() {
    if (count > 0)
        printf ";\n\n"
}

BEGIN {
    count = 0
    print "/*"
    print " * migrations.c - the sql/ migrations as C strings, in order. Built from the"
    print " * sql/NNN_name.sql files by sql/embed-migrations.sh: edit those."
    print " */"
    print "#include \"migrate.h\""
    print ""
}

FNR == 1 {
    close_file()
    name = FILENAME
    sub(/.*\//, "", name)
    if (name !~ /^[0-9][0-9][0-9]_[A-Za-z0-9_]+\.sql$/) {
        printf "embed-migrations: bad migration file name %s (want NNN_name.sql)\n", name > "/dev/stderr"
        failed = 1
        exit 1
    }
    version = substr(name, 1, 3) + 0
    if (version == 0 || (version in seen)) {
        printf "embed-migrations: version of %s is zero or used twice\n", name > "/dev/stderr"
        failed = 1
        exit 1
    }
    seen[version] = 1
    versions[count] = version
    names[count] = name
    printf "static const char migration_sql_%d[] =\n    \"\"", count
    count++
}

{
    printf "\n    \"%s\\n\"", c_string($0)
}

END {
    if (failed)
        exit 1
    close_file()
    print "const struct migrate_file migrate_files[] = {"
    for (i = 0; i < count; i++)
        printf "    {%d, \"%s\", migration_sql_%d},\n", versions[i], names[i], i
    print "};"
    print ""
    printf "const size_t migrate_file_count = %d;\n", count
}
' "$@"
