/*
 * store_status.c - the figures of outboxctl status and of the console's
 * overview: jobs per queue and state, table and vacuum figures, the oldest
 * transaction, blocked ordering keys and pauses (see store_admin.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "migrate.h"
#include "store_admin.h"
#include "store_admin_sql.h"
#include "store_database_lease.h"
#include "timeouts.h"

/* clang-format off */

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
 * oldest first; not this session, nor a relay's statistics watch in one of
 * its looks (ten a second, each a short transaction: named as the oldest
 * when nothing else was open). A session under a watch's name whose
 * transaction outlived a look's deadline is no look, and is shown. The
 * stream horizon is the cluster's (a transaction of another database stops
 * every stream too), and a prepared transaction holds it without a session.
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
    "           AND NOT (coalesce(application_name, '') LIKE '" STORE_WATCH_NAME_PREFIX "%'"
    "                    AND xact_start > now() - make_interval(secs => "
    TIMEOUT_TEXT(SCHEDULER_WATCH_DEADLINE_SECONDS) "))"
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

/* clang-format on */

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
        if (PQnfields(result) > 9) /* the console's: the margin of an estimated succeeded */
            queue->succeeded_margin = store_admin_int64(result, row, 9);
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
    void *blocked;
    size_t hint = 0;
    int rows;

    snprintf(limit, sizeof(limit), "%d", STORE_BLOCKED_KEYS_PER_QUEUE);
    result = store_admin_exec(conn, blocked_keys_sql, 1, params);
    rows = store_admin_rows(conn, result, "unable to look for blocked ordering keys", &blocked,
                            sizeof(*status->blocked), err);
    if (rows < 0)
        return -1;
    status->blocked = blocked;
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
        read_blocked_keys(conn, status, err) < 0 || store_admin_paused(conn, &status->paused, err) < 0) {
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
    if ((parts & STORE_STATUS_PAUSED) && store_admin_paused(conn, &status->paused, err) < 0)
        return -1;
    apply_pauses(status);
    return 0;
}
