/*
 * store_worker.c - the worker protocol on a store: claim, extend, complete,
 * fail and release the rows of a batch, reap expired leases, and sweep the
 * rows an ordering key left waiting.
 *
 * A claim takes rows with a lease under the store's worker id and a
 * generation (the attempt number); every later write names both and is
 * fenced: it changes only rows still owned, and reports which. Claims read
 * the pauses first (a copy at most STORE_PAUSES_MAX_AGE_SECONDS old) and
 * pass them on; a claim that runs after a pause its copy misses, however
 * late, claims nothing (store_statements.c), so no claim takes a row of a
 * pause committed before the claim began. Writes can be sent ahead and
 * collected later, in the order sent.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "store_array.h"
#include "store_exec.h"
#include "store_worker.h"
#include "store_row.h"
#include "timeouts.h"

/* ---- helpers ---------------------------------------------------------------- */

/* Index of job_id in an id-sorted position table, for marking done[]. */
struct position {
    int64_t job_id;
    size_t index;
};

static int
compare_position(const void *a, const void *b)
{
    const struct position *x = a, *y = b;

    return (x->job_id > y->job_id) - (x->job_id < y->job_id);
}

/*
 * Sets done[i] for every row whose job_id the result returned (column 0),
 * and dead[i] from column 1 when dead is not NULL; stores the rows matched
 * in *changed when not NULL. Returns 0, or -1 when out of memory.
 */
static int
mark_returned(const PGresult *result, const int64_t *job_ids, size_t count, bool *done, bool *dead,
              size_t *changed, struct outbox_error *err)
{
    struct position *positions = malloc(count * sizeof(*positions));
    int rows = PQntuples(result);
    size_t matched = 0;

    if (positions == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < count; i++) {
        positions[i].job_id = job_ids[i];
        positions[i].index = i;
        if (done != NULL)
            done[i] = false;
        if (dead != NULL)
            dead[i] = false;
    }
    qsort(positions, count, sizeof(*positions), compare_position);
    for (int r = 0; r < rows; r++) {
        struct position key = {.job_id = strtoll(PQgetvalue(result, r, 0), NULL, 10)};
        struct position *found =
            bsearch(&key, positions, count, sizeof(*positions), compare_position);

        if (found == NULL)
            continue;
        matched++;
        if (done != NULL)
            done[found->index] = true;
        if (dead != NULL && PQnfields(result) > 1)
            dead[found->index] = PQgetvalue(result, r, 1)[0] == 't';
    }
    free(positions);
    if (changed != NULL)
        *changed = matched;
    return 0;
}

/* ---- pauses ---------------------------------------------------------------- */

/*
 * Keeps the pauses of a STMT_PAUSES result, as of read_at: when the statement
 * was sent, not when its result came back (a busy turn may lie between);
 * -1 when out of memory.
 */
static int
pauses_keep(outbox_store *store, const PGresult *result, double read_at, struct outbox_error *err)
{
    struct store_pauses *p = &store->pauses;
    char *queues = strdup(PQgetvalue(result, 0, 1));
    char *key_queues = strdup(PQgetvalue(result, 0, 2));
    char *keys = strdup(PQgetvalue(result, 0, 3));

    if (queues == NULL || key_queues == NULL || keys == NULL) {
        free(queues);
        free(key_queues);
        free(keys);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    free(p->queues);
    free(p->key_queues);
    free(p->keys);
    p->queues = queues;
    p->key_queues = key_queues;
    p->keys = keys;
    p->any = strtoll(PQgetvalue(result, 0, 0), NULL, 10) > 0;
    p->read_at = read_at;
    return 0;
}

/* Reads the pauses now; nothing may be queued. */
int
store_pauses_read(outbox_store *store, struct outbox_error *err)
{
    double sent_at = clock_monotonic_seconds();
    PGresult *result = store_run_prepared(store, STMT_PAUSES, 0, NULL, PGRES_TUPLES_OK,
                                          "unable to read 'outbox.paused'", err);
    int rc;

    if (result == NULL)
        return -1;
    rc = pauses_keep(store, result, sent_at, err);
    PQclear(result);
    return rc;
}

/*
 * Before a claim: pauses older than STORE_PAUSES_MAX_AGE_SECONDS are read
 * again, at once when nothing is queued (an idle relay), else sent ahead of
 * the claim and kept for the next one (a busy relay, one turn later).
 */
static int
pauses_refresh(outbox_store *store, struct outbox_error *err)
{
    struct store_pauses *p = &store->pauses;

    if (p->pending || clock_monotonic_seconds() - p->read_at < STORE_PAUSES_MAX_AGE_SECONDS)
        return 0;
    if (store->queued_count == 0)
        return store_pauses_read(store, err);
    if (store_queue_prepared(store, STMT_PAUSES, 0, NULL, "unable to read 'outbox.paused'",
                             err) != 0)
        return -1;
    p->pending = true;
    p->sent_at = clock_monotonic_seconds();
    return 0;
}

int
outbox_store_refresh_pauses(outbox_store *store, struct outbox_error *err)
{
    if (store->queued_count > 0 || store->pauses.pending ||
        clock_monotonic_seconds() - store->pauses.read_at < STORE_PAUSES_MAX_AGE_SECONDS)
        return 0;
    return store_pauses_read(store, err);
}

/* Collects a read of the pauses sent ahead of the claim being collected. */
static int
pauses_collect(outbox_store *store, struct outbox_error *err)
{
    PGresult *result;
    int rc;

    if (!store->pauses.pending)
        return 0;
    store->pauses.pending = false;
    result = store_collect_prepared(store, STMT_PAUSES, PGRES_TUPLES_OK,
                                    "unable to read 'outbox.paused'", err);
    if (result == NULL)
        return -1;
    rc = pauses_keep(store, result, store->pauses.sent_at, err);
    PQclear(result);
    return rc;
}

/* ---- claim ----------------------------------------------------------------- */

static int
compare_job(const void *a, const void *b)
{
    const struct outbox_job *x = a, *y = b;

    return (x->job_id > y->job_id) - (x->job_id < y->job_id);
}

int
outbox_claim_send(outbox_store *store, const char *const *queues, size_t queue_count, int limit,
                  int lease_seconds, struct outbox_error *err)
{
    char limit_text[16], lease_text[16];
    struct pg_array queue_array = {0};
    const char *values[8];
    enum statement statement;
    int rc, count;

    if (limit <= 0 || lease_seconds <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "claim limit and lease must be positive");
    if (pauses_refresh(store, err) != 0)
        return -1;
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    snprintf(lease_text, sizeof(lease_text), "%d", lease_seconds);
    values[0] = store->worker_id;
    values[1] = limit_text;
    values[2] = lease_text;
    values[3] = store->block_on_dead_head ? "true" : "false";
    if (queue_count > 0) {
        for (size_t i = 0; i < queue_count; i++)
            store_array_add_text(&queue_array, queues[i]);
        if ((values[4] = store_array_finish(&queue_array)) == NULL) {
            store_array_clear(&queue_array);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        }
    }
    count = queue_count > 0 ? 5 : 4;
    if (store->pauses.any) {
        values[count++] = store->pauses.queues;
        values[count++] = store->pauses.key_queues;
        values[count++] = store->pauses.keys;
        statement = queue_count > 0 ? STMT_CLAIM_QUEUES_PAUSED : STMT_CLAIM_ALL_PAUSED;
    } else {
        statement = queue_count > 0 ? STMT_CLAIM_QUEUES : STMT_CLAIM_ALL;
    }
    rc = store_queue_prepared(store, statement, count, values,
                              "unable to claim jobs from 'outbox.job'", err);
    store_array_clear(&queue_array);
    return rc;
}

int
outbox_claim_receive(outbox_store *store, struct outbox_batch *batch, struct outbox_error *err)
{
    PGresult *result;
    int rows;

    memset(batch, 0, sizeof(*batch));
    if (pauses_collect(store, err) != 0)
        return -1;
    result = store_collect_prepared(store, STMT_CLAIM_ALL, PGRES_TUPLES_OK,
                                    "unable to claim jobs from 'outbox.job'", err);
    if (result == NULL)
        return -1;

    rows = PQntuples(result);
    if (rows == 0) {
        PQclear(result);
        return 0;
    }
    batch->jobs = calloc((size_t)rows, sizeof(*batch->jobs));
    if (batch->jobs == NULL) {
        /* the rows stay claimed until their lease expires and the reaper frees them */
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    for (int r = 0; r < rows; r++) {
        store_row_read_job(result, r, &batch->jobs[r]);
        batch->jobs[r].stream_order = store_row_text_or_null(result, r, 12);
        batch->jobs[r].stream_place = store_row_text_or_null(result, r, 13);
    }
    qsort(batch->jobs, (size_t)rows, sizeof(*batch->jobs), compare_job);
    batch->count = (size_t)rows;
    batch->storage = result;
    return 0;
}

int
outbox_claim(outbox_store *store, const char *const *queues, size_t queue_count, int limit,
             int lease_seconds, struct outbox_batch *batch, struct outbox_error *err)
{
    memset(batch, 0, sizeof(*batch));
    if (outbox_claim_send(store, queues, queue_count, limit, lease_seconds, err) != 0)
        return -1;
    return outbox_claim_receive(store, batch, err);
}

void
outbox_batch_release_memory(struct outbox_batch *batch)
{
    if (batch == NULL)
        return;
    PQclear(batch->storage);
    free(batch->jobs);
    memset(batch, 0, sizeof(*batch));
}

/* ---- fenced writes --------------------------------------------------------- */

/* Sends one of the lease-set statements (extend, complete, release) without waiting. */
static int
lease_write_send(outbox_store *store, enum statement statement, const char *context,
                 const struct outbox_lease *leases, size_t count, const char *extra_param,
                 struct outbox_error *err)
{
    struct pg_array ids = {0}, generations = {0};
    const char *values[4];
    int rc;

    if (count == 0)
        return 0;
    for (size_t i = 0; i < count; i++) {
        store_array_add_int(&ids, (long long)leases[i].job_id);
        store_array_add_int(&generations, (long long)leases[i].generation);
    }
    values[0] = store->worker_id;
    values[1] = store_array_finish(&ids);
    values[2] = store_array_finish(&generations);
    values[3] = extra_param;
    if (values[1] == NULL || values[2] == NULL)
        rc = outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    else
        rc = store_queue_prepared(store, statement, extra_param ? 4 : 3, values, context, err);
    store_array_clear(&ids);
    store_array_clear(&generations);
    return rc;
}

/*
 * Collects the result of a fenced write sent for the rows job_ids[0..count-1]
 * and marks done[] (and dead[]).
 */
static int
fenced_write_receive(outbox_store *store, enum statement statement, const char *context,
                     const int64_t *job_ids, size_t count, bool *done, bool *dead,
                     size_t *changed, struct outbox_error *err)
{
    PGresult *result;
    int rc;

    if (changed != NULL)
        *changed = 0;
    if (count == 0)
        return 0;
    result = store_collect_prepared(store, statement, PGRES_TUPLES_OK, context, err);
    if (result == NULL)
        return -1;
    rc = mark_returned(result, job_ids, count, done, dead, changed, err);
    PQclear(result);
    return rc;
}

/* fenced_write_receive() for a lease set. */
static int
lease_write_receive(outbox_store *store, enum statement statement, const char *context,
                    const struct outbox_lease *leases, size_t count, bool *done, size_t *changed,
                    struct outbox_error *err)
{
    int64_t *job_ids = malloc((count > 0 ? count : 1) * sizeof(*job_ids));
    int rc;

    if (job_ids == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < count; i++)
        job_ids[i] = leases[i].job_id;
    rc = fenced_write_receive(store, statement, context, job_ids, count, done, NULL, changed, err);
    free(job_ids);
    return rc;
}

/* Runs one of the lease-set statements and waits for it. */
static int
fenced_lease_write(outbox_store *store, enum statement statement, const char *context,
                   const struct outbox_lease *leases, size_t count, const char *extra_param,
                   bool *done, size_t *changed, struct outbox_error *err)
{
    if (lease_write_send(store, statement, context, leases, count, extra_param, err) != 0)
        return -1;
    return lease_write_receive(store, statement, context, leases, count, done, changed, err);
}

int
outbox_extend(outbox_store *store, const struct outbox_lease *leases, size_t count,
              int lease_seconds, bool *done, size_t *changed, struct outbox_error *err)
{
    char lease_text[16];

    if (lease_seconds <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "lease must be positive");
    snprintf(lease_text, sizeof(lease_text), "%d", lease_seconds);
    return fenced_lease_write(store, STMT_EXTEND, "unable to extend leases", leases, count,
                              lease_text, done, changed, err);
}

#define COMPLETE_CONTEXT "unable to mark jobs succeeded"

/* The complete statement of the store's --on-success mode. */
static enum statement
complete_statement(const outbox_store *store)
{
    return store->delete_on_success ? STMT_COMPLETE_DELETE : STMT_COMPLETE;
}

int
outbox_complete(outbox_store *store, const struct outbox_lease *leases, size_t count, bool *done,
                size_t *changed, struct outbox_error *err)
{
    return fenced_lease_write(store, complete_statement(store), COMPLETE_CONTEXT, leases, count,
                              NULL, done, changed, err);
}

int
outbox_complete_send(outbox_store *store, const struct outbox_lease *leases, size_t count,
                     struct outbox_error *err)
{
    return lease_write_send(store, complete_statement(store), COMPLETE_CONTEXT, leases, count, NULL,
                            err);
}

int
outbox_complete_receive(outbox_store *store, const struct outbox_lease *leases, size_t count,
                        bool *done, size_t *changed, struct outbox_error *err)
{
    return lease_write_receive(store, complete_statement(store), COMPLETE_CONTEXT, leases, count,
                               done, changed, err);
}

#define RELEASE_CONTEXT "unable to release jobs"

int
outbox_release(outbox_store *store, const struct outbox_lease *leases, size_t count, bool *done,
               size_t *changed, struct outbox_error *err)
{
    return fenced_lease_write(store, STMT_RELEASE, RELEASE_CONTEXT, leases, count, NULL, done,
                              changed, err);
}

int
outbox_release_send(outbox_store *store, const struct outbox_lease *leases, size_t count,
                    struct outbox_error *err)
{
    return lease_write_send(store, STMT_RELEASE, RELEASE_CONTEXT, leases, count, NULL, err);
}

int
outbox_release_receive(outbox_store *store, const struct outbox_lease *leases, size_t count,
                       bool *done, size_t *changed, struct outbox_error *err)
{
    return lease_write_receive(store, STMT_RELEASE, RELEASE_CONTEXT, leases, count, done, changed,
                               err);
}

#define FAIL_CONTEXT "unable to record failed jobs"

int
outbox_fail_send(outbox_store *store, const struct outbox_failure *failures, size_t count,
                 struct outbox_error *err)
{
    struct pg_array ids = {0}, generations = {0}, errors = {0}, delays = {0}, permanent = {0};
    const char *values[7];
    int rc;

    if (count == 0)
        return 0;
    for (size_t i = 0; i < count; i++) {
        store_array_add_int(&ids, (long long)failures[i].job_id);
        store_array_add_int(&generations, (long long)failures[i].generation);
        store_array_add_text(&errors, failures[i].error ? failures[i].error : "");
        store_array_add_double(&delays,
                               failures[i].retry_seconds > 0 ? failures[i].retry_seconds : 0.0);
        store_array_add_bool(&permanent, failures[i].permanent);
    }
    values[0] = store->worker_id;
    values[1] = store_array_finish(&ids);
    values[2] = store_array_finish(&generations);
    values[3] = store_array_finish(&errors);
    values[4] = store_array_finish(&delays);
    values[5] = store_array_finish(&permanent);
    values[6] = store->block_on_dead_head ? "true" : "false";
    if (values[1] == NULL || values[2] == NULL || values[3] == NULL || values[4] == NULL ||
        values[5] == NULL)
        rc = outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    else
        rc = store_queue_prepared(store, STMT_FAIL, 7, values, FAIL_CONTEXT, err);
    store_array_clear(&ids);
    store_array_clear(&generations);
    store_array_clear(&errors);
    store_array_clear(&delays);
    store_array_clear(&permanent);
    return rc;
}

int
outbox_fail_receive(outbox_store *store, const struct outbox_failure *failures, size_t count,
                    bool *done, bool *dead, size_t *changed, struct outbox_error *err)
{
    int64_t *job_ids = malloc((count > 0 ? count : 1) * sizeof(*job_ids));
    int rc;

    if (job_ids == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < count; i++)
        job_ids[i] = failures[i].job_id;
    rc = fenced_write_receive(store, STMT_FAIL, FAIL_CONTEXT, job_ids, count, done, dead, changed,
                              err);
    free(job_ids);
    return rc;
}

int
outbox_fail(outbox_store *store, const struct outbox_failure *failures, size_t count, bool *done,
            bool *dead, size_t *changed, struct outbox_error *err)
{
    if (outbox_fail_send(store, failures, count, err) != 0)
        return -1;
    return outbox_fail_receive(store, failures, count, done, dead, changed, err);
}

/* ---- reaping and the sweep of waiting rows ---------------------------------- */

int
outbox_reap(outbox_store *store, int limit, double retry_seconds, struct outbox_reap_result *out,
            struct outbox_error *err)
{
    char limit_text[16], delay_text[32];
    const char *values[2] = {limit_text, delay_text};
    PGresult *result;

    memset(out, 0, sizeof(*out));
    if (limit <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "reap limit must be positive");
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    snprintf(delay_text, sizeof(delay_text), "%.3f", retry_seconds > 0 ? retry_seconds : 0.0);
    result = store_run_prepared(store, STMT_REAP, 2, values, PGRES_TUPLES_OK,
                                "unable to reap expired leases", err);
    if (result == NULL)
        return -1;
    for (int r = 0; r < PQntuples(result); r++) {
        if (PQgetvalue(result, r, 0)[0] == 't')
            out->dead++;
        else
            out->ready++;
    }
    PQclear(result);
    return 0;
}

int
outbox_release_waiting(outbox_store *store, int key_limit, size_t *released,
                       struct outbox_error *err)
{
    char limit_text[16];
    const char *values[4];
    PGresult *result;
    long long looked_at;

    *released = 0;
    if (key_limit <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "sweep limit must be positive");
    snprintf(limit_text, sizeof(limit_text), "%d", key_limit);
    values[0] = limit_text;
    values[1] = store->sweep_queue ? store->sweep_queue : "";
    values[2] = store->sweep_key ? store->sweep_key : "";
    values[3] = store->block_on_dead_head ? "true" : "false";
    result = store_run_prepared(store, STMT_SWEEP_HELD, 4, values, PGRES_TUPLES_OK,
                                "unable to release waiting rows", err);
    if (result == NULL)
        return -1;
    *released = (size_t)strtoull(PQgetvalue(result, 0, 0), NULL, 10);
    looked_at = strtoll(PQgetvalue(result, 0, 1), NULL, 10);
    free(store->sweep_queue);
    free(store->sweep_key);
    store->sweep_queue = NULL;
    store->sweep_key = NULL;
    /* a short round reached the end: the next one starts over */
    if (looked_at >= key_limit && !PQgetisnull(result, 0, 2)) {
        store->sweep_queue = strdup(PQgetvalue(result, 0, 2));
        store->sweep_key = strdup(PQgetvalue(result, 0, 3));
    }
    PQclear(result);
    return 0;
}
