/*
 * store_maintenance.c - retention cleanup and the samples of the table, the
 * backlog and the oldest open transaction.
 *
 * On a store every statement here goes through the prepared,
 * deadline-bounded path of the worker protocol, so the relay's maintenance
 * never waits on a stalled server longer than any other statement. The
 * cleanup and the table sample also run on a caller's connection for
 * `outboxctl`, with the same SQL. Cleanup batches are short transactions
 * that take the cleanup advisory lock first, so at most one runs in the
 * whole database at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "store_exec.h"

#define CLEANUP_CONTEXT "unable to delete old succeeded jobs"
#define TABLE_SAMPLE_CONTEXT "unable to read the size of 'outbox.job'"

/* ---- retention cleanup and the table sample ------------------------------- */

/* Where a maintenance statement runs: on store when set, else on conn. */
struct target {
    outbox_store *store;
    PGconn *conn;
};

/* Runs a statement of store_statements[] that returns one row; NULL with err. */
static PGresult *
maintenance_one_row(const struct target *target, enum statement statement, int nparams,
                    const char *const *values, const char *context, struct outbox_error *err)
{
    PGconn *conn = target->store != NULL ? target->store->conn : target->conn;
    PGresult *result;

    if (target->store != NULL) {
        result = store_run_prepared(target->store, statement, nparams, values, PGRES_TUPLES_OK,
                                    context, err);
        if (result == NULL)
            return NULL;
    } else {
        result = PQexecParams(conn, store_statements[statement].sql, nparams, NULL, values, NULL,
                              NULL, 0);
    }
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, context);
        PQclear(result);
        return NULL;
    }
    return result;
}

static int
cleanup_cutoff(const struct target *target, double older_than_seconds, char *cutoff, size_t size,
               struct outbox_error *err)
{
    char seconds_text[32];
    const char *values[1] = {seconds_text};
    PGresult *result;

    if (older_than_seconds < 0 || size == 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, CLEANUP_CONTEXT ": negative age");
    snprintf(seconds_text, sizeof(seconds_text), "%.3f", older_than_seconds);
    result = maintenance_one_row(target, STMT_CLEANUP_CUTOFF, 1, values, CLEANUP_CONTEXT, err);
    if (result == NULL)
        return -1;
    if (strlen(PQgetvalue(result, 0, 0)) >= size) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, CLEANUP_CONTEXT ": cutoff too long");
    }
    snprintf(cutoff, size, "%s", PQgetvalue(result, 0, 0));
    PQclear(result);
    return 0;
}

static int
cleanup_batch(const struct target *target, const char *cutoff, int limit,
              struct outbox_cleanup_result *cleaned, struct outbox_error *err)
{
    char limit_text[16];
    const char *values[2] = {cutoff, limit_text};
    PGresult *result;

    *cleaned = (struct outbox_cleanup_result){0};
    if (limit <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                CLEANUP_CONTEXT ": limit must be positive");
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    result = maintenance_one_row(target, STMT_CLEANUP_BATCH, 2, values, CLEANUP_CONTEXT, err);
    if (result == NULL)
        return -1;
    cleaned->locked = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    cleaned->deleted = (size_t)strtoull(PQgetvalue(result, 0, 1), NULL, 10);
    PQclear(result);
    return 0;
}

static int
sample_table(const struct target *target, double retention_seconds,
             struct outbox_table_sample *sample, struct outbox_error *err)
{
    char retention_text[32];
    const char *values[1] = {retention_text};
    PGresult *result;

    memset(sample, 0, sizeof(*sample));
    snprintf(retention_text, sizeof(retention_text), "%.3f",
             retention_seconds > 0 ? retention_seconds : 0);
    result = maintenance_one_row(target, STMT_TABLE_SAMPLE, 1, values, TABLE_SAMPLE_CONTEXT, err);
    if (result == NULL)
        return -1;
    sample->table_bytes = strtoll(PQgetvalue(result, 0, 0), NULL, 10);
    sample->index_bytes = strtoll(PQgetvalue(result, 0, 1), NULL, 10);
    sample->dead_tuples = strtoll(PQgetvalue(result, 0, 2), NULL, 10);
    sample->succeeded_rows = strtoll(PQgetvalue(result, 0, 3), NULL, 10);
    sample->past_retention_rows = strtoll(PQgetvalue(result, 0, 4), NULL, 10);
    sample->oldest_past_retention_seconds = strtod(PQgetvalue(result, 0, 5), NULL);
    PQclear(result);
    return 0;
}

int
outbox_cleanup_cutoff(PGconn *conn, double older_than_seconds, char *cutoff, size_t size,
                      struct outbox_error *err)
{
    return cleanup_cutoff(&(struct target){.conn = conn}, older_than_seconds, cutoff, size, err);
}

int
outbox_store_cleanup_cutoff(outbox_store *store, double older_than_seconds, char *cutoff,
                            size_t size, struct outbox_error *err)
{
    return cleanup_cutoff(&(struct target){.store = store}, older_than_seconds, cutoff, size, err);
}

int
outbox_cleanup_batch(PGconn *conn, const char *cutoff, int limit,
                     struct outbox_cleanup_result *cleaned, struct outbox_error *err)
{
    return cleanup_batch(&(struct target){.conn = conn}, cutoff, limit, cleaned, err);
}

int
outbox_store_cleanup_batch(outbox_store *store, const char *cutoff, int limit,
                           struct outbox_cleanup_result *cleaned, struct outbox_error *err)
{
    return cleanup_batch(&(struct target){.store = store}, cutoff, limit, cleaned, err);
}

int
outbox_sample_table(PGconn *conn, double retention_seconds, struct outbox_table_sample *sample,
                    struct outbox_error *err)
{
    return sample_table(&(struct target){.conn = conn}, retention_seconds, sample, err);
}

int
outbox_store_sample_table(outbox_store *store, double retention_seconds,
                          struct outbox_table_sample *sample, struct outbox_error *err)
{
    return sample_table(&(struct target){.store = store}, retention_seconds, sample, err);
}

/* ---- observation ----------------------------------------------------------- */

int
outbox_sample_backlog(outbox_store *store,
                      void (*each)(void *arg, const struct outbox_backlog *backlog), void *arg,
                      struct outbox_error *err)
{
    PGresult *result = store_run_prepared(store, STMT_BACKLOG, 0, NULL, PGRES_TUPLES_OK,
                                          "unable to sample the backlog", err);

    if (result == NULL)
        return -1;
    for (int r = 0; r < PQntuples(result); r++) {
        struct outbox_backlog backlog = {
            .queue = PQgetvalue(result, r, 0),
            .ready = strtoll(PQgetvalue(result, r, 1), NULL, 10),
            .oldest_ready_age = strtod(PQgetvalue(result, r, 2), NULL),
            .paused = PQgetvalue(result, r, 3)[0] == 't',
            .paused_keys = strtoll(PQgetvalue(result, r, 4), NULL, 10),
        };

        each(arg, &backlog);
    }
    PQclear(result);
    return 0;
}

int
outbox_sample_horizon(outbox_store *store, struct outbox_horizon *horizon, struct outbox_error *err)
{
    PGresult *result = store_run_prepared(store, STMT_HORIZON, 0, NULL, PGRES_TUPLES_OK,
                                          "unable to sample open transactions", err);

    memset(horizon, 0, sizeof(*horizon));
    if (result == NULL)
        return -1;
    if (PQntuples(result) > 0) {
        horizon->found = true;
        horizon->age_seconds = strtod(PQgetvalue(result, 0, 0), NULL);
        horizon->pid = (int)strtol(PQgetvalue(result, 0, 1), NULL, 10);
        snprintf(horizon->application, sizeof(horizon->application), "%s",
                 PQgetvalue(result, 0, 2));
        snprintf(horizon->state, sizeof(horizon->state), "%s", PQgetvalue(result, 0, 3));
    }
    PQclear(result);
    return 0;
}
