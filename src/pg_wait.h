/*
 * pg_wait.h - waiting for a libpq connection's next result within a
 * deadline on our side.
 *
 * libpq waits for ever on a server that stopped answering (a stopped
 * backend, a frozen host whose kernel still acknowledges). Every bounded
 * statement waits here: the store's (store_exec.c) and those the relay
 * sends on connections it drives by hand (common/pg_bounded.c). Internal:
 * not exported from the library.
 */
#ifndef OUTBOX_PG_WAIT_H
#define OUTBOX_PG_WAIT_H

#include <stdint.h>

#include <libpq-fe.h>

/* How a wait ended. */
enum pg_wait_outcome {
    PG_WAIT_READY,   /* the next result can be read without blocking */
    PG_WAIT_TIMEOUT, /* the deadline came first: the server may still hold the statement */
    PG_WAIT_CLOSED,  /* the connection has no socket */
    PG_WAIT_FAILED,  /* reading from the server failed: PQerrorMessage(conn) says why */
};

/*
 * Reads what the server sends on conn (a statement sent and flushed) until
 * its next result is complete, polling until deadline_ms, a time of
 * clock_monotonic_ms(). The caller drops the connection on anything but
 * PG_WAIT_READY.
 */
enum pg_wait_outcome pg_wait_result(PGconn *conn, int64_t deadline_ms);

#endif
