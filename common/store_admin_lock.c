/*
 * store_admin_lock.c - administrative statements in short lock tries, and who holds them off.
 */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "store_admin_lock.h"

/* The lock modes of outbox.job that each lock waits for (PostgreSQL's conflict table). */
static const char *const conflicting_modes[] = {
    [STORE_LOCK_SHARE_ROW_EXCLUSIVE] =
        "{RowExclusiveLock,ShareUpdateExclusiveLock,ShareLock,ShareRowExclusiveLock,"
        "ExclusiveLock,AccessExclusiveLock}",
    [STORE_LOCK_ACCESS_EXCLUSIVE] =
        "{AccessShareLock,RowShareLock,RowExclusiveLock,ShareUpdateExclusiveLock,ShareLock,"
        "ShareRowExclusiveLock,ExclusiveLock,AccessExclusiveLock}",
};

/* clang-format off */
/*
 * The granted locks of other sessions on outbox.job in $1's modes: one
 * line describing them, and their pids. A prepared transaction's locks
 * have no pid.
 */
static const char SQL_JOB_LOCK_HOLDERS[] =
    "SELECT coalesce(pg_catalog.string_agg("
    "         CASE WHEN l.pid IS NULL THEN 'a prepared transaction (see pg_prepared_xacts)'"
    "         ELSE pg_catalog.format('pid %s (%s)', l.pid, pg_catalog.concat_ws(', ',"
    "                'user ' || pg_catalog.to_json(a.usename::text)::text,"
    "                'application ' || pg_catalog.to_json(pg_catalog.left(NULLIF(a.application_name, ''), 60))::text,"
    "                a.state,"
    "                'transaction open ' || pg_catalog.floor(pg_catalog.date_part('epoch',"
    "                    pg_catalog.statement_timestamp() - a.xact_start))::bigint || ' s'))"
    "         END, ', ' ORDER BY l.pid), ''),"
    "       coalesce(pg_catalog.string_agg(coalesce(l.pid::text, 'prepared'), ',' ORDER BY l.pid), '')"
    "  FROM (SELECT DISTINCT k.pid FROM pg_catalog.pg_locks AS k"
    "         WHERE k.locktype = 'relation' AND k.relation = 'outbox.job'::pg_catalog.regclass"
    "           AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d"
    "                              WHERE d.datname = pg_catalog.current_database())"
    "           AND k.granted AND k.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()"
    "           AND k.mode = ANY ($1::text[])) AS l"
    "  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid";
/* clang-format on */

/* Runs a parameterless command expected to return no rows; -1 with err filled when it failed. */
static int
command(PGconn *conn, const char *sql, const char *context, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, sql);
    int rc = 0;

    if (PQresultStatus(result) != PGRES_COMMAND_OK)
        rc = outbox_error_from_pg(err, conn, result, context);
    PQclear(result);
    return rc;
}

int
store_admin_boolean_locked(PGconn *conn, const char *sql, int nparams, const char *const *values,
                           int lock_timeout_ms, bool *value, const char *context,
                           struct outbox_error *err)
{
    char setting[64];
    PGresult *result;

    snprintf(setting, sizeof(setting), "SET LOCAL lock_timeout = %d", lock_timeout_ms);
    if (command(conn, "BEGIN", context, err) < 0)
        return -1;
    if (command(conn, setting, context, err) < 0)
        goto fail;
    result = PQexecParams(conn, sql, nparams, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, context);
        PQclear(result);
        goto fail;
    }
    *value = PQgetvalue(result, 0, 0)[0] == 't';
    PQclear(result);
    return command(conn, "COMMIT", context, err);

fail:
    PQclear(PQexec(conn, "ROLLBACK"));
    return -1;
}

bool
store_lock_timed_out(const struct outbox_error *err)
{
    return strcmp(err->sqlstate, "55P03") == 0;
}

int
store_job_lock_holders(PGconn *conn, enum store_job_lock lock, char *out, size_t size,
                       char *pids, size_t pids_size, struct outbox_error *err)
{
    const char *values[1] = {conflicting_modes[lock]};
    PGresult *result = PQexecParams(conn, SQL_JOB_LOCK_HOLDERS, 1, NULL, values, NULL, NULL, 0);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to read who holds a lock on 'outbox.job'");
        PQclear(result);
        return -1;
    }
    snprintf(out, size, "%s", PQgetvalue(result, 0, 0));
    snprintf(pids, pids_size, "%s", PQgetvalue(result, 0, 1));
    PQclear(result);
    return 0;
}
