#!/bin/sh
# The postgres image's contract: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB make the cluster
# in PGDATA (/var/lib/postgresql/data) on first start; password logins from the network.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
BIN=/usr/lib/postgresql/15/bin
user=${POSTGRES_USER:-postgres}
database=${POSTGRES_DB:-$user}
as_postgres() {
    setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
}
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > /tmp/pw
    chown postgres /tmp/pw
    as_postgres "$BIN/initdb" -D "$PGDATA" -U "$user" --pwfile=/tmp/pw --auth-local=trust \
        --auth-host=scram-sha-256 >/dev/null
    rm -f /tmp/pw
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    if [ "$database" != postgres ]; then
        echo "CREATE DATABASE \"$database\" OWNER \"$user\";" |
            as_postgres "$BIN/postgres" --single -D "$PGDATA" -j postgres >/dev/null
    fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$BIN/postgres" -D "$PGDATA"
