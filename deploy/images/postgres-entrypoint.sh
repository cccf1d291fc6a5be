#!/bin/sh
# First start: a cluster whose superuser is $POSTGRES_USER with $POSTGRES_PASSWORD (SCRAM over
# the network, nothing trusted), and the database $POSTGRES_DB. Every start: the server, in front.
set -eu
: "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata="$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=peer --auth-host=scram-sha-256 --encoding=UTF8 --no-instructions >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        printf 'CREATE DATABASE "%s"\n' "$POSTGRES_DB" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
    echo "postgres-entrypoint: created the cluster and database $POSTGRES_DB"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
