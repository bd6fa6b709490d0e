/*
 * store_stream_admin.h - the figures of stream queues (lag per partition,
 * the transaction at the horizon) and their administration (outboxctl
 * stream) on a caller's connection. store_stream.h includes this header:
 * a stream_store reads the same figures on its own connection.
 */
#ifndef OUTBOX_STORE_STREAM_ADMIN_H
#define OUTBOX_STORE_STREAM_ADMIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <libpq-fe.h>

#include "error.h"

/* One partition's figures for metrics and outboxctl. */
struct stream_lag {
    char queue[208];
    int partition;
    char owner[192]; /* "" when no unexpired lease */
    int64_t rows;    /* rows after the cursor (counted up to STREAM_LAG_COUNT_MAX) */
    double seconds;  /* age of the oldest row after the cursor, 0 when none */
    char lease_until[32]; /* ISO 8601 UTC end of the owner's lease, "" when none */
};

#define STREAM_LAG_COUNT_MAX 100000

/*
 * The transaction holding the snapshot horizon back, the oldest with an xid
 * in any database of the cluster: a session's, or a prepared transaction's
 * (prepared[0] != '\0', pid 0, no application or query), which holds it
 * until COMMIT PREPARED or ROLLBACK PREPARED.
 */
struct stream_horizon {
    bool found;
    int pid;
    double seconds; /* since its transaction began, or was prepared */
    char user[64];  /* a prepared transaction: its owner */
    char application[64];
    char query[160];    /* its current or last statement, first characters */
    char prepared[208]; /* the prepared transaction's gid; "" for a session */
    char database[64];
};

/*
 * Take a result of stream_sql_lag or stream_sql_horizon (NULL: the
 * statement failed, err filled) and clear it. The lag's rows go into a new
 * array *out (free() it), *count its length; the horizon is found when the
 * result has a row.
 */
int stream_lag_read(PGresult *result, struct stream_lag **out, size_t *count,
                    struct outbox_error *err);
int stream_horizon_read(PGresult *result, struct stream_horizon *out);

/* ---- administration (outboxctl stream) ---- */

/*
 * outbox.stream_enable(): *changed false when queue was a stream of that
 * many partitions already. Another count, a bad name: OUTBOX_ERR_INVALID.
 * One try: it waits at most lock_timeout_ms for each lock (its trigger
 * needs SHARE ROW EXCLUSIVE on outbox.job), else fails with nothing changed
 * and store_lock_timed_out(err) true (see store_admin_lock.h).
 */
int stream_admin_enable(PGconn *conn, const char *queue, int partitions, int lock_timeout_ms,
                        bool *changed, struct outbox_error *err);

/*
 * outbox.stream_disable(): *changed false when queue was no stream. One
 * try like stream_admin_enable() (dropping the trigger needs ACCESS
 * EXCLUSIVE on outbox.job).
 */
int stream_admin_disable(PGconn *conn, const char *queue, int lock_timeout_ms, bool *changed,
                         struct outbox_error *err);

/*
 * *exists: whether a stream queue is among queues (a text[] literal, NULL:
 * any queue). One index-only probe of outbox.stream, cheap enough for a
 * relay with no stream to ask it on a connection it holds anyway.
 */
int stream_admin_exists(PGconn *conn, const char *queues, bool *exists, struct outbox_error *err);

/* stream_store_lag() and stream_store_horizon() on a caller's connection (outboxctl serve). */
int stream_admin_lag(PGconn *conn, struct stream_lag **out, size_t *count,
                     struct outbox_error *err);
int stream_admin_horizon(PGconn *conn, struct stream_horizon *out, struct outbox_error *err);

/* Writes every stream partition, its owner and lag, as a table on out. */
int stream_admin_list(PGconn *conn, FILE *out, struct outbox_error *err);

#endif
