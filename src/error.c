/*
 * error.c - error codes, messages, and the SQLSTATE mapping.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "redact.h"

bool
outbox_error_is_transient(const struct outbox_error *err)
{
    if (err == NULL)
        return false;
    switch (err->code) {
    case OUTBOX_ERR_CONNECTION:
    case OUTBOX_ERR_TIMEOUT:
    case OUTBOX_ERR_BUSY:
    case OUTBOX_ERR_BROKER:
        return true;
    default:
        return false;
    }
}

const char *
outbox_error_code_name(enum outbox_error_code code)
{
    switch (code) {
    case OUTBOX_OK:
        return "ok";
    case OUTBOX_ERR_CONNECTION:
        return "connection";
    case OUTBOX_ERR_TIMEOUT:
        return "timeout";
    case OUTBOX_ERR_BUSY:
        return "busy";
    case OUTBOX_ERR_BROKER:
        return "broker";
    case OUTBOX_ERR_INVALID:
        return "invalid";
    case OUTBOX_ERR_CONFIG:
        return "config";
    case OUTBOX_ERR_SCHEMA:
        return "schema";
    case OUTBOX_ERR_STATE:
        return "state";
    case OUTBOX_ERR_CONSTRAINT:
        return "constraint";
    case OUTBOX_ERR_INTERNAL:
        return "internal";
    }
    return "unknown";
}

void
outbox_error_clear(struct outbox_error *err)
{
    if (err == NULL)
        return;
    err->code = OUTBOX_OK;
    err->sqlstate[0] = '\0';
    err->message[0] = '\0';
}

int
outbox_error_set(struct outbox_error *err, enum outbox_error_code code, const char *format, ...)
{
    va_list ap;

    if (err == NULL)
        return -1;
    err->code = code;
    err->sqlstate[0] = '\0';
    va_start(ap, format);
    vsnprintf(err->message, sizeof(err->message), format, ap);
    va_end(ap);
    return -1;
}

const char *
outbox_error_quote(char *out, size_t size, const char *text)
{
    size_t n = 0;

    for (; text != NULL && text[n] != '\0' && n + 1 < size; n++)
        out[n] = (unsigned char)text[n] < 0x20 || text[n] == 0x7f ? '?' : text[n];
    if (size > 0)
        out[n] = '\0';
    return out;
}

enum outbox_error_code
outbox_error_code_for_sqlstate(const char *sqlstate, bool connection_ok)
{
    if (!connection_ok)
        return OUTBOX_ERR_CONNECTION;
    /* no SQLSTATE on a good connection: libpq refused the call itself (pipeline mode, a
       command in progress, out of memory), which a retry of the same call does not cure */
    if (sqlstate == NULL || strlen(sqlstate) != 5)
        return OUTBOX_ERR_STATE;
    if (strncmp(sqlstate, "08", 2) == 0 || strncmp(sqlstate, "57P", 3) == 0 ||
        strcmp(sqlstate, "53300") == 0) /* connection exception, shutdown, too many connections */
        return OUTBOX_ERR_CONNECTION;
    /* a standby, or a primary demoted under us: another connection finds the writable one */
    if (strcmp(sqlstate, "25006") == 0) /* read_only_sql_transaction */
        return OUTBOX_ERR_CONNECTION;
    if (strcmp(sqlstate, "40001") == 0 || strcmp(sqlstate, "40P01") == 0 ||
        strcmp(sqlstate, "55P03") == 0) /* serialization, deadlock, lock not available */
        return OUTBOX_ERR_BUSY;
    if (strcmp(sqlstate, "57014") == 0) /* query canceled (statement_timeout) */
        return OUTBOX_ERR_TIMEOUT;
    if (strncmp(sqlstate, "23", 2) == 0)
        return OUTBOX_ERR_CONSTRAINT;
    if (strncmp(sqlstate, "22", 2) == 0)
        return OUTBOX_ERR_INVALID;
    if (strcmp(sqlstate, "42P01") == 0 || strcmp(sqlstate, "3F000") == 0 ||
        strcmp(sqlstate, "42883") == 0) /* undefined table, schema, function */
        return OUTBOX_ERR_SCHEMA;
    if (strncmp(sqlstate, "53", 2) == 0) /* insufficient resources */
        return OUTBOX_ERR_BUSY;
    if (strncmp(sqlstate, "28", 2) == 0 || strcmp(sqlstate, "3D000") == 0 ||
        strcmp(sqlstate, "42501") == 0) /* auth, unknown database, no privilege */
        return OUTBOX_ERR_CONFIG;
    return OUTBOX_ERR_INTERNAL;
}

/* Copies the first line of message, without its trailing newline. */
static void
first_line(char *out, size_t size, const char *message)
{
    size_t len = strcspn(message, "\n");

    if (len >= size)
        len = size - 1;
    memcpy(out, message, len);
    out[len] = '\0';
}

/* outbox_error_from_pg and outbox_error_from_connect: conninfo may be NULL. */
static int
error_from_pg(struct outbox_error *err, PGconn *conn, const PGresult *result, const char *conninfo,
              const char *context)
{
    const char *sqlstate = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : NULL;
    const char *primary = result ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    bool connection_ok = conn != NULL && PQstatus(conn) == CONNECTION_OK;
    char text[OUTBOX_ERROR_MESSAGE_MAX], redacted[OUTBOX_ERROR_MESSAGE_MAX];

    if (err == NULL)
        return -1;
    if (primary == NULL)
        primary = result ? PQresultErrorMessage(result) : NULL;
    if ((primary == NULL || primary[0] == '\0') && conn != NULL)
        primary = PQerrorMessage(conn);
    if (primary == NULL || primary[0] == '\0')
        primary = "unknown error";
    first_line(redacted, sizeof(redacted), primary);
    /* a server message can quote the caller's data: one line, no control character */
    outbox_error_quote(text, sizeof(text), redacted);
    /* libpq quotes the URL, or the piece of it it could not read: never pass it on as is */
    url_redact_message(text, conninfo, conn != NULL ? PQpass(conn) : NULL, redacted,
                       sizeof(redacted));
    /* libpq prefixes client-side messages with "ERROR:  " only in the full text */
    outbox_error_set(err, outbox_error_code_for_sqlstate(sqlstate, connection_ok), "%s: %s",
                     context, redacted);
    if (sqlstate != NULL && strlen(sqlstate) == 5)
        memcpy(err->sqlstate, sqlstate, 6);
    return -1;
}

int
outbox_error_from_pg(struct outbox_error *err, PGconn *conn, const PGresult *result,
                     const char *context)
{
    return error_from_pg(err, conn, result, NULL, context);
}

int
outbox_error_from_connect(struct outbox_error *err, PGconn *conn, const char *conninfo,
                          const char *context)
{
    return error_from_pg(err, conn, NULL, conninfo, context);
}
