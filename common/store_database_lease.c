/*
 * store_database_lease.c - see store_database_lease.h.
 */
#include "store_database_lease.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "pg_bounded.h"
#include "timeouts.h"

#define TAKE                                                                                   \
    "SELECT held, paused, wins, owner_watched"                                                 \
    " FROM outbox.database_lease_take($1, $2::integer, $3::text, $4::integer)"
static const char SQL_TAKE[] = TAKE;
/* PostgreSQL 15 and later: the lease's changes reported as soon as the session is idle */
static const char SQL_TAKE_FLUSH[] = TAKE ", pg_catalog.pg_stat_force_next_flush()";
/* migrations 019-023: the watch's role is the caller's */
static const char SQL_TAKE_019[] = "SELECT held, paused, wins, owner_watched"
                                   " FROM outbox.database_lease_take($1, $2::integer, $3::text)";
/* migration 018's form: no watch */
static const char SQL_TAKE_018[] = "SELECT held, paused, false, false"
                                   " FROM outbox.database_lease_take($1, $2::integer)";
static const char SQL_RELEASE[] = "SELECT outbox.database_lease_release($1)";
/* from job_ready_idx (an idle database's ready rows are a few), job_lease_idx and job_held_idx */
#define NEXT_READY                                                                             \
    "SELECT CASE WHEN at IS NULL THEN -1"                                                      \
    "            ELSE greatest(extract(epoch FROM at - now()), 0)::float8 END,"                \
    "       EXISTS (SELECT 1 FROM outbox.job WHERE held)"                                      \
    "  FROM (SELECT least((SELECT min(run_at) FROM outbox.job"                                 \
    "                       WHERE state = 'ready' AND NOT held AND run_at > now()),"           \
    "                     (SELECT min(lease_until) FROM outbox.job WHERE state = 'running'))" \
    "         AS at) AS next"
static const char SQL_NEXT_READY[] = NEXT_READY;
/* PostgreSQL 15 and later: this session's row counts reported as soon as it is idle */
static const char SQL_NEXT_READY_FLUSH[] = NEXT_READY ", pg_catalog.pg_stat_force_next_flush()";

/*
 * Whether a claim would take a row, by the claim's own rules (a dead head
 * blocks its key whatever --block-on-dead-head says), locked rows included:
 * those are what a claim skipped. Among the first 1000 candidates in the
 * claim's order (job_ready_idx), so that a paused queue's million rows cost
 * a thousand: a claimable row behind them is one a claim reaches.
 */
#define CLAIMABLE                                                                              \
    "EXISTS (SELECT 1 FROM (SELECT c.queue, c.ordering_key, c.job_id FROM outbox.job AS c"      \
    "                        WHERE c.state = 'ready' AND NOT c.held AND c.run_at <= now()"      \
    "                          AND ($1::text[] IS NULL OR c.queue = ANY ($1::text[]))"          \
    "                        ORDER BY c.priority DESC, c.run_at, c.job_id LIMIT 1000) AS c"     \
    "         WHERE NOT EXISTS (SELECT 1 FROM outbox.paused AS p WHERE p.queue = c.queue"        \
    "                   AND (p.ordering_key IS NULL OR p.ordering_key = c.ordering_key))"       \
    "           AND (c.ordering_key IS NULL OR NOT EXISTS ("                                    \
    "                SELECT 1 FROM outbox.job AS e"                                             \
    "                 WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key"              \
    "                   AND e.job_id < c.job_id"                                                \
    "                   AND e.state IN ('ready', 'running', 'dead'))))"
#define IDENTITY                                                                               \
    "(SELECT i.database_id FROM outbox.identity AS i),"                                        \
    " (SELECT i.id_form FROM outbox.identity AS i)"
/* the probe alone: no count */
static const char SQL_PROBE[] = "SELECT NULL, NULL, " CLAIMABLE ", " IDENTITY;
/* the ready rows counted, the oldest age as outbox_oldest_ready_age_seconds has it */
static const char SQL_SAMPLE[] =
    "SELECT count(*),"
    "       greatest(coalesce(extract(epoch FROM now()) - extract(epoch FROM"
    "           min(CASE WHEN isfinite(j.run_at) THEN j.run_at"
    "                    WHEN isfinite(j.created_at) THEN j.created_at END)), 0), 0)::float8,"
    "       " CLAIMABLE ", " IDENTITY
    "  FROM outbox.job AS j WHERE j.state = 'ready' AND j.run_at <= now()";

/* Whether result is the error of a function this schema does not have. */
static bool
undefined_function(const PGresult *result)
{
    const char *sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);

    return PQresultStatus(result) == PGRES_FATAL_ERROR && sqlstate != NULL &&
           strcmp(sqlstate, "42883") == 0;
}

/*
 * Runs sql on conn within the store's statement deadline (the slot drops the
 * connection on an error); NULL with err when no result came.
 */
static PGresult *
run_lease_statement(PGconn *conn, const char *sql, int nparams, const char *const *values,
                    const char *context, struct outbox_error *err)
{
    PGresult *result = pg_exec_bounded(conn, sql, nparams, values, STORE_STATEMENT_DEADLINE_MS);

    if (result != NULL)
        return result;
    if (PQstatus(conn) != CONNECTION_OK)
        outbox_error_from_pg(err, conn, NULL, context);
    else
        outbox_error_set(err, OUTBOX_ERR_TIMEOUT,
                         "%s: the database did not answer within %d s (server stalled or"
                         " unreachable); dropping the connection",
                         context, STORE_STATEMENT_DEADLINE_MS / 1000);
    return NULL;
}

/* run_lease_statement() for a statement of one row; NULL with err for anything else. */
static PGresult *
lease_one_row(PGconn *conn, const char *sql, int nparams, const char *const *values,
              const char *context, struct outbox_error *err)
{
    PGresult *result = run_lease_statement(conn, sql, nparams, values, context, err);

    if (result != NULL && (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)) {
        outbox_error_from_pg(err, conn, result, context);
        PQclear(result);
        return NULL;
    }
    return result;
}

int
store_database_lease_take(PGconn *conn, const char *relay_id, int lease_seconds,
                          const char *watch, int watch_pid, struct store_database_lease *lease,
                          struct outbox_error *err)
{
    char seconds[16], pid[16];
    const char *values[4] = {relay_id, seconds, watch, watch_pid > 0 ? pid : NULL};
    PGresult *result;

    snprintf(seconds, sizeof(seconds), "%d", lease_seconds);
    snprintf(pid, sizeof(pid), "%d", watch_pid);
    result = run_lease_statement(conn, PQserverVersion(conn) >= 150000 ? SQL_TAKE_FLUSH : SQL_TAKE,
                                 4, values, "unable to take the database lease", err);
    if (result != NULL && undefined_function(result)) {
        PQclear(result); /* a schema before migration 024 */
        result = run_lease_statement(conn, SQL_TAKE_019, 3, values,
                                     "unable to take the database lease", err);
    }
    if (result != NULL && undefined_function(result)) {
        PQclear(result); /* a schema at migration 018 */
        result = run_lease_statement(conn, SQL_TAKE_018, 2, values,
                                     "unable to take the database lease", err);
    }
    if (result == NULL)
        return -1;
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to take the database lease");
        if (err != NULL && strcmp(err->sqlstate, "42883") == 0) {
            err->code = OUTBOX_ERR_SCHEMA; /* before migration 018 */
            snprintf(err->message, sizeof(err->message),
                     "the database lease is missing (a schema before migration 018):"
                     " run 'outboxctl migrate'");
        }
        PQclear(result);
        return -1;
    }
    lease->held = PQgetvalue(result, 0, 0)[0] == 't';
    lease->paused = PQgetvalue(result, 0, 1)[0] == 't';
    lease->wins = PQgetvalue(result, 0, 2)[0] == 't';
    lease->owner_watched = PQgetvalue(result, 0, 3)[0] == 't';
    PQclear(result);
    return 0;
}

int
store_database_lease_release(PGconn *conn, const char *relay_id, struct outbox_error *err)
{
    const char *values[1] = {relay_id};
    PGresult *result = run_lease_statement(conn, SQL_RELEASE, 1, values,
                                           "unable to release the database lease", err);

    if (result == NULL)
        return -1;
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, "unable to release the database lease");
        PQclear(result);
        return -1;
    }
    PQclear(result);
    return 0;
}

int
store_database_next_ready(PGconn *conn, double *seconds, bool *held, struct outbox_error *err)
{
    PGresult *result =
        lease_one_row(conn, PQserverVersion(conn) >= 150000 ? SQL_NEXT_READY_FLUSH : SQL_NEXT_READY,
                      0, NULL, "unable to read when the next row is due", err);

    if (result == NULL)
        return -1;
    *seconds = atof(PQgetvalue(result, 0, 0));
    *held = strcmp(PQgetvalue(result, 0, 1), "t") == 0;
    PQclear(result);
    return 0;
}

int
store_database_has_streams(PGconn *conn, const char *queues, bool *exists, struct outbox_error *err)
{
    const char *values[1] = {queues};
    PGresult *result = lease_one_row(conn,
                                     "SELECT EXISTS (SELECT 1 FROM outbox.stream"
                                     " WHERE $1::text[] IS NULL OR queue = ANY ($1::text[]))",
                                     1, values, "unable to look for stream queues", err);

    if (result == NULL)
        return -1;
    *exists = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    return 0;
}

int
store_database_sample(PGconn *conn, const char *queues, bool count,
                      struct store_database_sample *sample, struct outbox_error *err)
{
    const char *values[1] = {queues};
    PGresult *result = lease_one_row(conn, count ? SQL_SAMPLE : SQL_PROBE, 1, values,
                                     "unable to sample the database's backlog", err);

    if (result == NULL)
        return -1;
    sample->counted = count;
    sample->ready = count ? strtoll(PQgetvalue(result, 0, 0), NULL, 10) : -1;
    sample->oldest_ready_age = count ? strtod(PQgetvalue(result, 0, 1), NULL) : -1;
    sample->claimable = PQgetvalue(result, 0, 2)[0] == 't';
    snprintf(sample->database_id, sizeof(sample->database_id), "%s", PQgetvalue(result, 0, 3));
    snprintf(sample->id_form, sizeof(sample->id_form), "%s", PQgetvalue(result, 0, 4));
    PQclear(result);
    return 0;
}
