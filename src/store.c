/*
 * store.c - a store's connection: connect in named steps, and run the
 * prepared statements, then hand the store to its callers.
 *
 * The top of the store: the entry points outbox_store_connect(),
 * outbox_store_free() and outbox_store_wait() live here and may call every
 * other store file; none of them calls back. Every wait on the server is
 * bounded: libpq's connect_timeout, TCP keepalives and tcp_user_timeout for
 * a peer gone, the session's statement_timeout and lock_timeout for a slow
 * statement or a lock; running statements is store_exec.c's job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <poll.h>

#include "clock.h"
#include "error.h"
#include "migrate.h"
#include "mutant.h"
#include "store_connect.h"
#include "store_exec.h"
#include "store_privileges.h"
#include "store_worker.h"
#include "timeouts.h"

/* ---- connection ------------------------------------------------------------ */

/*
 * Opens the connection. Defaults come before dbname so the URL's own
 * settings win: connect_timeout bounds the connection; keepalives (3
 * probes, times in timeouts.h) notice a peer that vanished while the
 * connection is idle; tcp_user_timeout drops it when data sent stays
 * unacknowledged (a host gone mid-statement).
 */
static outbox_store *
store_open(const char *database_url, const char *worker_id, struct outbox_error *err)
{
    const char *keywords[] = {"fallback_application_name",
                              "connect_timeout",
                              "keepalives",
                              "keepalives_idle",
                              "keepalives_interval",
                              "keepalives_count",
                              "tcp_user_timeout",
                              "dbname",
                              NULL};
    const char *values[] = {"outbox-relay", TIMEOUT_TEXT(TIMEOUT_DATABASE_CONNECT_SECONDS), "1",
                            TIMEOUT_TEXT(TIMEOUT_DATABASE_KEEPALIVE_IDLE_SECONDS),
                            TIMEOUT_TEXT(TIMEOUT_DATABASE_KEEPALIVE_INTERVAL_SECONDS), "3",
                            TIMEOUT_TEXT(TIMEOUT_DATABASE_UNACKNOWLEDGED_MS), database_url, NULL};
    outbox_store *store = calloc(1, sizeof(*store));

    if (store == NULL || (store->worker_id = strdup(worker_id)) == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        outbox_store_free(store);
        return NULL;
    }
    store->conn = PQconnectdbParams(keywords, values, 1);
    if (store->conn == NULL || PQstatus(store->conn) != CONNECTION_OK) {
        outbox_error_from_connect(err, store->conn, database_url,
                                  "unable to connect to the database");
        /* a refused password is not worth retrying */
        if (store->conn != NULL && strstr(PQerrorMessage(store->conn), "authentication") != NULL)
            err->code = OUTBOX_ERR_CONFIG;
        outbox_store_free(store);
        return NULL;
    }
    return store;
}

/*
 * The session's settings, then what the session can see: whether
 * outbox.job exists, USAGE on the schema, the role, and whether the
 * session is read-only on a primary.
 *
 * The relay's own commits (claim, mark) may be lost in a database crash
 * without losing a message: a lost claim or mark only leads to another
 * publish, which at-least-once delivery allows. Business commits, made on
 * the producers' connections, stay durable.
 *
 * Custom plans: the fenced writes take arrays whose length the planner must
 * see, or after five runs a generic plan that guesses one row turns a
 * 500-row complete into a quadratic join. No JIT: every statement here runs
 * for milliseconds, and a claim the planner costs high (a paused queue
 * holding every ready row, say) spent a second and more compiling.
 */
static const char SQL_SESSION[] =
    "SET synchronous_commit = off; SET statement_timeout = '"
    TIMEOUT_TEXT(STORE_STATEMENT_TIMEOUT_SECONDS) "s';"
    " SET plan_cache_mode = force_custom_plan;"
    " SET lock_timeout = '%dms'; SET jit = off;"
    " SET default_transaction_isolation = 'read committed';"
    /* the catalogs: to_regclass() fails without USAGE */
    " SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c"
    "  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace"
    "  WHERE n.nspname = 'outbox' AND c.relname = 'job'),"
    " has_schema_privilege((SELECT oid FROM pg_catalog.pg_namespace"
    "  WHERE nspname = 'outbox'), 'USAGE'), current_user,"
    /* the role's or the database's default, not a standby's */
    " current_setting('transaction_read_only') = 'on'"
    "  AND NOT pg_catalog.pg_is_in_recovery()";

/*
 * Checks what SQL_SESSION saw. A primary whose sessions are read-only for
 * this role or database (default_transaction_read_only) would fail every
 * claim for ever; a standby is left to the claim's error, which reconnects
 * (failover).
 */
static int
check_session(const PGresult *result, struct outbox_error *err)
{
    char quoted[64];

    if (PQgetvalue(result, 0, 0)[0] != 't')
        return outbox_error_set(err, OUTBOX_ERR_SCHEMA,
                                "table 'outbox.job' not found: run 'outboxctl migrate' first");
    if (PQgetvalue(result, 0, 1)[0] != 't')
        return store_missing_privilege(err, PQgetvalue(result, 0, 2), "USAGE on schema outbox");
    if (PQgetvalue(result, 0, 3)[0] == 't') {
        outbox_error_set(err, OUTBOX_ERR_CONFIG,
                         "sessions of role '%s' are read-only (default_transaction_read_only is"
                         " on for the role or the database): the relay must update outbox.job",
                         outbox_error_quote(quoted, sizeof(quoted), PQgetvalue(result, 0, 2)));
        if (err != NULL)
            memcpy(err->sqlstate, "25006", 6);
        return -1;
    }
    return 0;
}

/*
 * Sets the session up (SQL_SESSION, its lock_timeout lock_timeout_ms, 0 for
 * STORE_STATEMENT_TIMEOUT_SECONDS) and checks what it saw.
 */
static int
set_session(outbox_store *store, int lock_timeout_ms, struct outbox_error *err)
{
    char sql[sizeof(SQL_SESSION) + 16];
    PGresult *result;
    int rc;

    snprintf(sql, sizeof(sql), SQL_SESSION,
             lock_timeout_ms > 0 ? lock_timeout_ms : STORE_STATEMENT_TIMEOUT_SECONDS * 1000);
    result = store_exec_bounded(store, sql, "unable to set up the database session", err);
    if (result == NULL)
        return -1;
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        rc = outbox_error_from_pg(err, store->conn, result,
                                  "unable to set up the database session");
    else
        rc = check_session(result, err);
    PQclear(result);
    return rc;
}

/* Prepares every statement of store_statements[]; a refusal means an old or altered schema. */
static int
prepare_statements(outbox_store *store, struct outbox_error *err)
{
    for (size_t i = 0; i < STMT_COUNT; i++)
        if (store_prepare(store, (enum statement)i, err) != 0)
            return -1;
    return 0;
}

outbox_store *
store_connect(const char *database_url, const char *worker_id,
              const struct store_connect_options *options, struct outbox_error *err)
{
    outbox_store *store;

    if (database_url == NULL || worker_id == NULL || worker_id[0] == '\0') {
        outbox_error_set(err, OUTBOX_ERR_INVALID, "database URL and worker id are required");
        return NULL;
    }
    store = store_open(database_url, worker_id, err);
    if (store == NULL)
        return NULL;
    /*
     * What every turn needs is named now rather than failing a claim later;
     * DELETE (retention) only in outbox_store_check_privileges(), since
     * --retention 0 never deletes. A relay started during a pause must not
     * claim one batch of it, so the pauses are read before the first claim.
     */
    if (set_session(store, options->lock_timeout_ms, err) != 0 ||
        (!options->checked && (outbox_schema_check(store->conn, err) != 0 ||
                               store_check_privileges(store, AUDIT_WITHOUT_DELETE, err) != 0)) ||
        (!options->prepare_lazily && prepare_statements(store, err) != 0) ||
        store_pauses_read(store, err) != 0) {
        outbox_store_free(store);
        return NULL;
    }
#ifdef OUTBOX_MUTANTS
    if (mutant_fires("dead_republished")) /* every dead row out again, to the default route */
        PQclear(PQexec(store->conn, "UPDATE outbox.job SET state = 'ready', attempts = 0,"
                                    " routing_key = NULL, headers = '{}', finished_at = NULL"
                                    " WHERE state = 'dead'"));
#endif
    return store;
}

outbox_store *
outbox_store_connect(const char *database_url, const char *worker_id, struct outbox_error *err)
{
    const struct store_connect_options every_step = {0};

    return store_connect(database_url, worker_id, &every_step, err);
}

void
outbox_store_free(outbox_store *store)
{
    if (store == NULL)
        return;
    PQfinish(store->conn);
    free(store->worker_id);
    free(store->sweep_queue);
    free(store->sweep_key);
    free(store->pauses.queues);
    free(store->pauses.key_queues);
    free(store->pauses.keys);
    free(store);
}

PGconn *
outbox_store_conn(outbox_store *store)
{
    return store->conn;
}

void
outbox_store_set_block_on_dead_head(outbox_store *store, bool block)
{
    store->block_on_dead_head = block;
}

void
outbox_store_set_delete_on_success(outbox_store *store, bool delete_rows)
{
    store->delete_on_success = delete_rows;
}

int
outbox_store_wait(outbox_store *store, int timeout_ms, bool *notified, struct outbox_error *err)
{
    struct pollfd pfd;
    PGnotify *notify;
    int ready;

    *notified = false;
    if (!store->listening) {
        PGresult *result =
            store_exec_bounded(store, "LISTEN outbox_job", "unable to listen on 'outbox_job'", err);

        if (result == NULL)
            return -1;
        if (PQresultStatus(result) != PGRES_COMMAND_OK) {
            outbox_error_from_pg(err, store->conn, result, "unable to listen on 'outbox_job'");
            PQclear(result);
            return -1;
        }
        PQclear(result);
        store->listening = true;
    }

    /* a notification may already have arrived with an earlier result */
    while ((notify = PQnotifies(store->conn)) != NULL) {
        *notified = true;
        PQfreemem(notify);
    }
    if (*notified || timeout_ms <= 0)
        return 0;

    pfd.fd = PQsocket(store->conn);
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (pfd.fd < 0)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "database connection is closed");
    ready = poll(&pfd, 1, timeout_ms);
    if (ready <= 0)
        return 0; /* timeout, or a signal: the caller checks its flags */
    if (!PQconsumeInput(store->conn))
        return outbox_error_from_pg(err, store->conn, NULL, "database connection lost");
    while ((notify = PQnotifies(store->conn)) != NULL) {
        *notified = true;
        PQfreemem(notify);
    }
    /* outbox.resume() notifies: the next claim reads the pauses first */
    if (*notified)
        store->pauses.read_at = 0;
    return 0;
}
