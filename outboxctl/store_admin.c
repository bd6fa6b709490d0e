/*
 * store_admin.c - what the outboxctl store shares (running a statement,
 * reading cells, the schema check), identity, enqueue, pauses and the time
 * texts of replay ranges for operators; the status figures are in
 * store_status.c, dead rows in store_dead.c, the batched statements (purge,
 * replay, inbox purge) in store_batch.c.
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

char *
store_admin_id_array(const int64_t *ids, size_t count)
{
    char *text = malloc(count * 21 + 3), *at;

    if (text == NULL)
        return NULL;
    at = text;
    *at++ = '{';
    for (size_t i = 0; i < count; i++)
        at += sprintf(at, i ? ",%lld" : "%lld", (long long)ids[i]);
    *at++ = '}';
    *at = '\0';
    return text;
}

int
store_admin_fail_clear(struct outbox_error *err, PGconn *conn, PGresult *result,
                       const char *context)
{
    outbox_error_from_pg(err, conn, result, context);
    PQclear(result);
    return -1;
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

int
store_admin_rows(PGconn *conn, PGresult *result, const char *context, void **items, size_t size,
                 struct outbox_error *err)
{
    int rows;

    *items = NULL;
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        store_admin_fail(err, conn, result, context);
        PQclear(result);
        return -1;
    }
    rows = PQntuples(result);
    if (rows > 0 && (*items = calloc((size_t)rows, size)) == NULL) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    return rows;
}

/* Fills list from paused_sql. */
static int
read_pauses(PGconn *conn, struct store_pause_list *list, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, paused_sql);
    bool failed = false;
    void *pauses;
    int rows;

    memset(list, 0, sizeof(*list));
    if ((rows = store_admin_rows(conn, result, "unable to list paused queues", &pauses,
                                 sizeof(*list->pauses), err)) < 0)
        return -1;
    for (list->pauses = pauses; (int)list->count < rows && !failed; list->count++) {
        struct store_pause *pause = &list->pauses[list->count];
        int row = (int)list->count;

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
store_admin_interval_ago(PGconn *conn, const char *interval, char *buf, size_t size,
                         struct outbox_error *err)
{
    const char *params[1] = {interval};
    PGresult *result = store_admin_exec(conn, INTERVAL_AGO_SQL, 1, params);
    const char *sqlstate;

    if (PQresultStatus(result) == PGRES_TUPLES_OK && PQntuples(result) == 1) {
        snprintf(buf, size, "%s", PQgetvalue(result, 0, 0));
        PQclear(result);
        return 0;
    }
    sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    store_admin_fail(err, conn, result, "unable to read the interval");
    if (sqlstate != NULL && strncmp(sqlstate, "22", 2) == 0) /* no interval PostgreSQL reads */
        err->code = OUTBOX_ERR_INVALID;
    PQclear(result);
    return -1;
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
