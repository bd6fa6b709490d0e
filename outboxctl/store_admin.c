/*
 * store_admin.c - status, dead rows, enqueue, pauses and the time texts of
 * replay ranges for operators; the batched statements (purge, replay, inbox
 * purge) are in store_batch.c.
 */
#include "store_admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "migrate.h"
#include "store_admin_sql.h"

#define SCHEMA_MISSING "outbox schema not found: run 'outboxctl migrate'"

/* clang-format off */

static const char check_schema_sql[] = "SELECT to_regclass('outbox.job') IS NOT NULL";

/*
 * Ages are differences of epoch seconds, never of timestamps, so that a row
 * holding an infinite time cannot make the statement fail; a ready row due
 * since -infinity has waited since it was created.
 */
static const char queue_status_sql[] =
    "SELECT j.queue,"
    "       count(*) FILTER (WHERE j.state = 'ready'),"
    "       count(*) FILTER (WHERE j.state = 'running'),"
    "       count(*) FILTER (WHERE j.state = 'succeeded'),"
    "       count(*) FILTER (WHERE j.state = 'dead'),"
    "       greatest(coalesce(extract(epoch FROM now()) - extract(epoch FROM least("
    "           min(j.run_at) FILTER (WHERE j.state = 'ready' AND j.run_at <= now()"
    "                                   AND isfinite(j.run_at)),"
    "           min(j.created_at) FILTER (WHERE j.state = 'ready' AND j.run_at = '-infinity'"
    "                                       AND isfinite(j.created_at)),"
    "           min(j.created_at) FILTER (WHERE j.state = 'stream' AND isfinite(j.created_at)"
    "                                       AND " STREAM_WAITING "))),"
    "         0), 0)::float8,"
    "       count(*) FILTER (WHERE j.state = 'stream' AND " STREAM_PUBLISHED "),"
    "       count(*) FILTER (WHERE j.state = 'stream' AND " STREAM_WAITING "),"
    "       j.queue IN (SELECT s.queue FROM outbox.stream AS s)"
    "  FROM outbox.job AS j LEFT JOIN outbox.stream_cursor AS c"
    "    ON c.queue = j.queue AND c.partition = j.stream_partition"
    " GROUP BY j.queue ORDER BY j.queue";

static const char table_status_sql[] =
    "SELECT pg_table_size(c.oid), pg_indexes_size(c.oid),"
    "       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),"
    "       " ISO_UTC("s.last_autovacuum") ", " ISO_UTC("s.last_autoanalyze")
    "  FROM pg_class AS c LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid"
    " WHERE c.oid = 'outbox.job'::regclass";

/*
 * Sessions of any database and prepared transactions with an xmin or xid,
 * oldest first; not this session. The stream horizon is the cluster's (a
 * transaction of another database stops every stream too), and a prepared
 * transaction holds it without a session.
 */
static const char oldest_transaction_sql[] =
    "SELECT t.pid, t.application_name, t.state, t.age_seconds, t.xid_age, t.database, t.gid"
    "  FROM (SELECT pid, coalesce(application_name, '') AS application_name,"
    "               coalesce(state, '') AS state,"
    "               coalesce(extract(epoch FROM now() - xact_start), 0)::float8 AS age_seconds,"
    "               greatest(age(backend_xid), age(backend_xmin)) AS xid_age,"
    "               coalesce(datname::text, '') AS database, '' AS gid, xact_start AS began"
    "          FROM pg_stat_activity"
    "         WHERE pid <> pg_backend_pid()"
    "           AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)"
    "        UNION ALL"
    "        SELECT 0, '', 'prepared', extract(epoch FROM now() - prepared)::float8,"
    "               age(transaction), database::text, gid, prepared"
    "          FROM pg_prepared_xacts) AS t"
    " ORDER BY t.xid_age DESC, t.began"
    " LIMIT 1";

/*
 * The keyed rows that can block their key, with the columns cols: dead rows
 * and ready rows that failed before, both in job_stuck_key_idx (an
 * index-only scan when cols are its columns), and running rows on a retry,
 * or that no relay can be running as intended (from job_lease_idx): a
 * lease that expired and waits for the reaper, a lease longer than the
 * longest --lease (a day), attempt 0, which a claim never leaves. Never
 * succeeded rows.
 */
#define BLOCKED_CANDIDATES(cols)                                                             \
    "    SELECT " cols " FROM outbox.job"                                                    \
    "     WHERE ordering_key IS NOT NULL"                                                    \
    "       AND (state = 'dead' OR (state = 'ready' AND attempts > 0))"                      \
    "    UNION ALL"                                                                          \
    "    SELECT " cols " FROM outbox.job WHERE state = 'running' AND ordering_key IS NOT NULL" \
    "       AND (last_error IS NOT NULL OR attempts = 0 OR lease_until <= now()"             \
    "            OR lease_until > now() + interval '1 day')"

/* A candidate c is its key's head: no unfinished row of the key before it (job_ordering_idx). */
#define BLOCKED_IS_HEAD                                                                      \
    " NOT EXISTS (SELECT 1 FROM outbox.job AS e"                                             \
    "              WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key"              \
    "                AND e.state IN ('ready', 'running', 'dead') AND e.job_id < c.job_id)"

/*
 * Blocked ordering keys, cheap on a table of millions of rows: the heads
 * among the candidates, at most $1 per queue, with how many rows wait
 * behind each (range probes of job_ordering_idx). The cost follows the
 * number of dead and retrying rows, not the size of the table.
 */
static const char blocked_keys_sql[] =
    "WITH candidate AS ("
    BLOCKED_CANDIDATES("job_id, queue, ordering_key, state, attempts, max_attempts, last_error,"
                       " run_at")
    "), head AS ("
    "    SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY c.job_id) AS rank,"
    "           count(*) OVER (PARTITION BY c.queue) AS blocked_keys"
    "      FROM candidate AS c"
    "     WHERE" BLOCKED_IS_HEAD
    ")"
    " SELECT h.queue, h.ordering_key, h.job_id, h.state, h.attempts, h.max_attempts,"
    "        h.last_error, h.blocked_keys,"
    "        CASE WHEN h.state <> 'ready' THEN 0"
    "             WHEN isfinite(h.run_at)"
    "             THEN greatest(extract(epoch FROM h.run_at) - extract(epoch FROM now()), 0)"
    "        END::float8,"
    "        (SELECT count(*) FROM outbox.job AS w"
    "          WHERE w.queue = h.queue AND w.ordering_key = h.ordering_key"
    "            AND w.state IN ('ready', 'running', 'dead') AND w.job_id > h.job_id"
    "            AND w.state <> 'dead')"
    "   FROM head AS h"
    "  WHERE h.rank <= $1::bigint"
    "  ORDER BY h.queue, h.job_id";

/* The number of blocked keys per queue alone: index-only but for the running rows. */
static const char blocked_counts_sql[] =
    "WITH candidate AS (" BLOCKED_CANDIDATES("queue, ordering_key, job_id") ")"
    " SELECT c.queue, count(*) FROM candidate AS c WHERE" BLOCKED_IS_HEAD
    " GROUP BY c.queue ORDER BY c.queue";

/* ---- pause, replay times ---- */

/*
 * NULL instead of pausing one key of a stream queue: its partition cannot
 * skip a key without losing the order of the others (pause the queue).
 */
static const char pause_sql[] =
    "SELECT CASE WHEN $2::text IS NOT NULL"
    "             AND EXISTS (SELECT 1 FROM outbox.stream AS s WHERE s.queue = $1)"
    "            THEN NULL ELSE outbox.pause($1, $2, $3) END";

static const char resume_sql[] =
    "SELECT outbox.resume($1, $2),"
    "       (SELECT count(*) FROM outbox.paused WHERE queue = $1 AND ordering_key IS NOT NULL)";

static const char paused_sql[] =
    "SELECT queue, ordering_key, reason, paused_by, " ISO_UTC("paused_at")
    "  FROM outbox.paused ORDER BY queue, ordering_key NULLS FIRST";

static const char check_time_sql[] = "SELECT $1::timestamptz";

/* clang-format on */

char *
store_admin_text(const PGresult *result, int row, int column, bool *failed)
{
    char *copy;

    if (PQgetisnull(result, row, column))
        return NULL;
    copy = strdup(PQgetvalue(result, row, column));
    if (copy == NULL)
        *failed = true;
    return copy;
}

int64_t
store_admin_int64(const PGresult *result, int row, int column)
{
    return PQgetisnull(result, row, column) ? 0
                                            : strtoll(PQgetvalue(result, row, column), NULL, 10);
}

double
store_admin_double(const PGresult *result, int row, int column)
{
    return PQgetisnull(result, row, column) ? 0.0 : strtod(PQgetvalue(result, row, column), NULL);
}

PGresult *
store_admin_exec(PGconn *conn, const char *sql, int count, const char *const *params)
{
    return PQexecParams(conn, sql, count, NULL, params, NULL, NULL, 0);
}

int
store_admin_fail(struct outbox_error *err, PGconn *conn, const PGresult *result,
                 const char *context)
{
    const char *sqlstate = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : NULL;

    if (sqlstate != NULL && (strcmp(sqlstate, "42P01") == 0 || strcmp(sqlstate, "3F000") == 0 ||
                             strcmp(sqlstate, "42883") == 0)) {
        outbox_error_set(err, OUTBOX_ERR_SCHEMA, SCHEMA_MISSING);
        memcpy(err->sqlstate, sqlstate, 6);
        return -1;
    }
    return outbox_error_from_pg(err, conn, result, context);
}

int
store_admin_check_schema(PGconn *conn, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, check_schema_sql);
    bool present;

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to look for the outbox schema");
        PQclear(result);
        return -1;
    }
    present = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    if (!present)
        return outbox_error_set(err, OUTBOX_ERR_SCHEMA, SCHEMA_MISSING);
    return 0;
}

void
store_admin_fill_queues(const PGresult *result, struct store_status *status, bool *failed)
{
    int rows = PQntuples(result);

    if (rows > 0 && (status->queues = calloc((size_t)rows, sizeof(*status->queues))) == NULL)
        *failed = true;
    for (int row = 0; row < rows && !*failed; row++) {
        struct store_queue_status *queue = &status->queues[row];

        status->queue_count++;
        queue->queue = store_admin_text(result, row, 0, failed);
        queue->ready = store_admin_int64(result, row, 1);
        queue->running = store_admin_int64(result, row, 2);
        queue->succeeded = store_admin_int64(result, row, 3);
        queue->dead = store_admin_int64(result, row, 4);
        queue->oldest_ready_seconds = store_admin_double(result, row, 5);
        if (PQnfields(result) > 8) { /* status: the stream columns */
            queue->stream_published = store_admin_int64(result, row, 6);
            queue->stream_waiting = store_admin_int64(result, row, 7);
            queue->stream = PQgetvalue(result, row, 8)[0] == 't';
        }
    }
}

/* Fills the per-queue part of status. */
static int
read_queue_status(PGconn *conn, struct store_status *status, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, queue_status_sql);
    bool failed = false;

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        store_admin_fail(err, conn, result, "unable to count jobs per queue");
        PQclear(result);
        return -1;
    }
    store_admin_fill_queues(result, status, &failed);
    PQclear(result);
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

/* Fills sizes and vacuum figures of outbox.job. */
static int
read_table_status(PGconn *conn, struct store_status *status, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, table_status_sql);
    bool failed = false;

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to read the size of 'outbox.job'");
        PQclear(result);
        return -1;
    }
    status->table_bytes = store_admin_int64(result, 0, 0);
    status->index_bytes = store_admin_int64(result, 0, 1);
    status->live_tuples = store_admin_int64(result, 0, 2);
    status->dead_tuples = store_admin_int64(result, 0, 3);
    status->last_autovacuum = store_admin_text(result, 0, 4, &failed);
    status->last_autoanalyze = store_admin_text(result, 0, 5, &failed);
    PQclear(result);
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

/* Fills the oldest transaction holding back the xmin horizon, if any. */
static int
read_oldest_transaction(PGconn *conn, struct store_oldest_transaction *oldest,
                        struct outbox_error *err)
{
    PGresult *result = PQexec(conn, oldest_transaction_sql);
    bool failed = false;

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, "unable to read 'pg_stat_activity'");
        PQclear(result);
        return -1;
    }
    if (PQntuples(result) == 1) {
        oldest->present = true;
        oldest->pid = (int)store_admin_int64(result, 0, 0);
        oldest->application_name = store_admin_text(result, 0, 1, &failed);
        oldest->state = store_admin_text(result, 0, 2, &failed);
        oldest->age_seconds = store_admin_double(result, 0, 3);
        oldest->xid_age = store_admin_int64(result, 0, 4);
        oldest->database = store_admin_text(result, 0, 5, &failed);
        oldest->prepared_gid = store_admin_text(result, 0, 6, &failed);
    }
    PQclear(result);
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

/*
 * The queue named queue among status->queues, or NULL. The search starts at
 * *hint, the last one found: the rows that name queues come in the order of
 * status->queues (both ORDER BY queue), so a walk over them all stays linear.
 */
static struct store_queue_status *
find_queue(struct store_status *status, const char *queue, size_t *hint)
{
    for (size_t n = 0; queue != NULL && n < status->queue_count; n++) {
        size_t i = (*hint + n) % status->queue_count;

        if (strcmp(status->queues[i].queue, queue) == 0) {
            *hint = i;
            return &status->queues[i];
        }
    }
    return NULL;
}

/* Fills the blocked keys of status and each queue's blocked_keys total. */
static int
read_blocked_keys(PGconn *conn, struct store_status *status, struct outbox_error *err)
{
    char limit[24];
    const char *params[1] = {limit};
    struct store_queue_status *queue;
    PGresult *result;
    bool failed = false;
    size_t hint = 0;
    int rows;

    snprintf(limit, sizeof(limit), "%d", STORE_BLOCKED_KEYS_PER_QUEUE);
    result = store_admin_exec(conn, blocked_keys_sql, 1, params);
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        store_admin_fail(err, conn, result, "unable to look for blocked ordering keys");
        PQclear(result);
        return -1;
    }
    rows = PQntuples(result);
    if (rows > 0) {
        status->blocked = calloc((size_t)rows, sizeof(*status->blocked));
        if (status->blocked == NULL)
            failed = true;
    }
    for (int row = 0; row < rows && !failed; row++) {
        struct store_blocked_key *key = &status->blocked[row];

        status->blocked_count++;
        key->queue = store_admin_text(result, row, 0, &failed);
        key->ordering_key = store_admin_text(result, row, 1, &failed);
        key->head_job_id = store_admin_int64(result, row, 2);
        key->head_state = store_admin_text(result, row, 3, &failed);
        key->attempts = (int32_t)store_admin_int64(result, row, 4);
        key->max_attempts = (int32_t)store_admin_int64(result, row, 5);
        key->last_error = store_admin_text(result, row, 6, &failed);
        /* NULL: a ready head due at +infinity, which never comes */
        key->retry_in_seconds = PQgetisnull(result, row, 8) ? -1 : store_admin_double(result, row, 8);
        key->waiting = store_admin_int64(result, row, 9);
        if ((queue = find_queue(status, key->queue, &hint)) != NULL)
            queue->blocked_keys = store_admin_int64(result, row, 7);
    }
    PQclear(result);
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

/* Sets each queue's blocked_keys total in status, without the keys themselves. */
static int
read_blocked_counts(PGconn *conn, struct store_status *status, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, blocked_counts_sql);
    size_t hint = 0;

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        store_admin_fail(err, conn, result, "unable to count blocked ordering keys");
        PQclear(result);
        return -1;
    }
    for (int row = 0; row < PQntuples(result); row++) {
        struct store_queue_status *queue = find_queue(status, PQgetvalue(result, row, 0), &hint);

        if (queue != NULL)
            queue->blocked_keys = store_admin_int64(result, row, 1);
    }
    PQclear(result);
    return 0;
}

/* Fills list from paused_sql. */
static int
read_pauses(PGconn *conn, struct store_pause_list *list, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, paused_sql);
    bool failed = false;
    int rows;

    memset(list, 0, sizeof(*list));
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        store_admin_fail(err, conn, result, "unable to list paused queues");
        PQclear(result);
        return -1;
    }
    rows = PQntuples(result);
    if (rows > 0) {
        list->pauses = calloc((size_t)rows, sizeof(*list->pauses));
        if (list->pauses == NULL)
            failed = true;
    }
    for (int row = 0; row < rows && !failed; row++) {
        struct store_pause *pause = &list->pauses[row];

        list->count++;
        pause->queue = store_admin_text(result, row, 0, &failed);
        pause->ordering_key = store_admin_text(result, row, 1, &failed);
        pause->reason = store_admin_text(result, row, 2, &failed);
        pause->paused_by = store_admin_text(result, row, 3, &failed);
        pause->paused_at = store_admin_text(result, row, 4, &failed);
    }
    PQclear(result);
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

/* Marks the queues of status that are paused, or have paused keys. */
static void
apply_pauses(struct store_status *status)
{
    size_t hint = 0;

    for (size_t p = 0; p < status->paused.count; p++) {
        const struct store_pause *pause = &status->paused.pauses[p];
        struct store_queue_status *queue = find_queue(status, pause->queue, &hint);

        if (queue != NULL && pause->ordering_key == NULL)
            queue->paused = true;
        else if (queue != NULL)
            queue->paused_keys++;
    }
}

/* Copies a row of (database_id, id_form, epoch, timeline) into out. */
static void
identity_from(const PGresult *result, struct store_identity_row *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->database_id, sizeof(out->database_id), "%s", PQgetvalue(result, 0, 0));
    snprintf(out->id_form, sizeof(out->id_form), "%s", PQgetvalue(result, 0, 1));
    out->epoch = atoi(PQgetvalue(result, 0, 2));
    out->timeline = PQgetisnull(result, 0, 3) ? 0 : atoll(PQgetvalue(result, 0, 3));
}

int
store_admin_identity(PGconn *conn, struct store_identity_row *out, bool *present,
                     struct outbox_error *err)
{
    PGresult *result;

    memset(out, 0, sizeof(*out));
    *present = false;
    result = PQexec(conn, "SELECT to_regclass('outbox.identity') IS NOT NULL");
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, "unable to read the database identity");
        PQclear(result);
        return -1;
    }
    *present = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    if (!*present)
        return 0;
    result = PQexec(conn, "SELECT database_id, id_form, epoch, timeline FROM outbox.identity");
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to read the database identity");
        PQclear(result);
        return -1;
    }
    identity_from(result, out);
    PQclear(result);
    return 0;
}

int
store_admin_identity_set(PGconn *conn, const char *database_id, const char *id_form,
                         struct store_identity_row *out, struct outbox_error *err)
{
    const char *params[2] = {database_id, id_form};
    PGresult *result = PQexecParams(conn,
                                    "SELECT s.database_id, s.id_form, s.epoch, i.timeline"
                                    " FROM outbox.identity_set($1, $2) AS s, outbox.identity AS i",
                                    2, NULL, params, NULL, NULL, 0);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        const char *sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);

        outbox_error_from_pg(err, conn, result, "unable to set the database identity");
        if (sqlstate != NULL && strcmp(sqlstate, "22023") == 0)
            err->code = OUTBOX_ERR_INVALID;
        PQclear(result);
        return -1;
    }
    identity_from(result, out);
    PQclear(result);
    return 0;
}

int
store_admin_status(PGconn *conn, double retention_seconds, struct store_status *status,
                   struct outbox_error *err)
{
    bool identity_present;

    memset(status, 0, sizeof(*status));
    if (store_admin_check_schema(conn, err) < 0)
        return -1;
    status->retention_seconds = retention_seconds;
    if (outbox_schema_version(conn, &status->schema_version, err) < 0 ||
        store_admin_identity(conn, &status->identity, &identity_present, err) < 0 ||
        read_queue_status(conn, status, err) < 0 || read_table_status(conn, status, err) < 0 ||
        outbox_sample_table(conn, retention_seconds, &status->cleanup, err) < 0 ||
        read_oldest_transaction(conn, &status->oldest_transaction, err) < 0 ||
        read_blocked_keys(conn, status, err) < 0 || read_pauses(conn, &status->paused, err) < 0) {
        store_status_clear(status);
        return -1;
    }
    if (retention_seconds <= 0) { /* retention 0 keeps succeeded rows: none is past it */
        status->cleanup.past_retention_rows = 0;
        status->cleanup.oldest_past_retention_seconds = 0;
    }
    apply_pauses(status);
    return 0;
}

void
store_status_clear(struct store_status *status)
{
    if (status == NULL)
        return;
    for (size_t i = 0; i < status->queue_count; i++)
        free(status->queues[i].queue);
    free(status->queues);
    free(status->last_autovacuum);
    free(status->last_autoanalyze);
    free(status->oldest_transaction.application_name);
    free(status->oldest_transaction.state);
    free(status->oldest_transaction.database);
    free(status->oldest_transaction.prepared_gid);
    for (size_t i = 0; i < status->blocked_count; i++) {
        free(status->blocked[i].queue);
        free(status->blocked[i].ordering_key);
        free(status->blocked[i].head_state);
        free(status->blocked[i].last_error);
    }
    free(status->blocked);
    store_pause_list_clear(&status->paused);
    memset(status, 0, sizeof(*status));
}

int
store_admin_enqueue(PGconn *conn, const struct outbox_message *message, int64_t *job_id,
                    struct outbox_error *err)
{
    PGresult *result = NULL;
    PGTransactionStatusType state;

    *job_id = 0;
    result = PQexec(conn, "BEGIN");
    if (PQresultStatus(result) != PGRES_COMMAND_OK)
        goto fail;
    PQclear(result);
    result = NULL;
    if (outbox_enqueue(conn, message, job_id, err) != 0)
        goto rollback;
    /* delivered on commit; a relay waiting on the channel wakes at once */
    result = PQexec(conn, "NOTIFY outbox_job");
    if (PQresultStatus(result) != PGRES_COMMAND_OK)
        goto fail;
    PQclear(result);
    result = PQexec(conn, "COMMIT");
    if (PQresultStatus(result) != PGRES_COMMAND_OK)
        goto fail;
    PQclear(result);
    return 0;

fail:
    store_admin_fail(err, conn, result, "unable to enqueue");
    PQclear(result);
rollback:
    state = PQtransactionStatus(conn);
    if (state == PQTRANS_INTRANS || state == PQTRANS_INERROR)
        PQclear(PQexec(conn, "ROLLBACK"));
    *job_id = 0;
    return -1;
}

/* ---- pause and resume -------------------------------------------------- */

int
store_admin_pause(PGconn *conn, const char *queue, const char *key, const char *reason,
                  bool *changed, struct outbox_error *err)
{
    const char *params[3] = {queue, key, reason};
    PGresult *result = store_admin_exec(conn, pause_sql, 3, params);

    *changed = false;
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to pause");
        PQclear(result);
        return -1;
    }
    if (PQgetisnull(result, 0, 0)) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "queue '%s' is a stream: an ordering key cannot be paused on its"
                                " own, pause the whole queue",
                                queue);
    }
    *changed = PQgetvalue(result, 0, 0)[0] == 't';
    PQclear(result);
    return 0;
}

int
store_admin_resume(PGconn *conn, const char *queue, const char *key, bool *changed,
                   int64_t *keys_still_paused, struct outbox_error *err)
{
    const char *params[2] = {queue, key};
    PGresult *result = store_admin_exec(conn, resume_sql, 2, params);

    *changed = false;
    *keys_still_paused = 0;
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to resume");
        PQclear(result);
        return -1;
    }
    *changed = PQgetvalue(result, 0, 0)[0] == 't';
    *keys_still_paused = store_admin_int64(result, 0, 1);
    PQclear(result);
    return 0;
}

int
store_admin_paused(PGconn *conn, struct store_pause_list *list, struct outbox_error *err)
{
    if (read_pauses(conn, list, err) < 0) {
        store_pause_list_clear(list);
        return -1;
    }
    return 0;
}

void
store_pause_list_clear(struct store_pause_list *list)
{
    if (list == NULL)
        return;
    for (size_t i = 0; i < list->count; i++) {
        free(list->pauses[i].queue);
        free(list->pauses[i].ordering_key);
        free(list->pauses[i].reason);
        free(list->pauses[i].paused_by);
        free(list->pauses[i].paused_at);
    }
    free(list->pauses);
    memset(list, 0, sizeof(*list));
}

/* ---- replay times -------------------------------------------------------- */

int
store_admin_time_ago(PGconn *conn, int64_t seconds, char *buf, size_t size,
                     struct outbox_error *err)
{
    char seconds_text[24];
    const char *params[1] = {seconds_text};
    PGresult *result;

    snprintf(seconds_text, sizeof(seconds_text), "%lld", (long long)seconds);
    result = store_admin_exec(conn, TIME_AGO_SQL, 1, params);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to read the time");
        PQclear(result);
        return -1;
    }
    snprintf(buf, size, "%s", PQgetvalue(result, 0, 0));
    PQclear(result);
    return 0;
}

int
store_admin_check_time(PGconn *conn, const char *text, struct outbox_error *err)
{
    const char *params[1] = {text};
    PGresult *result = store_admin_exec(conn, check_time_sql, 1, params);
    const char *sqlstate;

    if (PQresultStatus(result) == PGRES_TUPLES_OK) {
        PQclear(result);
        return 0;
    }
    sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    store_admin_fail(err, conn, result, "unable to read the time");
    /* class 22: the text is no time PostgreSQL reads */
    if (sqlstate != NULL && strncmp(sqlstate, "22", 2) == 0)
        err->code = OUTBOX_ERR_INVALID;
    PQclear(result);
    return -1;
}

int
store_admin_status_parts(PGconn *conn, unsigned parts, struct store_status *status,
                         struct outbox_error *err)
{
    if ((parts & STORE_STATUS_TABLE) &&
        (outbox_schema_version(conn, &status->schema_version, err) < 0 ||
         read_table_status(conn, status, err) < 0 ||
         read_oldest_transaction(conn, &status->oldest_transaction, err) < 0))
        return -1;
    if ((parts & STORE_STATUS_BLOCKED) && read_blocked_keys(conn, status, err) < 0)
        return -1;
    if ((parts & STORE_STATUS_BLOCKED_COUNTS) && !(parts & STORE_STATUS_BLOCKED) &&
        read_blocked_counts(conn, status, err) < 0)
        return -1;
    if ((parts & STORE_STATUS_PAUSED) && read_pauses(conn, &status->paused, err) < 0)
        return -1;
    apply_pauses(status);
    return 0;
}
