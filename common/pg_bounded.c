/*
 * pg_bounded.c - see pg_bounded.h.
 */
#include "pg_bounded.h"

#include <stdint.h>

#include "clock.h"
#include "pg_wait.h"

PGresult *
pg_result_bounded(PGconn *conn, int deadline_ms)
{
    int64_t deadline = clock_monotonic_ms() + deadline_ms;
    PGresult *last = NULL, *next;

    /* one deadline for every result of the statement */
    while (pg_wait_result(conn, deadline) == PG_WAIT_READY) {
        next = PQgetResult(conn);
        if (next == NULL)
            return last;
        PQclear(last);
        last = next;
    }
    PQclear(last);
    return NULL;
}

PGresult *
pg_exec_bounded(PGconn *conn, const char *sql, int nparams, const char *const *values,
                int deadline_ms)
{
    if (!PQsendQueryParams(conn, sql, nparams, NULL, values, NULL, NULL, 0) || PQflush(conn) != 0)
        return NULL;
    return pg_result_bounded(conn, deadline_ms);
}

PGresult *
pg_exec_prepared_bounded(PGconn *conn, const char *name, int nparams, const char *const *values,
                         int deadline_ms)
{
    if (!PQsendQueryPrepared(conn, name, nparams, values, NULL, NULL, 0) || PQflush(conn) != 0)
        return NULL;
    return pg_result_bounded(conn, deadline_ms);
}
