/*
 * pg_bounded.h - a statement on a bare libpq connection, waited for within
 * a deadline on our side.
 *
 * libpq's PQexec waits for ever on a server that stopped answering (a
 * stopped backend, a frozen host whose kernel still acknowledges). The
 * store bounds its own statements (src/store_exec.c); this bounds, with the
 * same wait (src/pg_wait.h), the statements on the connections the relay
 * drives by hand: the statistics watch's, and the database lease's and the
 * stream queues' statements on a slot's connection.
 */
#ifndef OUTBOX_PG_BOUNDED_H
#define OUTBOX_PG_BOUNDED_H

#include <libpq-fe.h>

/*
 * Sends sql with its nparams text parameters on conn (idle, not in
 * pipeline mode) and returns its last result, or NULL when the server did
 * not answer within deadline_ms or the connection failed (the caller drops
 * the connection; PQerrorMessage names a failure, not a timeout).
 */
PGresult *pg_exec_bounded(PGconn *conn, const char *sql, int nparams, const char *const *values,
                          int deadline_ms);

/* The same for the statement prepared on conn as name. */
PGresult *pg_exec_prepared_bounded(PGconn *conn, const char *name, int nparams,
                                   const char *const *values, int deadline_ms);

/* Waits within deadline_ms for the results of the query sent on conn: its last, NULL as above. */
PGresult *pg_result_bounded(PGconn *conn, int deadline_ms);

#endif
