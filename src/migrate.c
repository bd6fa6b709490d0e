/*
 * migrate.c - applying the embedded sql/ migrations under an advisory lock.
 */
#include "migrate.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define LOCK_KEY_TEXT "122550254464888"

/* NOTICEs such as "schema already exists, skipping" must not reach stderr. */
#define QUIET "SET LOCAL client_min_messages = warning"

static const char bootstrap_sql[] = "BEGIN;" QUIET ";"
                                    "CREATE SCHEMA IF NOT EXISTS outbox;"
                                    "CREATE TABLE IF NOT EXISTS outbox.schema_migrations ("
                                    "    version integer PRIMARY KEY,"
                                    "    name text NOT NULL,"
                                    "    applied_at timestamptz NOT NULL DEFAULT now());"
                                    "COMMIT";

/* Runs sql, which must return no error; fills err with context on failure. */
static int
exec_simple(PGconn *conn, const char *sql, const char *context, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, sql);
    ExecStatusType status = PQresultStatus(result);
    int rc = 0;

    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)
        rc = outbox_error_from_pg(err, conn, result, context);
    PQclear(result);
    return rc;
}

/* Ends a transaction a failed step left open; the error is already reported. */
static void
rollback_if_open(PGconn *conn)
{
    PGTransactionStatusType status = PQtransactionStatus(conn);

    if (status == PQTRANS_INTRANS || status == PQTRANS_INERROR)
        PQclear(PQexec(conn, "ROLLBACK"));
}

/* Runs a one-parameter advisory lock function (lock or unlock) on the key. */
static int
advisory(PGconn *conn, const char *sql, const char *context, struct outbox_error *err)
{
    const char *params[1] = {LOCK_KEY_TEXT};
    PGresult *result = PQexecParams(conn, sql, 1, NULL, params, NULL, NULL, 0);
    int rc = 0;

    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        rc = outbox_error_from_pg(err, conn, result, context);
    PQclear(result);
    return rc;
}

/* Creates schema outbox and its migration table unless both exist. */
static int
bootstrap(PGconn *conn, struct outbox_error *err)
{
    /* checked first: CREATE SCHEMA IF NOT EXISTS needs CREATE on the database */
    PGresult *result = PQexec(conn, "SELECT to_regclass('outbox.schema_migrations') IS NOT NULL");
    bool present;

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to read the outbox schema version");
        PQclear(result);
        return -1;
    }
    present = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    if (present)
        return 0;
    if (exec_simple(conn, bootstrap_sql, "unable to create 'outbox.schema_migrations'", err) < 0) {
        rollback_if_open(conn);
        return -1;
    }
    return 0;
}

/* Marks in applied[i] the embedded files already recorded in the table. */
static int
read_applied(PGconn *conn, bool *applied, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, "SELECT version FROM outbox.schema_migrations");

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, "unable to read 'outbox.schema_migrations'");
        PQclear(result);
        return -1;
    }
    for (int row = 0; row < PQntuples(result); row++) {
        long version = strtol(PQgetvalue(result, row, 0), NULL, 10);

        for (size_t i = 0; i < migrate_file_count; i++)
            if (migrate_files[i].version == version)
                applied[i] = true;
    }
    PQclear(result);
    return 0;
}

/* Applies one file and records it, in one transaction. */
static int
apply_file(PGconn *conn, const struct migrate_file *file, struct outbox_error *err)
{
    char context[160];
    char version[16];
    const char *params[2] = {version, file->name};
    PGresult *result = NULL;

    snprintf(context, sizeof(context), "unable to apply migration %s", file->name);
    snprintf(version, sizeof(version), "%d", file->version);

    if (exec_simple(conn, "BEGIN;" QUIET, context, err) < 0)
        goto fail;
    if (exec_simple(conn, file->sql, context, err) < 0)
        goto fail;
    result = PQexecParams(conn,
                          "INSERT INTO outbox.schema_migrations (version, name) "
                          "VALUES ($1::integer, $2)",
                          2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_COMMAND_OK) {
        outbox_error_from_pg(err, conn, result, context);
        goto fail;
    }
    PQclear(result);
    result = NULL;
    if (exec_simple(conn, "COMMIT", context, err) < 0)
        goto fail;
    return 0;

fail:
    PQclear(result);
    rollback_if_open(conn);
    return -1;
}

int
outbox_migrate(PGconn *conn, int *applied, struct outbox_error *err)
{
    bool *done = NULL;
    int count = 0;
    int rc = -1;

    if (applied != NULL)
        *applied = 0;
    if (conn == NULL || PQstatus(conn) != CONNECTION_OK)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                "unable to migrate the outbox schema: not connected");
    if (PQtransactionStatus(conn) != PQTRANS_IDLE)
        return outbox_error_set(err, OUTBOX_ERR_STATE,
                                "unable to migrate the outbox schema: a transaction is open");
    done = calloc(migrate_file_count, sizeof(*done));
    if (done == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");

    if (advisory(conn, "SELECT pg_advisory_lock($1::bigint)",
                 "unable to take the outbox migration lock", err) < 0) {
        free(done);
        return -1;
    }
    if (bootstrap(conn, err) < 0 || read_applied(conn, done, err) < 0)
        goto unlock;
    for (size_t i = 0; i < migrate_file_count; i++) {
        if (done[i])
            continue;
        if (apply_file(conn, &migrate_files[i], err) < 0)
            goto unlock;
        count++;
    }
    rc = 0;

unlock:
    /* a lost connection drops the lock with the session; nothing to report */
    PQclear(PQexec(conn, "SELECT pg_advisory_unlock(" LOCK_KEY_TEXT ")"));
    free(done);
    if (applied != NULL)
        *applied = count;
    return rc;
}

int
outbox_schema_version(PGconn *conn, int *version, struct outbox_error *err)
{
    PGresult *result;
    bool present;

    *version = 0;
    result = PQexec(conn, "SELECT to_regclass('outbox.schema_migrations') IS NOT NULL");
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
        goto fail;
    present = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    if (!present)
        return 0;
    result = PQexec(conn, "SELECT coalesce(max(version), 0) FROM outbox.schema_migrations");
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
        goto fail;
    *version = (int)strtol(PQgetvalue(result, 0, 0), NULL, 10);
    PQclear(result);
    return 0;

fail:
    outbox_error_from_pg(err, conn, result, "unable to read the outbox schema version");
    PQclear(result);
    return -1;
}

/* The highest embedded version: what outbox_migrate() brings a database to. */
static int
migrate_latest_version(void)
{
    return migrate_file_count > 0 ? migrate_files[migrate_file_count - 1].version : 0;
}

int
outbox_schema_check(PGconn *conn, struct outbox_error *err)
{
    int needed = migrate_latest_version(), version = 0;
    PGresult *result;
    bool present, readable;

    result = PQexec(conn, "SELECT to_regclass('outbox.schema_migrations') IS NOT NULL,"
                          " coalesce(has_table_privilege(to_regclass('outbox.schema_migrations'),"
                          " 'SELECT'), false)");
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to read the outbox schema version");
        PQclear(result);
        return -1;
    }
    present = PQgetvalue(result, 0, 0)[0] == 't';
    readable = PQgetvalue(result, 0, 1)[0] == 't';
    PQclear(result);
    if (!present)
        return outbox_error_set(err, OUTBOX_ERR_SCHEMA,
                                "outbox schema not found: run 'outboxctl migrate'");
    if (!readable)
        return 0; /* a role granted before 008: its statements name what is missing */
    if (outbox_schema_version(conn, &version, err) != 0)
        return -1;
    if (version < needed)
        return outbox_error_set(err, OUTBOX_ERR_SCHEMA,
                                "outbox schema is at version %d, this build needs %d:"
                                " run 'outboxctl migrate'",
                                version, needed);
    return 0;
}
