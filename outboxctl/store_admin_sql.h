/*
 * store_admin_sql.h - what the outboxctl store files (store_admin.c,
 * store_batch.c, store_console.c, store_dead.c) share and no one else needs: the SQL text
 * macros that make times read back alike under any DateStyle and TimeZone,
 * the helpers that run a statement and turn its failure into an
 * outbox_error (a missing table naming the missing schema), and the readers
 * of result cells. Private to the outboxctl store.
 */
#ifndef OUTBOXCTL_STORE_ADMIN_SQL_H
#define OUTBOXCTL_STORE_ADMIN_SQL_H

#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "error.h"
#include "store_admin.h"

/* clang-format off */

/* ISO 8601 UTC text of a timestamptz expression, whatever the session TimeZone. */
#define ISO_UTC(expr) "to_char((" expr ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"

/*
 * A time as text that reads back as the same instant under any DateStyle and
 * TimeZone: ISO 8601 in UTC with microseconds and an explicit offset. The
 * session's own text ("... 2026 CST" under DateStyle Postgres) names zones by
 * ambiguous abbreviations and moved replay ranges by hours. Infinite times
 * keep their spelling, which every session reads alike.
 */
#define EXACT_TIME(expr)                                                                           \
    "CASE WHEN isfinite(" expr ") THEN to_char((" expr ") AT TIME ZONE 'UTC',"                     \
    " 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"') ELSE (" expr ")::text END"

/* now - $1 seconds, for --since DURATION and the inbox purge's cutoff */
#define TIME_AGO_SQL "SELECT " EXACT_TIME("now() - make_interval(secs => $1::float8)")
/* The same for a PostgreSQL interval text ('10 minutes', '1 day 02:00'). */
#define INTERVAL_AGO_SQL "SELECT " EXACT_TIME("now() - $1::interval")

/*
 * Where a stream row j stands against its partition's cursor c (a row of
 * outbox.stream_cursor): published (behind it) or waiting (after it).
 */
#define STREAM_PUBLISHED "(j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)"
#define STREAM_WAITING "(j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)"

/* clang-format on */

/* PQexecParams with text parameters; NULL on out of memory is left to the caller. */
PGresult *store_admin_exec(PGconn *conn, const char *sql, int count, const char *const *params);

/*
 * The rows of a statement's result, with room for them: *items (NULL when
 * none) gets rows zeroed items of size bytes. -1 with err and result
 * cleared when the statement failed (context names it) or memory ran out.
 */
int store_admin_rows(PGconn *conn, PGresult *result, const char *context, void **items,
                     size_t size, struct outbox_error *err);

/*
 * Fills err from a failed result (result may be NULL); a missing table,
 * schema or function is a missing schema. Returns -1.
 */
int store_admin_fail(struct outbox_error *err, PGconn *conn, const PGresult *result,
                     const char *context);

/* Fills err from a failed result as outbox_error_from_pg() does, clears it. Returns -1. */
int store_admin_fail_clear(struct outbox_error *err, PGconn *conn, PGresult *result,
                           const char *context);

/* The array literal "{1,2,3}" of count ids, malloc'd; NULL when out of memory. */
char *store_admin_id_array(const int64_t *ids, size_t count);

/* The integer in a result cell; 0 for SQL NULL. */
int64_t store_admin_int64(const PGresult *result, int row, int column);

/* The number in a result cell; 0 for SQL NULL. */
double store_admin_double(const PGresult *result, int row, int column);

/* A malloc'd copy of a result cell, NULL for SQL NULL; sets *failed when out of memory. */
char *store_admin_text(const PGresult *result, int row, int column, bool *failed);

/*
 * Fills status->queues from the per-queue counts (queue, ready, running,
 * succeeded, dead, oldest ready seconds); sets *failed when out of memory,
 * leaving what was filled for store_status_clear.
 */
void store_admin_fill_queues(const PGresult *result, struct store_status *status, bool *failed);

#endif
