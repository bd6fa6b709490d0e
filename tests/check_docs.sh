#!/bin/sh
# check_docs.sh - the docs say what the tree has:
# - the options block of docs/reference.md is exactly `outbox-relay --help`;
# - every file and symbol the recipes of docs/HACKING.md ("## Adding ...") name
#   exists, a symbol said to be "in" a file is in that file, and every
#   production file that names a recipe's worked example (a broker, an admin
#   action) is named by its recipe: a step the recipe leaves out fails here.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-bin}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac

expected=$(mktemp)
documented=$(mktemp)
recipes=$(mktemp)
problems=$(mktemp)
trap 'rm -f "$expected" "$documented" "$recipes" "$problems"' EXIT
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

# ---- docs/HACKING.md's recipes -------------------------------------------

HACKING="$ROOT/docs/HACKING.md"
SOURCES="src common relay outboxctl tests sql"

# (the checks run in pipelines' subshells: what fails is kept in a file)
fail() {
    echo "check_docs: docs/HACKING.md: $*" >> "$problems"
}

# One recipe's text on one line (a code span may wrap), by its heading's start.
recipe_text() {
    awk -v title="$1" '/^## / { inside = (index($0, "## " title) == 1); next }
                       inside { printf "%s ", $0 }' "$HACKING" | tr -s ' '
}

# The tree's file of a name: the path itself, or a file of that base name.
find_file() {
    case "$1" in
    */*) [ -e "$ROOT/$1" ] && echo "$ROOT/$1" ;;
    *) (cd "$ROOT" && find $SOURCES docs deploy -name "$1" -type f 2>/dev/null | sed 1q) |
           sed "s|^|$ROOT/|" ;;
    esac
}

# What a code span names: "path P", "symbol S" or nothing (a command, an
# option, an SQL phrase, a template such as sink_<kind>.c).
classify() {
    case "$1" in
    *'<'* | *'…'* | *NNN* | *'*'* | *'...'* | -* | /* | *=* | *'['[!]]*) return ;;
    'struct '*) echo "symbol ${1#struct }"; return ;;
    *' '*) return ;;
    */* | *.c | *.h | *.sh | *.sql | *.md | *.mjs) echo "path $1"; return ;;
    esac
    s=${1%'()'}; s=${s%'[]'}; s=${s##*'->'}; s=${s##*.}
    case "$s" in
    *[!A-Za-z0-9_]* | '' | [0-9]*) return ;;
    *[a-z_]*) echo "symbol $s" ;;
    esac # an all-capitals word without an underscore is SQL (CHECK, NOT VALID)
}

# The code spans of a recipe, one a line, and each "`SYMBOL` ... in `FILE`".
spans() {
    grep -o '`[^`]*`' | tr -d '`'
}
pairs() {
    perl -ne 'while (/`([A-Za-z_][A-Za-z0-9_]*)`([^`;:]{0,48}) in `([^`]+)`/g) {
                  print "$1 $3\n"; pos($_) -= length($3) + 2 }'
}

check_recipe() {
    title=$1
    recipe_text "$title" > "$recipes"
    [ -s "$recipes" ] || { fail "no recipe '## $title'"; return; }
    spans < "$recipes" | while IFS= read -r span; do classify "$span"; done | sort -u |
    while read -r kind name; do
        if [ "$kind" = path ]; then
            [ -n "$(find_file "$name")" ] || fail "'$title' names $name, which does not exist"
        elif ! (cd "$ROOT" && grep -rqw --include='*.[ch]' --include='*.sql' --include='*.sh' \
                    -e "$name" $SOURCES Makefile); then
            fail "'$title' names $name, which no source defines or uses"
        fi
    done
    pairs < "$recipes" | sort -u | while read -r symbol file; do
        path=$(find_file "$file")
        [ -z "$path" ] || grep -qw -e "$symbol" "$path" ||
            fail "'$title' puts $symbol in $file, which does not have it"
    done
}

# Every production file naming the example's symbols is named by the recipe
# (its templates read with <kind> as the example).
check_example() {
    title=$1 kind=$2; shift 2
    recipe_text "$title" | sed "s/<kind>/$kind/g" > "$recipes"
    for symbol in "$@"; do
        (cd "$ROOT" && grep -rlw --include='*.[ch]' -e "$symbol" src common relay outboxctl)
    done | sort -u | while read -r file; do
        grep -qF "$(basename "$file")" "$recipes" ||
            fail "'$title' leaves out $file, which its example ($*) needed"
    done
}

for title in "Adding a broker" "Adding an admin action" "Adding a migration"; do
    check_recipe "$title"
done
check_example "Adding a broker" redis sink_redis_type
check_example "Adding an admin action" identity api_identity ctl_command_identity_show

if [ -s "$problems" ]; then
    cat "$problems" >&2
    exit 1
fi
echo "check_docs: docs/HACKING.md's recipes name what the tree has"
