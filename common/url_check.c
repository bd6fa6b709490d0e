/*
 * url_check.c - a database URL checked as libpq reads it, without connecting.
 */
#include "url_check.h"

#include <string.h>

#include <libpq-fe.h>

#include "error.h"
#include "redact.h"

/* Parses one conninfo or URI with libpq; 0, or -1 with its reason redacted. */
static int
check_conninfo(const char *text, const char *whole, struct outbox_error *err)
{
    char *reason = NULL, redacted[OUTBOX_ERROR_MESSAGE_MAX];
    PQconninfoOption *options = PQconninfoParse(text, &reason);
    int rc = 0;

    if (options == NULL) {
        url_redact_message(reason != NULL ? reason : "out of memory", whole, NULL, redacted,
                           sizeof(redacted));
        redacted[strcspn(redacted, "\n")] = '\0';
        PQfreemem(reason);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "not a valid libpq URI or conninfo: %s",
                                redacted);
    }
    for (PQconninfoOption *option = options; option->keyword != NULL; option++) {
        const char *value = option->val;

        /* libpq reads a dbname holding '=' or a URI as a conninfo of its own */
        if (strcmp(option->keyword, "dbname") == 0 && value != NULL && value != text &&
            (strchr(value, '=') != NULL || url_scheme_length(value) > 0) &&
            strcmp(value, text) != 0) {
            rc = check_conninfo(value, whole, err);
            break;
        }
    }
    PQconninfoFree(options);
    return rc;
}

int
url_check_database(const char *text, struct outbox_error *err)
{
    if (text == NULL || text[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "the database URL is empty");
    return check_conninfo(text, text, err);
}
