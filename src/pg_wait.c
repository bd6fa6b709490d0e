/*
 * pg_wait.c - see pg_wait.h.
 */
#include "pg_wait.h"

#include <poll.h>

#include "clock.h"

enum pg_wait_outcome
pg_wait_result(PGconn *conn, int64_t deadline_ms)
{
    while (PQisBusy(conn)) {
        int64_t remaining = deadline_ms - clock_monotonic_ms();
        struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};

        if (remaining <= 0)
            return PG_WAIT_TIMEOUT;
        if (pfd.fd < 0)
            return PG_WAIT_CLOSED;
        /* an interrupted poll() is tried again with what is left of the deadline */
        if (poll(&pfd, 1, (int)remaining) > 0 && !PQconsumeInput(conn))
            return PG_WAIT_FAILED;
    }
    return PG_WAIT_READY;
}
