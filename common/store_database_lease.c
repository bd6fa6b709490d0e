/*
 * store_database_lease.c - see store_database_lease.h.
 */
#include "store_database_lease.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char SQL_TAKE[] =
    "SELECT held, paused FROM outbox.database_lease_take($1, $2::integer)";
static const char SQL_RELEASE[] = "SELECT outbox.database_lease_release($1)";
/* from job_ready_idx: an idle database's ready rows are its scheduled ones, a few */
static const char SQL_NEXT_READY[] =
    "SELECT CASE WHEN min(run_at) IS NULL THEN -1"
    "            ELSE greatest(extract(epoch FROM min(run_at) - now()), 0)::float8 END"
    " FROM outbox.job WHERE state = 'ready' AND NOT held";

int
store_database_lease_take(PGconn *conn, const char *relay_id, int lease_seconds, bool *held,
                          bool *paused, struct outbox_error *err)
{
    char seconds[16];
    const char *values[2] = {relay_id, seconds};
    PGresult *result;

    snprintf(seconds, sizeof(seconds), "%d", lease_seconds);
    result = PQexecParams(conn, SQL_TAKE, 2, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to take the database lease");
        if (err != NULL && strcmp(err->sqlstate, "42883") == 0) {
            err->code = OUTBOX_ERR_SCHEMA; /* before migration 018 */
            snprintf(err->message, sizeof(err->message),
                     "the database lease is missing (a schema before migration 018):"
                     " run 'outboxctl migrate'");
        }
        PQclear(result);
        return -1;
    }
    *held = PQgetvalue(result, 0, 0)[0] == 't';
    *paused = PQgetvalue(result, 0, 1)[0] == 't';
    PQclear(result);
    return 0;
}

int
store_database_lease_release(PGconn *conn, const char *relay_id, struct outbox_error *err)
{
    const char *values[1] = {relay_id};
    PGresult *result = PQexecParams(conn, SQL_RELEASE, 1, NULL, values, NULL, NULL, 0);

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, "unable to release the database lease");
        PQclear(result);
        return -1;
    }
    PQclear(result);
    return 0;
}

int
store_database_next_ready(PGconn *conn, double *seconds, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, SQL_NEXT_READY);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to read when the next row is due");
        PQclear(result);
        return -1;
    }
    *seconds = atof(PQgetvalue(result, 0, 0));
    PQclear(result);
    return 0;
}
