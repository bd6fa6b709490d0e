/*
 * store_stream_admin.c - stream figures (each partition's lag, the
 * transaction at the horizon) read from a result, and the administration
 * of stream queues (outboxctl stream) on a caller's connection.
 */
#include "store_stream_admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "store_admin_lock.h"
#include "store_row.h"
#include "store_stream_sql.h"

int
stream_lag_read(PGresult *result, struct stream_lag **out, size_t *count, struct outbox_error *err)
{
    int rows = result != NULL ? PQntuples(result) : 0;

    *out = NULL;
    *count = 0;
    if (result == NULL)
        return -1;
    if (rows > 0 && (*out = calloc((size_t)rows, sizeof(**out))) == NULL) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    for (int r = 0; r < rows; r++) {
        struct stream_lag *l = &(*out)[r];

        store_row_copy_cell(l->queue, sizeof(l->queue), result, r, 0);
        l->partition = (int)strtol(PQgetvalue(result, r, 1), NULL, 10);
        store_row_copy_cell(l->owner, sizeof(l->owner), result, r, 2);
        l->rows = strtoll(PQgetvalue(result, r, 3), NULL, 10);
        l->seconds = strtod(PQgetvalue(result, r, 4), NULL);
        store_row_copy_cell(l->lease_until, sizeof(l->lease_until), result, r, 5);
    }
    *count = (size_t)rows;
    PQclear(result);
    return 0;
}

int
stream_horizon_read(PGresult *result, struct stream_horizon *out)
{
    memset(out, 0, sizeof(*out));
    if (result == NULL)
        return -1;
    if (PQntuples(result) == 1) {
        out->found = true;
        out->pid = (int)strtol(PQgetvalue(result, 0, 0), NULL, 10);
        store_row_copy_cell(out->user, sizeof(out->user), result, 0, 1);
        store_row_copy_cell(out->application, sizeof(out->application), result, 0, 2);
        out->seconds = strtod(PQgetvalue(result, 0, 3), NULL);
        store_row_copy_cell(out->query, sizeof(out->query), result, 0, 4);
        store_row_copy_cell(out->prepared, sizeof(out->prepared), result, 0, 5);
        store_row_copy_cell(out->database, sizeof(out->database), result, 0, 6);
    }
    PQclear(result);
    return 0;
}

/* Runs sql with params on conn, expecting one boolean; *value gets it. */
static int
admin_boolean(PGconn *conn, const char *sql, int nparams, const char *const *values, bool *value,
              const char *context, struct outbox_error *err)
{
    PGresult *result = PQexecParams(conn, sql, nparams, NULL, values, NULL, NULL, 0);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, context);
        PQclear(result);
        return -1;
    }
    *value = PQgetvalue(result, 0, 0)[0] == 't';
    PQclear(result);
    return 0;
}

int
stream_admin_enable(PGconn *conn, const char *queue, int partitions, int lock_timeout_ms,
                    bool *changed, struct outbox_error *err)
{
    char count[16];
    const char *values[2] = {queue, count};

    snprintf(count, sizeof(count), "%d", partitions);
    return store_admin_boolean_locked(conn, "SELECT outbox.stream_enable($1, $2::int)", 2, values,
                                      lock_timeout_ms, changed,
                                      "unable to make the queue a stream", err);
}

int
stream_admin_disable(PGconn *conn, const char *queue, int lock_timeout_ms, bool *changed,
                     struct outbox_error *err)
{
    const char *values[1] = {queue};

    return store_admin_boolean_locked(conn, "SELECT outbox.stream_disable($1)", 1, values,
                                      lock_timeout_ms, changed,
                                      "unable to make the stream a row-state queue", err);
}

int
stream_admin_exists(PGconn *conn, const char *queues, bool *exists, struct outbox_error *err)
{
    const char *values[1] = {queues};

    return admin_boolean(conn,
                         "SELECT EXISTS (SELECT 1 FROM outbox.stream"
                         " WHERE $1::text[] IS NULL OR queue = ANY ($1::text[]))",
                         1, values, exists, "unable to look for stream queues", err);
}

int
stream_admin_list(PGconn *conn, FILE *out, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, stream_sql_lag);
    int rows;

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, "unable to list the streams");
        PQclear(result);
        return -1;
    }
    rows = PQntuples(result);
    if (rows == 0)
        fputs("no stream queues\n", out);
    else
        fprintf(out, "%-24s %9s %10s %10s  %s\n", "queue", "partition", "lag_rows", "lag_s",
                "owner");
    for (int r = 0; r < rows; r++) {
        const char *owner = PQgetvalue(result, r, 2);

        fprintf(out, "%-24s %9s %10s %10.1f  %s\n", PQgetvalue(result, r, 0),
                PQgetvalue(result, r, 1), PQgetvalue(result, r, 3),
                strtod(PQgetvalue(result, r, 4), NULL), owner[0] != '\0' ? owner : "-");
    }
    PQclear(result);
    return 0;
}

/* Runs sql (no parameters) on conn; NULL with err unless it returned rows. */
static PGresult *
admin_query(PGconn *conn, const char *sql, const char *context, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, sql);

    if (PQresultStatus(result) == PGRES_TUPLES_OK)
        return result;
    outbox_error_from_pg(err, conn, result, context);
    PQclear(result);
    return NULL;
}

int
stream_admin_lag(PGconn *conn, struct stream_lag **out, size_t *count, struct outbox_error *err)
{
    return stream_lag_read(admin_query(conn, stream_sql_lag, "unable to read the stream lag", err),
                           out, count, err);
}

int
stream_admin_horizon(PGconn *conn, struct stream_horizon *out, struct outbox_error *err)
{
    return stream_horizon_read(
        admin_query(conn, stream_sql_horizon, "unable to read the transaction horizon", err), out);
}
