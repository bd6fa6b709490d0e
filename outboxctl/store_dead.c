/*
 * store_dead.c - the one store of dead rows, for the command line and the
 * console alike: listing them by a filter of queue, ordering key, error
 * text and job ids, and making them ready again or deleting them, one row
 * or many in batches (see store_dead.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "error.h"
#include "store_admin_sql.h"
#include "store_dead.h"

/* clang-format off */

static const char dead_retry_by_id_sql[] =
    "UPDATE outbox.job"
    "   SET state = 'ready', run_at = now(), finished_at = NULL,"
    "       max_attempts = attempts + $3::integer"
    " WHERE state = 'dead'"
    "   AND ($1::text IS NULL OR queue = $1::text)"
    "   AND ($2::bigint IS NULL OR job_id = $2::bigint)";

#define DEAD_FILTER                                                                  \
    " state = 'dead' AND ($1::text IS NULL OR queue = $1::text)"                    \
    " AND ($2::text IS NULL OR ordering_key = $2::text)"                            \
    " AND ($3::text IS NULL OR strpos(lower(last_error), lower($3::text)) > 0)"     \
    " AND ($4::bigint[] IS NULL OR job_id = ANY ($4::bigint[]))"

static const char dead_list_filtered_sql[] =
    "SELECT job_id, queue, ordering_key, attempts, max_attempts, " ISO_UTC("finished_at") ","
    "       last_error,"
    "       CASE WHEN octet_length(payload::text) <= 65536 THEN payload::text"
    "            ELSE to_json(left(payload::text, 65536) || ' [cut]')::text END,"
    "       headers::text"
    "  FROM outbox.job WHERE" DEAD_FILTER
    " ORDER BY queue, job_id LIMIT $5::bigint";

static const char dead_retry_batch_sql[] =
    "WITH picked AS ("
    "    SELECT job_id FROM outbox.job WHERE" DEAD_FILTER " AND job_id > $5::bigint"
    "     ORDER BY job_id LIMIT $6::int FOR UPDATE SKIP LOCKED)"
    " UPDATE outbox.job AS j"
    "    SET state = 'ready', run_at = now(), finished_at = NULL, max_attempts = j.attempts + 1"
    "   FROM picked AS p WHERE j.job_id = p.job_id"
    " RETURNING j.job_id";

static const char dead_delete_batch_sql[] =
    "WITH picked AS ("
    "    SELECT job_id FROM outbox.job WHERE" DEAD_FILTER " AND job_id > $5::bigint"
    "     ORDER BY job_id LIMIT $6::int FOR UPDATE SKIP LOCKED)"
    " DELETE FROM outbox.job AS j USING picked AS p WHERE j.job_id = p.job_id"
    " RETURNING j.job_id";

/* clang-format on */

/* ---- one row or a queue, with extra attempts (dead retry) ---- */

int
store_admin_dead_retry(PGconn *conn, const char *queue, int64_t job_id, int32_t extra_attempts,
                       int64_t *count, struct outbox_error *err)
{
    char job_text[24], extra_text[16];
    const char *params[3] = {queue, job_id > 0 ? job_text : NULL, extra_text};
    PGresult *result;

    *count = 0;
    if (extra_attempts < 1)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "unable to retry dead jobs: extra attempts must be positive");
    snprintf(job_text, sizeof(job_text), "%lld", (long long)job_id);
    snprintf(extra_text, sizeof(extra_text), "%d", (int)extra_attempts);
    result = store_admin_exec(conn, dead_retry_by_id_sql, 3, params);
    if (PQresultStatus(result) != PGRES_COMMAND_OK) {
        store_admin_fail(err, conn, result, "unable to retry dead jobs");
        PQclear(result);
        return -1;
    }
    *count = strtoll(PQcmdTuples(result), NULL, 10);
    PQclear(result);
    return 0;
}

/* ---- by a filter: listing, and batches ---- */

/* "{1,2,3}" for the ids of filter, or NULL when it has none; *failed on out of memory. */
static char *
filter_ids(const struct store_dead_filter *filter, bool *failed)
{
    char *text;

    if (filter->job_count == 0)
        return NULL;
    text = store_admin_id_array(filter->job_ids, filter->job_count);
    if (text == NULL)
        *failed = true;
    return text;
}

static void
fill_dead_job(const PGresult *result, int row, struct store_dead_job *job, bool *failed)
{
    job->job_id = store_admin_int64(result, row, 0);
    job->queue = store_admin_text(result, row, 1, failed);
    job->ordering_key = store_admin_text(result, row, 2, failed);
    job->attempts = (int32_t)store_admin_int64(result, row, 3);
    job->max_attempts = (int32_t)store_admin_int64(result, row, 4);
    job->finished_at = store_admin_text(result, row, 5, failed);
    job->last_error = store_admin_text(result, row, 6, failed);
    job->payload = store_admin_text(result, row, 7, failed);
    job->headers = store_admin_text(result, row, 8, failed);
}

int
store_dead_list(PGconn *conn, const struct store_dead_filter *filter, int64_t limit,
                        struct store_dead_list *list, struct outbox_error *err)
{
    char limit_text[24];
    bool failed = false;
    char *ids = filter_ids(filter, &failed);
    const char *params[5] = {filter->queue, filter->ordering_key, filter->error_text, ids,
                             limit_text};
    PGresult *result;
    int rows;

    memset(list, 0, sizeof(*list));
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    snprintf(limit_text, sizeof(limit_text), "%lld", (long long)limit);
    result = store_admin_exec(conn, dead_list_filtered_sql, 5, params);
    free(ids);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        return store_admin_fail_clear(err, conn, result, "unable to list dead jobs");
    rows = PQntuples(result);
    if (rows > 0 && (list->jobs = calloc((size_t)rows, sizeof(*list->jobs))) == NULL)
        failed = true;
    for (int row = 0; row < rows && !failed; row++) {
        list->count++;
        fill_dead_job(result, row, &list->jobs[row], &failed);
    }
    PQclear(result);
    if (failed) {
        store_dead_list_clear(list);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    return 0;
}

void
store_dead_list_clear(struct store_dead_list *list)
{
    if (list == NULL)
        return;
    for (size_t i = 0; i < list->count; i++) {
        struct store_dead_job *job = &list->jobs[i];

        free(job->queue);
        free(job->ordering_key);
        free(job->finished_at);
        free(job->last_error);
        free(job->payload);
        free(job->headers);
    }
    free(list->jobs);
    memset(list, 0, sizeof(*list));
}

/* Runs sql (a batch statement returning job ids) until a batch finds nothing. */
static int
dead_batches(PGconn *conn, const char *sql, const char *what,
             const struct store_dead_filter *filter, int batch_size,
             store_dead_progress *progress, void *arg, int64_t *count,
             struct outbox_error *err)
{
    char after_text[24] = "0", batch_text[16];
    bool failed = false;
    char *ids = filter_ids(filter, &failed);
    const char *params[6] = {filter->queue, filter->ordering_key, filter->error_text, ids,
                             after_text, batch_text};
    int rc = 0;

    *count = 0;
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    snprintf(batch_text, sizeof(batch_text), "%d", batch_size > 0 ? batch_size : 1);
    for (;;) {
        PGresult *result = store_admin_exec(conn, sql, 6, params);
        int64_t last = 0;
        int rows;

        if (PQresultStatus(result) != PGRES_TUPLES_OK) {
            rc = store_admin_fail_clear(err, conn, result, what);
            break;
        }
        rows = PQntuples(result);
        for (int row = 0; row < rows; row++)
            if (store_admin_int64(result, row, 0) > last)
                last = store_admin_int64(result, row, 0);
        PQclear(result);
        if (rows == 0)
            break;
        *count += rows;
        snprintf(after_text, sizeof(after_text), "%lld", (long long)last);
        if (progress != NULL)
            progress(arg, *count);
    }
    free(ids);
    return rc;
}

int
store_dead_retry(PGconn *conn, const struct store_dead_filter *filter, int batch_size,
                         store_dead_progress *progress, void *arg, int64_t *count,
                         struct outbox_error *err)
{
    return dead_batches(conn, dead_retry_batch_sql, "unable to retry dead jobs", filter,
                        batch_size, progress, arg, count, err);
}

int
store_dead_delete(PGconn *conn, const struct store_dead_filter *filter,
                          int batch_size, store_dead_progress *progress, void *arg,
                          int64_t *count, struct outbox_error *err)
{
    return dead_batches(conn, dead_delete_batch_sql, "unable to delete dead jobs", filter,
                        batch_size, progress, arg, count, err);
}
