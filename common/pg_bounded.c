/*
 * pg_bounded.c - see pg_bounded.h.
 */
#include "pg_bounded.h"

#include <stdint.h>

#include <poll.h>

#include "clock.h"

PGresult *
pg_result_bounded(PGconn *conn, int deadline_ms)
{
    int64_t deadline = clock_monotonic_ms() + deadline_ms;
    PGresult *last = NULL, *next;

    for (;;) {
        while (PQisBusy(conn)) {
            struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};
            int64_t remaining = deadline - clock_monotonic_ms();

            if (remaining <= 0 || pfd.fd < 0 || poll(&pfd, 1, (int)remaining) < 0 ||
                !PQconsumeInput(conn)) {
                PQclear(last);
                return NULL;
            }
        }
        next = PQgetResult(conn);
        if (next == NULL)
            return last;
        PQclear(last);
        last = next;
    }
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
