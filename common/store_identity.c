/*
 * store_identity.c - the database's identity and the message ids made of it
 * (see store_identity.h).
 */
#include "store_identity.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char SQL_OBSERVE[] =
    "SELECT database_id, id_form, epoch, history_changed, history FROM outbox.identity_observe()";

static const char *const FORM_NAMES[] = {
    [STORE_ID_FORM_UID] = "uid",
    [STORE_ID_FORM_DATABASE] = "database",
    [STORE_ID_FORM_JOB] = "job",
};

const char *
store_id_form_name(enum store_id_form form)
{
    return FORM_NAMES[form];
}

/* The form named name, or -1. */
static int
form_of(const char *name)
{
    for (size_t f = 0; f < sizeof(FORM_NAMES) / sizeof(FORM_NAMES[0]); f++)
        if (strcmp(FORM_NAMES[f], name) == 0)
            return (int)f;
    return -1;
}

int
store_identity_observe(PGconn *conn, struct store_identity *out, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, SQL_OBSERVE);
    const char *id;
    long epoch;
    int form;

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to read the database identity");
        if (err != NULL && (strcmp(err->sqlstate, "42883") == 0 || strcmp(err->sqlstate, "42703") == 0))
            err->code = OUTBOX_ERR_SCHEMA; /* before migration 026 */
        PQclear(result);
        return -1;
    }
    id = PQgetvalue(result, 0, 0);
    epoch = strtol(PQgetvalue(result, 0, 2), NULL, 10);
    form = form_of(PQgetvalue(result, 0, 1));
    if (strlen(id) >= sizeof(out->database_id) || epoch < 1 || epoch > INT32_MAX || form < 0 ||
        PQgetlength(result, 0, 4) >= (int)sizeof(out->history_name)) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_SCHEMA, "outbox.identity holds no valid identity");
    }
    memset(out, 0, sizeof(*out));
    memcpy(out->database_id, id, strlen(id) + 1);
    out->epoch = (int32_t)epoch;
    out->form = (enum store_id_form)form;
    out->history_changed = strcmp(PQgetvalue(result, 0, 3), "t") == 0;
    snprintf(out->history, sizeof(out->history), "%s:%" PRId32, out->database_id, out->epoch);
    snprintf(out->history_name, sizeof(out->history_name), "%s", PQgetvalue(result, 0, 4));
    PQclear(result);
    return 0;
}

void
store_message_id_format(const struct store_identity *identity, int64_t job_id,
                        const char *message_uid, int32_t replay, enum store_message_id_kind kind,
                        char *out)
{
    enum store_id_form form = kind == STORE_DEDUP_ID ? STORE_ID_FORM_UID : identity->form;
    int n;

    if (form == STORE_ID_FORM_UID)
        n = snprintf(out, STORE_MESSAGE_ID_MAX, "%s:%s", identity->database_id, message_uid);
    else if (form == STORE_ID_FORM_DATABASE)
        n = snprintf(out, STORE_MESSAGE_ID_MAX, "%s:%" PRId64, identity->history, job_id);
    else
        n = snprintf(out, STORE_MESSAGE_ID_MAX, "%" PRId64, job_id);
    if (replay > 0 && n > 0 && n < STORE_MESSAGE_ID_MAX)
        snprintf(out + n, STORE_MESSAGE_ID_MAX - (size_t)n, ".r%" PRId32, replay);
}
