/*
 * store_batch.c - the statements of outboxctl that run in batches: purge
 * (through the relays' own cleanup batches), replay and inbox purge. One
 * loop, run_batches(), drives them all: every batch is its own short
 * transaction, so locks stay short and what was done is kept when a later
 * batch fails; the caller's progress callback hears of every batch. Each
 * range (cutoff) is fixed before the first batch, so the loops end.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "store_admin.h"
#include "store_admin_sql.h"
#include "timeouts.h"


/* clang-format off */

/* The end of a replay's range: until, or now when later or not given. */
static const char replay_cutoff_sql[] =
    "SELECT " EXACT_TIME("least(coalesce($1::timestamptz, 'infinity'), now())");

/*
 * What a replay selects, by state, in one read: rows by id ($4) or, for a
 * time range, rows finished in [$2, $3): succeeded and dead ones, since
 * ready and running rows have not finished. The last column counts the ids
 * not found. A stream row counts as succeeded once its partition's cursor
 * passed it, finished when it was created (a cursor keeps no time per
 * row), and as ready before that.
 */
static const char replay_count_sql[] =
    "WITH r AS ("
    "    SELECT queue, state, ordering_key, job_id, finished_at FROM outbox.job"
    "     WHERE queue = $1 AND state <> 'stream'"
    "    UNION ALL"
    "    SELECT j.queue, CASE WHEN (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)"
    "                         THEN 'succeeded' ELSE 'ready' END,"
    "           j.ordering_key, j.job_id, j.created_at"
    "      FROM outbox.job AS j JOIN outbox.stream_cursor AS c"
    "        ON c.queue = j.queue AND c.partition = j.stream_partition"
    "     WHERE j.queue = $1 AND j.state = 'stream')"
    "SELECT count(*) FILTER (WHERE state = 'succeeded'),"
    "       count(*) FILTER (WHERE state = 'ready'),"
    "       count(*) FILTER (WHERE state = 'running'),"
    "       count(*) FILTER (WHERE state = 'dead'),"
    "       (SELECT count(DISTINCT i) FROM unnest($4::bigint[]) AS i) - count(*)"
    "  FROM r"
    " WHERE queue = $1 AND ($5::text IS NULL OR ordering_key = $5)"
    "   AND CASE WHEN $4::bigint[] IS NULL"
    "            THEN state IN ('succeeded', 'dead') AND finished_at < $3::timestamptz"
    "                 AND ($2::timestamptz IS NULL OR finished_at >= $2::timestamptz)"
    "            ELSE job_id = ANY ($4::bigint[]) AND (state <> 'succeeded' OR finished_at < $3::timestamptz) END";

/*
 * One replay batch: up to $8 succeeded rows after the cursor ($6, $7) in
 * finish order (job_succeeded_idx), locked, made ready again. A row of an
 * ordering key waits (held) unless it is the first of its key in the batch
 * and no earlier row of its key is unfinished; the statement's snapshot
 * still sees the batch's rows as succeeded, hence the first-of-key test.
 * Returns the rows changed and the new cursor (NULL: nothing left).
 */
static const char replay_batch_sql[] =
    "WITH picked AS MATERIALIZED ("
    "    SELECT job_id, ordering_key, finished_at FROM outbox.job"
    "     WHERE state = 'succeeded' AND queue = $1 AND finished_at < $3::timestamptz"
    "       AND ($2::timestamptz IS NULL OR finished_at >= $2::timestamptz)"
    "       AND ($4::bigint[] IS NULL OR job_id = ANY ($4::bigint[]))"
    "       AND ($5::text IS NULL OR ordering_key = $5)"
    "       AND ($6::timestamptz IS NULL OR (finished_at, job_id) > ($6::timestamptz, $7::bigint))"
    "     ORDER BY finished_at, job_id"
    "     LIMIT $8::integer"
    "       FOR UPDATE),"
    " firsts AS ("
    "    SELECT ordering_key, min(job_id) AS job_id FROM picked"
    "     WHERE ordering_key IS NOT NULL GROUP BY ordering_key),"
    " replayed AS ("
    "    UPDATE outbox.job AS j"
    "       SET state = 'ready', run_at = now(), finished_at = NULL, replays = j.replays + 1,"
    "           max_attempts = j.attempts + j.max_attempts,"
    "           held = j.ordering_key IS NOT NULL AND ("
    "               j.job_id <> (SELECT f.job_id FROM firsts AS f WHERE f.ordering_key = j.ordering_key)"
    "               OR EXISTS (SELECT 1 FROM outbox.job AS e"
    "                           WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key"
    "                             AND e.job_id < j.job_id AND e.state IN ('ready', 'running')))"
    "      FROM picked AS p WHERE j.job_id = p.job_id"
    "    RETURNING j.job_id)"
    " SELECT (SELECT count(*) FROM replayed), " EXACT_TIME("last.finished_at") ", last.job_id"
    "   FROM (SELECT 1) AS one LEFT JOIN ("
    "        SELECT finished_at, job_id FROM picked"
    "         ORDER BY finished_at DESC, job_id DESC LIMIT 1) AS last ON true";

/*
 * One replay batch of a stream queue: up to $6 stream rows behind their
 * partition's cursor, created in [$2, $3), in read order, leave the stream
 * for the row-state path as ready rows, under the rule of replay_batch_sql
 * for ordering keys. The cursor stays: the rows after it are published by
 * the stream as before. Returns the rows changed.
 */
static const char replay_stream_batch_sql[] =
    "WITH picked AS MATERIALIZED ("
    "    SELECT j.job_id, j.ordering_key FROM outbox.job AS j"
    "      JOIN outbox.stream_cursor AS c ON c.queue = j.queue AND c.partition = j.stream_partition"
    "     WHERE j.state = 'stream' AND j.queue = $1"
    "       AND (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)"
    "       AND j.created_at < $3::timestamptz"
    "       AND ($2::timestamptz IS NULL OR j.created_at >= $2::timestamptz)"
    "       AND ($4::bigint[] IS NULL OR j.job_id = ANY ($4::bigint[]))"
    "       AND ($5::text IS NULL OR j.ordering_key = $5)"
    "     ORDER BY j.xid, j.job_id"
    "     LIMIT $6::integer"
    "       FOR UPDATE OF j),"
    " firsts AS ("
    "    SELECT ordering_key, min(job_id) AS job_id FROM picked"
    "     WHERE ordering_key IS NOT NULL GROUP BY ordering_key),"
    " replayed AS ("
    "    UPDATE outbox.job AS j"
    "       SET state = 'ready', stream_partition = NULL, stream_from = NULL, run_at = now(),"
    "           finished_at = NULL,"
    "           replays = j.replays + 1, max_attempts = j.attempts + j.max_attempts,"
    "           held = j.ordering_key IS NOT NULL AND ("
    "               j.job_id <> (SELECT f.job_id FROM firsts AS f WHERE f.ordering_key = j.ordering_key)"
    "               OR EXISTS (SELECT 1 FROM outbox.job AS e"
    "                           WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key"
    "                             AND e.job_id < j.job_id AND e.state IN ('ready', 'running')))"
    "      FROM picked AS p WHERE j.job_id = p.job_id"
    "    RETURNING j.job_id)"
    " SELECT count(*) FROM replayed";

static const char inbox_purge_sql[] =
    "WITH doomed AS ("
    "    SELECT consumer, message_id FROM outbox.inbox"
    "     WHERE accepted_at < $1::timestamptz"
    "     ORDER BY accepted_at"
    "     LIMIT $2::integer"
    "       FOR UPDATE SKIP LOCKED)"
    " DELETE FROM outbox.inbox AS i USING doomed AS d"
    "  WHERE i.consumer = d.consumer AND i.message_id = d.message_id";

/* The keyed inbox's marks (migration 008) of keys not accepted since the cutoff. */
static const char inbox_key_purge_sql[] =
    "WITH doomed AS ("
    "    SELECT consumer, ordering_key FROM outbox.inbox_key"
    "     WHERE accepted_at < $1::timestamptz"
    "     ORDER BY accepted_at"
    "     LIMIT $2::integer"
    "       FOR UPDATE SKIP LOCKED)"
    " DELETE FROM outbox.inbox_key AS k USING doomed AS d"
    "  WHERE k.consumer = d.consumer AND k.ordering_key = d.ordering_key";

/* clang-format on */

/* ---- batched statements -------------------------------------------------- */

/*
 * One batch of a batched statement, in its own transaction: stores the rows
 * it did in *rows (also when it fails after they were committed) and sets
 * *more when rows may be left. Returns 0 or -1.
 */
typedef int batch_step_fn(PGconn *conn, void *state, int64_t *rows, bool *more,
                          struct outbox_error *err);

/*
 * The one batch loop of purge, inbox purge and replay: runs step until it
 * says nothing is left, adding its rows to *total and telling progress after
 * every batch. Each batch commits on its own, so locks stay short and
 * progress is kept; *total holds what was done, also on failure.
 */
static int
run_batches(PGconn *conn, batch_step_fn *step, void *state, const struct store_progress *progress,
            int64_t *total, struct outbox_error *err)
{
    bool more = true;

    while (more) {
        int64_t rows = 0;
        int rc = step(conn, state, &rows, &more, err);

        *total += rows;
        if (progress != NULL && progress->batch_done != NULL && (rc == 0 || rows > 0))
            progress->batch_done(progress->arg, *total);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* A retention purge in progress: its fixed cutoff and batch size. */
struct purge_state {
    const char *cutoff;
    int batch_size;
};

static int
purge_step(PGconn *conn, void *state, int64_t *rows, bool *more, struct outbox_error *err)
{
    const struct purge_state *purge = state;
    struct outbox_cleanup_result cleaned;

    if (outbox_cleanup_batch(conn, purge->cutoff, purge->batch_size, &cleaned, err) < 0)
        return -1;
    *rows = (int64_t)cleaned.deleted;
    if (!cleaned.locked) {
        /* a relay's cleanup batch runs: wait for its turn */
        usleep(STORE_ADMIN_PURGE_LOCKED_WAIT_US);
        *more = true;
        return 0;
    }
    *more = cleaned.deleted >= (size_t)purge->batch_size;
    return 0;
}

int
store_admin_purge(PGconn *conn, int64_t older_than_seconds, int batch_size,
                  const struct store_progress *progress, int64_t *count, struct outbox_error *err)
{
    char cutoff[64];
    struct purge_state purge = {cutoff, batch_size};

    *count = 0;
    if (older_than_seconds < 0 || batch_size < 1)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "unable to purge succeeded jobs: bad age or batch size");
    if (outbox_cleanup_cutoff(conn, (double)older_than_seconds, cutoff, sizeof(cutoff), err) < 0)
        return -1;
    return run_batches(conn, purge_step, &purge, progress, count, err);
}

/* A replay in progress: the request, its fixed range and the cursor of the last batch. */
struct replay_state {
    const struct store_replay_request *request;
    const char *ids;   /* "{1,2}" or NULL */
    char *cutoff;      /* the end of the range, fixed at the start */
    char *cursor_time; /* finished_at, job_id of the last row taken; NULL: none yet */
    char *cursor_id;
    char batch_text[16];
};

/* Fixes the end of the range: until, or now when later or not given. */
static int
replay_cutoff(PGconn *conn, struct replay_state *replay, struct outbox_error *err)
{
    const struct store_replay_request *request = replay->request;
    const char *params[1] = {request->job_count > 0 ? NULL : request->until};
    PGresult *result = store_admin_exec(conn, replay_cutoff_sql, 1, params);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to replay jobs");
        PQclear(result);
        return -1;
    }
    replay->cutoff = strdup(PQgetvalue(result, 0, 0));
    PQclear(result);
    if (replay->cutoff == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

/* Counts what the replay selects, by state; with dry_run, that is all it does. */
static int
replay_count(PGconn *conn, const struct replay_state *replay, struct store_replay_result *out,
             struct outbox_error *err)
{
    const struct store_replay_request *request = replay->request;
    const char *since = request->job_count > 0 ? NULL : request->since;
    const char *params[5] = {request->queue, since, replay->cutoff, replay->ids,
                             request->ordering_key};
    PGresult *result = store_admin_exec(conn, replay_count_sql, 5, params);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to replay jobs");
        PQclear(result);
        return -1;
    }
    out->ready = store_admin_int64(result, 0, 1);
    out->running = store_admin_int64(result, 0, 2);
    out->dead = store_admin_int64(result, 0, 3);
    out->missing = request->job_count > 0 ? store_admin_int64(result, 0, 4) : 0;
    if (request->dry_run)
        out->replayed = store_admin_int64(result, 0, 0);
    PQclear(result);
    return 0;
}

/* Moves the cursor to the last row of the batch in result; false when out of memory. */
static bool
replay_move_cursor(struct replay_state *replay, const PGresult *result)
{
    free(replay->cursor_time);
    free(replay->cursor_id);
    replay->cursor_time = strdup(PQgetvalue(result, 0, 1));
    replay->cursor_id = strdup(PQgetvalue(result, 0, 2));
    return replay->cursor_time != NULL && replay->cursor_id != NULL;
}

static int
replay_step(PGconn *conn, void *state, int64_t *rows, bool *more, struct outbox_error *err)
{
    struct replay_state *replay = state;
    const struct store_replay_request *request = replay->request;
    const char *since = request->job_count > 0 ? NULL : request->since;
    const char *params[8] = {request->queue,        since,
                             replay->cutoff,        replay->ids,
                             request->ordering_key, replay->cursor_time,
                             replay->cursor_id,     replay->batch_text};
    PGresult *result = store_admin_exec(conn, replay_batch_sql, 8, params);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
        goto fail;
    *rows = store_admin_int64(result, 0, 0);
    *more = !PQgetisnull(result, 0, 1);
    if (!*more) {
        PQclear(result);
        return 0;
    }
    if (!replay_move_cursor(replay, result)) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    PQclear(result);
    /* relays waiting on the channel take the batch at once */
    result = PQexec(conn, "NOTIFY outbox_job");
    if (PQresultStatus(result) != PGRES_COMMAND_OK)
        goto fail;
    PQclear(result);
    return 0;

fail:
    store_admin_fail(err, conn, result, "unable to replay jobs");
    PQclear(result);
    return -1;
}

/* One batch of a stream queue's published rows; they leave the stream, so no cursor is kept. */
static int
replay_stream_step(PGconn *conn, void *state, int64_t *rows, bool *more, struct outbox_error *err)
{
    struct replay_state *replay = state;
    const struct store_replay_request *request = replay->request;
    const char *since = request->job_count > 0 ? NULL : request->since;
    const char *params[6] = {request->queue, since, replay->cutoff, replay->ids,
                             request->ordering_key, replay->batch_text};
    PGresult *result = store_admin_exec(conn, replay_stream_batch_sql, 6, params);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
        goto fail;
    *rows = store_admin_int64(result, 0, 0);
    *more = *rows >= request->batch_size;
    PQclear(result);
    if (*rows == 0)
        return 0;
    result = PQexec(conn, "NOTIFY outbox_job");
    if (PQresultStatus(result) != PGRES_COMMAND_OK)
        goto fail;
    PQclear(result);
    return 0;

fail:
    store_admin_fail(err, conn, result, "unable to replay stream rows");
    PQclear(result);
    return -1;
}

int
store_admin_replay(PGconn *conn, const struct store_replay_request *request,
                   struct store_replay_result *out, struct outbox_error *err)
{
    struct replay_state replay = {.request = request};
    char *ids = NULL;
    int rc = -1;

    memset(out, 0, sizeof(*out));
    if (request->queue == NULL || request->batch_size < 1)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "unable to replay: bad request");
    snprintf(replay.batch_text, sizeof(replay.batch_text), "%d", request->batch_size);
    if (request->job_count > 0 &&
        (ids = store_admin_id_array(request->job_ids, request->job_count)) == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    replay.ids = ids;
    if (replay_cutoff(conn, &replay, err) < 0 || replay_count(conn, &replay, out, err) < 0)
        goto cleanup;
    if (request->dry_run)
        rc = 0;
    else if (run_batches(conn, replay_step, &replay, request->progress, &out->replayed, err) ==
             0)
        rc = run_batches(conn, replay_stream_step, &replay, request->progress, &out->replayed,
                         err);

cleanup:
    free(ids);
    free(replay.cutoff);
    free(replay.cursor_time);
    free(replay.cursor_id);
    return rc;
}

/* ---- inbox ---------------------------------------------------------------- */

/* An inbox purge in progress: the table it deletes from (0 inbox, 1 inbox_key, 2 done). */
struct inbox_purge_state {
    const char *cutoff;
    char batch_text[16];
    int batch_size;
    int table;
};

static int
inbox_purge_step(PGconn *conn, void *state, int64_t *rows, bool *more, struct outbox_error *err)
{
    struct inbox_purge_state *purge = state;
    const char *params[2] = {purge->cutoff, purge->batch_text};
    PGresult *result = store_admin_exec(
        conn, purge->table == 0 ? inbox_purge_sql : inbox_key_purge_sql, 2, params);

    if (PQresultStatus(result) != PGRES_COMMAND_OK) {
        store_admin_fail(err, conn, result, "unable to purge the inbox");
        PQclear(result);
        return -1;
    }
    *rows = strtoll(PQcmdTuples(result), NULL, 10);
    PQclear(result);
    if (*rows < purge->batch_size)
        purge->table++;
    *more = purge->table < 2;
    return 0;
}

int
store_admin_inbox_purge(PGconn *conn, int64_t older_than_seconds, int batch_size,
                        const struct store_progress *progress, int64_t *count,
                        struct outbox_error *err)
{
    char seconds_text[24];
    const char *cutoff_params[1] = {seconds_text};
    struct inbox_purge_state purge = {.batch_size = batch_size};
    char *cutoff;
    PGresult *result;
    int rc;

    *count = 0;
    if (older_than_seconds < 0 || batch_size < 1)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "unable to purge the inbox: bad age or batch size");
    snprintf(seconds_text, sizeof(seconds_text), "%lld", (long long)older_than_seconds);
    snprintf(purge.batch_text, sizeof(purge.batch_text), "%d", batch_size);
    result = store_admin_exec(conn, TIME_AGO_SQL, 1, cutoff_params);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        store_admin_fail(err, conn, result, "unable to purge the inbox");
        PQclear(result);
        return -1;
    }
    cutoff = strdup(PQgetvalue(result, 0, 0));
    PQclear(result);
    if (cutoff == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    purge.cutoff = cutoff;
    rc = run_batches(conn, inbox_purge_step, &purge, progress, count, err);
    free(cutoff);
    return rc;
}
