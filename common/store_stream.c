/*
 * store_stream.c - stream partitions: leases, the gap-free read, the cursor.
 *
 * Statements (store_stream_sql.c) are prepared once per connection and
 * take bound parameters only. See store_stream.h for the rules.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "error.h"
#include "pg_bounded.h"
#include "store_row.h"
#include "store_stream.h"
#include "store_stream_sql.h"
#include "timeouts.h"

struct stream_store {
    PGconn *conn;
    char *owner;
    bool borrowed; /* the caller's connection: left open by stream_store_free, and each
                    * statement waited for within STORE_STATEMENT_DEADLINE_MS */
};

/* ---- helpers ------------------------------------------------------------------- */

/*
 * Fills err for a failed statement; a borrowed connection's statement that
 * got no result within its deadline is a timeout (the caller drops it).
 */
static int
bounded_error(PGconn *conn, bool bounded, const PGresult *result, const char *context,
              struct outbox_error *err)
{
    if (result == NULL && bounded && PQstatus(conn) == CONNECTION_OK)
        return outbox_error_set(err, OUTBOX_ERR_TIMEOUT,
                                "%s: the database did not answer within %d s (server stalled or"
                                " unreachable); dropping the connection",
                                context, STORE_STATEMENT_DEADLINE_MS / 1000);
    return outbox_error_from_pg(err, conn, result, context);
}

static int
stream_error(stream_store *s, const PGresult *result, const char *context, struct outbox_error *err)
{
    return bounded_error(s->conn, s->borrowed, result, context, err);
}

/*
 * Runs a prepared statement; NULL with err unless it returned expected. A
 * broken connection is reset here so the next call starts afresh.
 */
static PGresult *
run_stream_statement(stream_store *s, enum stream_statement statement, int nparams,
                     const char *const *values, ExecStatusType expected, const char *context,
                     struct outbox_error *err)
{
    const char *name = stream_statements[statement].name;
    PGresult *result = s->borrowed ? pg_exec_prepared_bounded(s->conn, name, nparams, values,
                                                              STORE_STATEMENT_DEADLINE_MS)
                                   : PQexecPrepared(s->conn, name, nparams, values, NULL, NULL, 0);

    if (result != NULL && PQresultStatus(result) == expected)
        return result;
    stream_error(s, result, context, err);
    PQclear(result);
    return NULL;
}

/* A partition's fence as parameters $1..$4. */
struct fence_values {
    char partition[16];
    char generation[24];
};

static void
fence_values(const struct stream_partition *p, struct fence_values *v)
{
    snprintf(v->partition, sizeof(v->partition), "%d", p->partition);
    snprintf(v->generation, sizeof(v->generation), "%lld", (long long)p->generation);
}

/* ---- connection ---------------------------------------------------------------- */

/* Prepares every stream statement on the store's connection. */
static int
prepare_stream_statements(stream_store *s, struct outbox_error *err)
{
    for (int i = 0; i < SSTMT_COUNT; i++) {
        char context[96];
        PGresult *result;

        snprintf(context, sizeof(context), "unable to prepare '%s'", stream_statements[i].name);
        if (!s->borrowed)
            result =
                PQprepare(s->conn, stream_statements[i].name, stream_statements[i].sql, 0, NULL);
        else if (PQsendPrepare(s->conn, stream_statements[i].name, stream_statements[i].sql, 0,
                               NULL) &&
                 PQflush(s->conn) == 0)
            result = pg_result_bounded(s->conn, STORE_STATEMENT_DEADLINE_MS);
        else
            result = NULL;
        if (PQresultStatus(result) != PGRES_COMMAND_OK) {
            stream_error(s, result, context, err);
            if (err != NULL && err->code == OUTBOX_ERR_INTERNAL)
                err->code = OUTBOX_ERR_SCHEMA; /* before migration 009 */
            PQclear(result);
            return -1;
        }
        PQclear(result);
    }
    return 0;
}

int
stream_store_use_generic_plans(stream_store *s, struct outbox_error *err)
{
    PGresult *result = pg_exec_bounded(s->conn, "SET plan_cache_mode = force_generic_plan", 0,
                                       NULL, STORE_STATEMENT_DEADLINE_MS);

    if (PQresultStatus(result) != PGRES_COMMAND_OK) {
        stream_error(s, result, "unable to set up the stream session", err);
        PQclear(result);
        return -1;
    }
    PQclear(result);
    return 0;
}

stream_store *
stream_store_borrow(PGconn *conn, const char *owner, bool prepare, struct outbox_error *err)
{
    stream_store *s = calloc(1, sizeof(*s));

    if (s == NULL || (s->owner = strdup(owner)) == NULL) {
        free(s);
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    s->conn = conn;
    s->borrowed = true;
    if (prepare && prepare_stream_statements(s, err) != 0) {
        stream_store_free(s);
        return NULL;
    }
    return s;
}

void
stream_store_free(stream_store *s)
{
    if (s == NULL)
        return;
    if (s->conn != NULL && !s->borrowed)
        PQfinish(s->conn);
    free(s->owner);
    free(s);
}

bool
stream_place_format(char *out, const char *xid, int64_t job_id)
{
    out[0] = '\0';
    if (job_id < 0)
        return false;
    snprintf(out, STREAM_PLACE_SIZE, "%020llu%019lld", strtoull(xid, NULL, 10),
             (long long)job_id);
    return true;
}

/* ---- leases -------------------------------------------------------------------- */

int
stream_store_acquire(stream_store *s, const char *queues, int modulus, int residue,
                     double lease_seconds, struct stream_partition *out, size_t capacity,
                     size_t *count, struct outbox_error *err)
{
    char lease[32], limit[24], modulus_text[16], residue_text[16];
    const char *values[6] = {s->owner, lease, limit, queues, modulus_text, residue_text};
    PGresult *result;
    int rows;

    *count = 0;
    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    snprintf(limit, sizeof(limit), "%zu", capacity);
    snprintf(modulus_text, sizeof(modulus_text), "%d", modulus > 0 ? modulus : 1);
    snprintf(residue_text, sizeof(residue_text), "%d", residue);
    result = run_stream_statement(s, SSTMT_ACQUIRE, 6, values, PGRES_TUPLES_OK,
                                  "unable to acquire stream partitions", err);
    if (result == NULL)
        return -1;
    rows = PQntuples(result);
    for (int r = 0; r < rows && (size_t)r < capacity; r++) {
        struct stream_partition *p = &out[r];

        store_row_copy_cell(p->queue, sizeof(p->queue), result, r, 0);
        p->partition = (int)strtol(PQgetvalue(result, r, 1), NULL, 10);
        p->generation = strtoll(PQgetvalue(result, r, 2), NULL, 10);
        store_row_copy_cell(p->cursor_xid, sizeof(p->cursor_xid), result, r, 3);
        p->cursor_job_id = strtoll(PQgetvalue(result, r, 4), NULL, 10);
        store_row_copy_cell(p->order, sizeof(p->order), result, r, 5);
        p->history_epoch = (int32_t)strtol(PQgetvalue(result, r, 6), NULL, 10);
        p->ahead = strcmp(PQgetvalue(result, r, 7), "t") == 0;
        (*count)++;
    }
    PQclear(result);
    return 0;
}

int
stream_store_member(stream_store *s, const char *queues, double lease_seconds,
                    struct outbox_error *err)
{
    char lease[32];
    const char *values[3] = {s->owner, lease, queues};
    PGresult *result;

    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    result = run_stream_statement(s, SSTMT_MEMBER, 3, values, PGRES_COMMAND_OK,
                                  "unable to renew this relay's stream membership", err);
    if (result == NULL)
        return -1;
    PQclear(result);
    return 0;
}

int
stream_store_pending(stream_store *s, const char *queues, bool *pending, struct outbox_error *err)
{
    const char *values[1] = {queues};
    PGresult *result = run_stream_statement(s, SSTMT_PENDING, 1, values, PGRES_TUPLES_OK,
                                            "unable to look for stream rows to publish", err);

    if (result == NULL)
        return -1;
    *pending = PQntuples(result) == 1 && strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    return 0;
}

int
stream_store_leave(stream_store *s, struct outbox_error *err)
{
    const char *values[1] = {s->owner};
    PGresult *result = run_stream_statement(s, SSTMT_LEAVE, 1, values, PGRES_COMMAND_OK,
                                            "unable to end this relay's stream membership", err);

    if (result == NULL)
        return -1;
    PQclear(result);
    return 0;
}

int
stream_store_surplus(stream_store *s, const struct stream_partition *held, size_t count,
                     bool *give_back, struct outbox_error *err)
{
    const char *values[1] = {s->owner};
    PGresult *result = run_stream_statement(s, SSTMT_SURPLUS, 1, values, PGRES_TUPLES_OK,
                                            "unable to count this relay's stream partitions", err);

    if (result == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        give_back[i] = false;
        for (int r = 0; r < PQntuples(result) && !give_back[i]; r++)
            give_back[i] = strcmp(PQgetvalue(result, r, 0), held[i].queue) == 0 &&
                           strtol(PQgetvalue(result, r, 1), NULL, 10) == held[i].partition;
    }
    PQclear(result);
    return 0;
}

/* Whether a cursor's row carries its ahead flag (a renewal) or not (a rebase). */
enum cursor_read { CURSOR_WITH_AHEAD, CURSOR_ALONE };

/* Reads a cursor (xid, job id, history epoch[, ahead]) from row 0 of result into p. */
static void
cursor_from(const PGresult *result, struct stream_partition *p, enum cursor_read read)
{
    store_row_copy_cell(p->cursor_xid, sizeof(p->cursor_xid), result, 0, 0);
    p->cursor_job_id = strtoll(PQgetvalue(result, 0, 1), NULL, 10);
    p->history_epoch = (int32_t)strtol(PQgetvalue(result, 0, 2), NULL, 10);
    p->ahead = read == CURSOR_WITH_AHEAD && strcmp(PQgetvalue(result, 0, 3), "t") == 0;
}

int
stream_store_renew(stream_store *s, struct stream_partition *p, double lease_seconds, bool reload,
                   bool *held, struct outbox_error *err)
{
    struct fence_values v;
    char lease[32];
    const char *values[5] = {s->owner, p->queue, v.partition, v.generation, lease};
    PGresult *result;

    fence_values(p, &v);
    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    result = run_stream_statement(s, SSTMT_RENEW, 5, values, PGRES_TUPLES_OK,
                                  "unable to renew a stream partition lease", err);
    if (result == NULL)
        return -1;
    *held = PQntuples(result) == 1;
    if (*held && reload)
        cursor_from(result, p, CURSOR_WITH_AHEAD);
    PQclear(result);
    return 0;
}

int
stream_store_rebase(stream_store *s, struct stream_partition *p, int32_t epoch, bool *held,
                    struct stream_rebase_report *report, struct outbox_error *err)
{
    struct fence_values v;
    char epoch_text[16];
    const char *values[5] = {s->owner, p->queue, v.partition, v.generation, epoch_text};
    PGresult *result;

    fence_values(p, &v);
    snprintf(epoch_text, sizeof(epoch_text), "%d", (int)epoch);
    result = run_stream_statement(
        s, SSTMT_REBASE, 5, values, PGRES_TUPLES_OK,
        "unable to rebase a stream partition onto this database's history", err);
    if (result == NULL) {
        if (err != NULL && strcmp(err->sqlstate, "55000") == 0)
            err->code = OUTBOX_ERR_STATE;
        return -1;
    }
    *held = PQntuples(result) == 1;
    if (*held) {
        cursor_from(result, p, CURSOR_ALONE);
        report->places_kept = strcmp(PQgetvalue(result, 0, 3), "t") == 0;
        report->keys_reset = (int)strtol(PQgetvalue(result, 0, 4), NULL, 10);
        report->levels = (int)strtol(PQgetvalue(result, 0, 5), NULL, 10);
    }
    PQclear(result);
    return 0;
}

int
stream_store_release(stream_store *s, const struct stream_partition *p, struct outbox_error *err)
{
    struct fence_values v;
    const char *values[4] = {s->owner, p->queue, v.partition, v.generation};
    PGresult *result;

    fence_values(p, &v);
    result = run_stream_statement(s, SSTMT_RELEASE, 4, values, PGRES_COMMAND_OK,
                                  "unable to release a stream partition", err);
    if (result == NULL)
        return -1;
    PQclear(result);
    return 0;
}

/* ---- read and advance ------------------------------------------------------------ */

/* Points batch's jobs into result (rows in the read's column order). */
static int
batch_fill(struct stream_batch *batch, PGresult *result, struct outbox_error *err)
{
    int rows = PQntuples(result);

    batch->jobs = calloc((size_t)rows, sizeof(*batch->jobs));
    batch->xids = calloc((size_t)rows, sizeof(*batch->xids));
    batch->froms = calloc((size_t)rows, sizeof(*batch->froms));
    if (batch->jobs == NULL || batch->xids == NULL || batch->froms == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (int r = 0; r < rows; r++) {
        store_row_read_job(result, r, &batch->jobs[r]);
        batch->xids[r] = PQgetvalue(result, r, 12);
        batch->froms[r] = PQgetisnull(result, r, 13) ? NULL : PQgetvalue(result, r, 13);
    }
    batch->count = (size_t)rows;
    batch->storage = result;
    return 0;
}

int
stream_store_read_send(stream_store *s, const struct stream_partition *p, const char *after_xid,
                       int64_t after_job_id, int limit, struct outbox_error *err)
{
    char partition[16], job_id[24], limit_text[16], generation[24];
    const char *values[7] = {p->queue, partition, after_xid, job_id, limit_text, s->owner,
                             generation};

    snprintf(partition, sizeof(partition), "%d", p->partition);
    snprintf(job_id, sizeof(job_id), "%lld", (long long)after_job_id);
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    snprintf(generation, sizeof(generation), "%lld", (long long)p->generation);
    if (PQsendQueryPrepared(s->conn, stream_statements[SSTMT_READ].name, 7, values, NULL, NULL,
                            0) != 1)
        return outbox_error_from_pg(err, s->conn, NULL, "unable to read a stream partition");
    return 0;
}

int
stream_store_read_receive(stream_store *s, struct stream_batch *batch, struct outbox_error *err)
{
    PGresult *result = NULL, *next;
    int rc = 0;

    memset(batch, 0, sizeof(*batch));
    /* every result of the query is taken, so the connection is free afterwards */
    if (s->borrowed)
        result = pg_result_bounded(s->conn, STORE_STATEMENT_DEADLINE_MS);
    while (!s->borrowed && (next = PQgetResult(s->conn)) != NULL) {
        if (result == NULL)
            result = next;
        else
            PQclear(next);
    }
    if (result == NULL || PQresultStatus(result) != PGRES_TUPLES_OK) {
        rc = stream_error(s, result, "unable to read a stream partition", err);
        PQclear(result);
        return rc;
    }
    if (PQntuples(result) == 0) {
        PQclear(result);
        return 0;
    }
    if (batch_fill(batch, result, err) != 0) {
        PQclear(result);
        stream_batch_release_memory(batch);
        return -1;
    }
    return 0;
}

int
stream_store_read(stream_store *s, const struct stream_partition *p, int limit,
                  struct stream_batch *batch, struct outbox_error *err)
{
    memset(batch, 0, sizeof(*batch));
    if (stream_store_read_send(s, p, p->cursor_xid, p->cursor_job_id, limit, err) != 0)
        return -1;
    return stream_store_read_receive(s, batch, err);
}

int
stream_store_key_has_later(stream_store *s, const struct stream_partition *p, const char *xid,
                           int64_t job_id, const char *key, bool *later, struct outbox_error *err)
{
    char partition[16], job_id_text[24];
    const char *values[5] = {p->queue, partition, xid, job_id_text, key};
    PGresult *result;

    snprintf(partition, sizeof(partition), "%d", p->partition);
    snprintf(job_id_text, sizeof(job_id_text), "%lld", (long long)job_id);
    result = run_stream_statement(s, SSTMT_KEY_LATER, 5, values, PGRES_TUPLES_OK,
                                  "unable to look for a key's later stream rows", err);
    if (result == NULL)
        return -1;
    *later = PQntuples(result) == 1 && strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    return 0;
}

int
stream_store_row_held(stream_store *s, const char *place, const char *uid, bool *held,
                      struct outbox_error *err)
{
    return stream_row_held(s->conn, place, uid, held, err);
}

int
stream_row_held(PGconn *conn, const char *place, const char *uid, bool *held,
                struct outbox_error *err)
{
    char xid[24], job_id[24];
    const char *values[3] = {job_id, uid, xid};
    PGresult *result;

    *held = false;
    if (strlen(place) != STREAM_PLACE_SIZE - 1)
        return 0; /* no place of this stream: nothing holds it */
    snprintf(xid, sizeof(xid), "%.20s", place);
    snprintf(job_id, sizeof(job_id), "%s", place + 20);
    result = pg_exec_bounded(conn, stream_sql_row_held, 3, values, STORE_STATEMENT_DEADLINE_MS);
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        bounded_error(conn, true, result,
                      "unable to look for the row a broker's order record names", err);
        PQclear(result);
        return -1;
    }
    *held = PQntuples(result) == 1 && strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    return 0;
}

void
stream_batch_release_memory(struct stream_batch *batch)
{
    if (batch == NULL)
        return;
    PQclear(batch->storage);
    free(batch->jobs);
    free(batch->xids);
    free(batch->froms);
    memset(batch, 0, sizeof(*batch));
}

/* The refused rows as five array literals ($8..$12). */
struct refusal_arrays {
    struct buffer ids, errors, permanent, delays, stay;
};

static int
refusal_arrays_build(struct refusal_arrays *a, const struct stream_refusal *refused, size_t count)
{
    struct buffer *all[] = {&a->ids, &a->errors, &a->permanent, &a->delays, &a->stay};

    for (size_t i = 0; i < 5; i++)
        buffer_putc(all[i], '{');
    for (size_t i = 0; i < count; i++) {
        const char *sep = i == 0 ? "" : ",";

        buffer_printf(&a->ids, "%s%lld", sep, (long long)refused[i].job_id);
        buffer_printf(&a->errors, "%s\"", sep);
        for (const char *c = refused[i].error != NULL ? refused[i].error : ""; *c != '\0'; c++) {
            if (*c == '"' || *c == '\\')
                buffer_putc(&a->errors, '\\');
            buffer_putc(&a->errors, *c);
        }
        buffer_putc(&a->errors, '"');
        buffer_printf(&a->permanent, "%s%s", sep, refused[i].permanent ? "t" : "f");
        buffer_printf(&a->delays, "%s%.3f", sep, refused[i].delay_seconds);
        buffer_printf(&a->stay, "%s%s", sep, refused[i].stay ? "t" : "f");
    }
    for (size_t i = 0; i < 5; i++) {
        buffer_putc(all[i], '}');
        if (all[i]->failed)
            return -1;
    }
    return 0;
}

static void
refusal_arrays_free(struct refusal_arrays *a)
{
    buffer_clear(&a->ids);
    buffer_clear(&a->errors);
    buffer_clear(&a->permanent);
    buffer_clear(&a->delays);
    buffer_clear(&a->stay);
}

int
stream_store_advance(stream_store *s, struct stream_partition *p, const char *xid, int64_t job_id,
                     const struct stream_refusal *refused, size_t count, double lease_seconds,
                     bool *held, struct outbox_error *err)
{
    struct fence_values v;
    struct refusal_arrays a = {0};
    char lease[32], job_text[24];
    PGresult *result = NULL;
    int rc = -1;

    *held = false;
    fence_values(p, &v);
    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    snprintf(job_text, sizeof(job_text), "%lld", (long long)job_id);
    if (refusal_arrays_build(&a, refused, count) != 0) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    {
        const char *values[12] = {s->owner,     p->queue,       v.partition,   v.generation,
                                  lease,        xid,            job_text,      a.ids.data,
                                  a.errors.data, a.permanent.data, a.delays.data, a.stay.data};

        result = run_stream_statement(s, SSTMT_ADVANCE, 12, values, PGRES_TUPLES_OK,
                                      "unable to advance a stream cursor", err);
    }
    if (result == NULL)
        goto cleanup;
    *held = strcmp(PQgetvalue(result, 0, 0), "1") == 0;
    if (*held) {
        snprintf(p->cursor_xid, sizeof(p->cursor_xid), "%s", xid);
        p->cursor_job_id = job_id;
    }
    rc = 0;

cleanup:
    PQclear(result);
    refusal_arrays_free(&a);
    return rc;
}

/* ---- figures and cleanup --------------------------------------------------------- */

int
stream_store_lag(stream_store *s, struct stream_lag **out, size_t *count, struct outbox_error *err)
{
    return stream_lag_read(run_stream_statement(s, SSTMT_LAG, 0, NULL, PGRES_TUPLES_OK,
                                                "unable to read the stream lag", err),
                           out, count, err);
}

int
stream_store_horizon(stream_store *s, struct stream_horizon *out, struct outbox_error *err)
{
    return stream_horizon_read(run_stream_statement(s, SSTMT_HORIZON, 0, NULL, PGRES_TUPLES_OK,
                                                    "unable to read the transaction horizon", err),
                               out);
}

int
stream_store_cleanup(stream_store *s, double retention_seconds, int limit, size_t *deleted,
                     struct outbox_error *err)
{
    char retention[32], limit_text[16];
    const char *values[2] = {retention, limit_text};
    PGresult *result;

    *deleted = 0;
    snprintf(retention, sizeof(retention), "%.3f", retention_seconds);
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    result = run_stream_statement(s, SSTMT_CLEANUP, 2, values, PGRES_COMMAND_OK,
                                  "unable to delete published stream rows", err);
    if (result == NULL)
        return -1;
    *deleted = (size_t)strtoull(PQcmdTuples(result), NULL, 10);
    PQclear(result);
    return 0;
}

int
stream_store_key_cleanup(stream_store *s, int limit, size_t *deleted, struct outbox_error *err)
{
    char limit_text[16];
    const char *values[1] = {limit_text};
    PGresult *result;

    *deleted = 0;
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    result = run_stream_statement(s, SSTMT_KEY_CLEANUP, 1, values, PGRES_COMMAND_OK,
                                  "unable to delete the places of stream ordering keys", err);
    if (result == NULL)
        return -1;
    *deleted = (size_t)strtoull(PQcmdTuples(result), NULL, 10);
    PQclear(result);
    return 0;
}
