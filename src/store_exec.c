/*
 * store_exec.c - running the prepared statements within the deadline.
 *
 * Every wait on the server is bounded by STORE_STATEMENT_DEADLINE_MS on our
 * side, for a server that stopped answering. Statements are sent one at a
 * time, or queued in libpq's pipeline mode and collected in the order sent;
 * with nothing queued the connection is out of pipeline mode. Rules: this
 * file calls only the statement table, never the connect path or a caller.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "pg_wait.h"
#include "store_exec.h"

/* ---- running statements ---------------------------------------------------- */

/*
 * Waits until the next result can be read without blocking, for at most
 * STORE_STATEMENT_DEADLINE_MS: libpq itself would wait for ever on a
 * server that stopped answering (a stopped backend, a frozen host whose
 * kernel still acknowledges); the wait is pg_wait_result(), shared with the
 * relay's own connections. On expiry the error is a transient
 * OUTBOX_ERR_TIMEOUT: the caller drops the connection and makes a new one,
 * and rows claimed meanwhile come back after their lease.
 */
int
store_await_result(outbox_store *store, const char *context, struct outbox_error *err)
{
    if (PQflush(store->conn) < 0)
        return outbox_error_from_pg(err, store->conn, NULL, context);
    switch (pg_wait_result(store->conn, clock_monotonic_ms() + STORE_STATEMENT_DEADLINE_MS)) {
    case PG_WAIT_READY:
        return 0;
    case PG_WAIT_TIMEOUT:
        return outbox_error_set(err, OUTBOX_ERR_TIMEOUT,
                                "%s: the database did not answer within %d s (server stalled"
                                " or unreachable); dropping the connection",
                                context, STORE_STATEMENT_DEADLINE_MS / 1000);
    case PG_WAIT_CLOSED:
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "%s: database connection is closed",
                                context);
    case PG_WAIT_FAILED:
        break;
    }
    return outbox_error_from_pg(err, store->conn, NULL, context);
}

/*
 * Collects the results of a statement sent outside pipeline mode within the
 * deadline and returns the last one (libpq's PQexec does the same without a
 * deadline), or NULL with err.
 */
PGresult *
store_await_last_result(outbox_store *store, const char *context, struct outbox_error *err)
{
    PGresult *last = NULL, *next;

    for (;;) {
        if (store_await_result(store, context, err) != 0) {
            PQclear(last);
            return NULL;
        }
        next = PQgetResult(store->conn);
        if (next == NULL)
            break;
        PQclear(last);
        last = next;
    }
    if (last == NULL)
        outbox_error_from_pg(err, store->conn, NULL, context);
    return last;
}

/* Runs sql (one or more statements, no parameters) within the deadline; its last result. */
PGresult *
store_exec_bounded(outbox_store *store, const char *sql, const char *context,
                   struct outbox_error *err)
{
    if (!PQsendQuery(store->conn, sql)) {
        outbox_error_from_pg(err, store->conn, NULL, context);
        return NULL;
    }
    return store_await_last_result(store, context, err);
}

/* A failed Prepare's error: the statement does not fit this database's schema. */
static int
prepare_failed(outbox_store *store, enum statement statement, const PGresult *result,
               struct outbox_error *err)
{
    char context[96];

    snprintf(context, sizeof(context), "unable to prepare '%s'", store_statements[statement].name);
    outbox_error_from_pg(err, store->conn, result, context);
    if (err != NULL && err->code == OUTBOX_ERR_INTERNAL)
        err->code = OUTBOX_ERR_SCHEMA;
    store->prepared[statement] = false;
    return -1;
}

/*
 * Statements are prepared at their first run on a connection, or all at
 * connect (outbox_store_connect()): a short visit of a list's idle database
 * parses only the few it runs.
 */
int
store_prepare(outbox_store *store, enum statement statement, struct outbox_error *err)
{
    const struct store_statement *s = &store_statements[statement];
    const char *sql = s->sql;
    PGresult *result;
    int rc = 0;

    if (store->prepared[statement])
        return 0;
#ifdef OUTBOX_MUTANTS
    sql = store_mutant_sql(statement, sql);
#endif
    if (!PQsendPrepare(store->conn, s->name, sql, 0, NULL))
        return prepare_failed(store, statement, NULL, err);
    result = store_await_last_result(store, "unable to prepare a statement", err);
    if (result == NULL)
        return -1;
    if (PQresultStatus(result) != PGRES_COMMAND_OK)
        rc = prepare_failed(store, statement, result, err);
    else
        store->prepared[statement] = true;
    PQclear(result);
    return rc;
}

/* Runs a prepared statement, checking for the expected result status. */
PGresult *
store_run_prepared(outbox_store *store, enum statement statement, int nparams,
                   const char *const *values, ExecStatusType expected, const char *context,
                   struct outbox_error *err)
{
    PGresult *result;

    /* a first run: its Prepare and itself in one round trip */
    if (!store->prepared[statement] && store->queued_count == 0)
        return store_queue_prepared(store, statement, nparams, values, context, err) == 0
                   ? store_collect_prepared(store, statement, expected, context, err)
                   : NULL;
    if (store_prepare(store, statement, err) != 0)
        return NULL;
    if (!PQsendQueryPrepared(store->conn, store_statements[statement].name, nparams, values, NULL,
                             NULL, 0)) {
        outbox_error_from_pg(err, store->conn, NULL, context);
        return NULL;
    }
    result = store_await_last_result(store, context, err);
    if (result != NULL && PQresultStatus(result) != expected) {
        outbox_error_from_pg(err, store->conn, result, context);
        PQclear(result);
        return NULL;
    }
    return result;
}

/*
 * Queued statements. store_queue_prepared() sends a statement without waiting:
 * the connection enters libpq's pipeline mode and a Sync follows the
 * statement, so it runs and commits as its own transaction while the caller
 * does something else; a statement not prepared yet has its Prepare sent
 * just ahead of it, within the same Sync. store_collect_prepared() waits for the oldest queued
 * statement's result; results come back in the order sent. With nothing
 * queued the connection leaves pipeline mode, so the plain calls work again.
 */
int
store_queue_prepared(outbox_store *store, enum statement statement, int nparams,
                     const char *const *values, const char *context, struct outbox_error *err)
{
    const struct store_statement *s = &store_statements[statement];
    bool prepare = !store->prepared[statement];

    if (store->queued_count == STORE_QUEUE_MAX)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "%s: too many statements queued", context);
    if (PQpipelineStatus(store->conn) == PQ_PIPELINE_OFF && !PQenterPipelineMode(store->conn))
        return outbox_error_from_pg(err, store->conn, NULL, context);
    if (prepare && !PQsendPrepare(store->conn, s->name, s->sql, 0, NULL))
        return outbox_error_from_pg(err, store->conn, NULL, context);
    store->prepared[statement] = true; /* a second run queued behind it needs no Prepare */
    if (!PQsendQueryPrepared(store->conn, store_statements[statement].name, nparams, values, NULL,
                             NULL, 0) ||
        !PQpipelineSync(store->conn))
        return outbox_error_from_pg(err, store->conn, NULL, context);
    store->queued[store->queued_count] = statement;
    store->queued_prepare[store->queued_count++] = prepare;
    return 0;
}

/* Whether a statement is one of the claims (claim_receive collects whichever was sent). */
static bool
is_claim(enum statement statement)
{
    return statement == STMT_CLAIM_ALL || statement == STMT_CLAIM_QUEUES ||
           statement == STMT_CLAIM_ALL_PAUSED || statement == STMT_CLAIM_QUEUES_PAUSED;
}

/*
 * Reads the results of a Prepare sent ahead of a queued statement: its status
 * (its error, when it failed, in *failed: the statement after it is then
 * skipped by the server), then the end of its results. 0, or -1 with err.
 */
static int
collect_prepare(outbox_store *store, const char *context, PGresult **failed,
                struct outbox_error *err)
{
    PGresult *result, *end;

    if (store_await_result(store, context, err) != 0)
        return -1;
    result = PQgetResult(store->conn);
    if (store_await_result(store, context, err) != 0) {
        PQclear(result);
        return -1;
    }
    end = PQgetResult(store->conn);
    PQclear(end);
    if (PQresultStatus(result) == PGRES_COMMAND_OK)
        PQclear(result);
    else
        *failed = result;
    return 0;
}

/* Takes the oldest entry off the queue; false when it is not statement (any claim for a claim). */
static bool
dequeue(outbox_store *store, enum statement statement, bool *prepare, const char *context,
        struct outbox_error *err)
{
    if (store->queued_count == 0 ||
        (store->queued[0] != statement && !(is_claim(statement) && is_claim(store->queued[0])))) {
        outbox_error_set(
            err, OUTBOX_ERR_INVALID, "%s: results collected out of order (%s)", context,
            store->queued_count > 0 ? "another statement was sent first" : "nothing was sent");
        return false;
    }
    *prepare = store->queued_prepare[0];
    store->queued_count--;
    memmove(store->queued, store->queued + 1, (size_t)store->queued_count * sizeof(*store->queued));
    memmove(store->queued_prepare, store->queued_prepare + 1,
            (size_t)store->queued_count * sizeof(*store->queued_prepare));
    return true;
}

/* statement is the one queued first (any claim stands for every claim). */
PGresult *
store_collect_prepared(outbox_store *store, enum statement statement, ExecStatusType expected,
                       const char *context, struct outbox_error *err)
{
    PGresult *result, *extra, *prepare_error = NULL;
    enum statement sent = store->queued_count > 0 ? store->queued[0] : statement;
    bool prepare;

    if (!dequeue(store, statement, &prepare, context, err) ||
        (prepare && collect_prepare(store, context, &prepare_error, err) != 0))
        return NULL;
    if (store_await_result(store, context, err) != 0) {
        PQclear(prepare_error);
        return NULL;
    }
    result = PQgetResult(store->conn);
    /* the statement's results end with NULL, then comes its Sync */
    for (;;) {
        if (store_await_result(store, context, err) != 0) {
            PQclear(result);
            PQclear(prepare_error);
            return NULL;
        }
        if ((extra = PQgetResult(store->conn)) == NULL)
            break;
        PQclear(extra);
    }
    if (store_await_result(store, context, err) != 0) {
        PQclear(result);
        PQclear(prepare_error);
        return NULL;
    }
    extra = PQgetResult(store->conn);
    if (prepare_error != NULL || PQresultStatus(result) != expected ||
        PQresultStatus(extra) != PGRES_PIPELINE_SYNC) {
        if (prepare_error != NULL)
            prepare_failed(store, sent, prepare_error, err);
        else
            outbox_error_from_pg(err, store->conn,
                                 PQresultStatus(result) != expected ? result : extra, context);
        PQclear(result);
        PQclear(extra);
        PQclear(prepare_error);
        return NULL;
    }
    PQclear(extra);
    if (store->queued_count == 0 && !PQexitPipelineMode(store->conn)) {
        outbox_error_from_pg(err, store->conn, NULL, context);
        PQclear(result);
        return NULL;
    }
    return result;
}
