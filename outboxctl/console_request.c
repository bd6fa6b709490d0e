/*
 * console_request.c - the console's shared ground: the database connection
 * of each worker thread (reconnected at the next request after a failure),
 * query and form parameters, and plain-text answers.
 *
 * Rules: calls no other console file; a lost connection is remembered with
 * its reason, which is logged once on stderr whichever worker meets it. libpq connections are not shared
 * between threads: each worker holds its own, in thread-local storage.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "console_request.h"
#include "error.h"
#include "redact.h"
#include "timeouts.h"

/* The calling worker's connection and why it is unavailable ("" when it is up). */
static _Thread_local PGconn *thread_conn;
static _Thread_local char thread_db_error[OUTBOX_ERROR_MESSAGE_MAX];

/* The database problem last logged by any worker ("" when none): each is logged once. */
static pthread_mutex_t reported_lock = PTHREAD_MUTEX_INITIALIZER;
static char reported[OUTBOX_ERROR_MESSAGE_MAX];

/* Logs message unless it is the problem logged last; NULL: the database is back. */
static void
report(const char *message)
{
    pthread_mutex_lock(&reported_lock);
    if (message == NULL && reported[0] != '\0')
        fprintf(stderr, "outboxctl serve: database connection back\n");
    else if (message != NULL && strcmp(reported, message) != 0)
        fprintf(stderr, "outboxctl serve: %s\n", message);
    snprintf(reported, sizeof(reported), "%s", message ? message : "");
    pthread_mutex_unlock(&reported_lock);
}

static void
ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

PGconn *
console_database(struct console *console)
{
    /*
     * No parallel workers: the console's queries read indexes of the backlog, where
     * workers cost a loaded server more than they save, and its one backend then
     * holds all the CPU time a page costs (what make bench measures). No JIT: the
     * planner's cost of the queue statistics, a join of a dozen small aggregates,
     * passes jit_above_cost at 1 000 queues, and compiling it cost 11-15 s where
     * running it costs milliseconds. A statement ends after 30 s: a page waiting on a
     * lock (a migration, a long transaction) frees its worker, and `outboxctl serve`
     * stops on SIGTERM within that bound instead of waiting for the lock.
     */
    static const char *const keywords[] = {"connect_timeout", "fallback_application_name",
                                           "client_encoding", "options", "dbname", NULL};
    const char *values[] = {TIMEOUT_TEXT(TIMEOUT_DATABASE_CONNECT_SECONDS), "outboxctl serve",
                            "UTF8", "-c max_parallel_workers_per_gather=0 -c jit=off"
                            " -c statement_timeout="
                            TIMEOUT_TEXT(CONSOLE_STATEMENT_TIMEOUT_SECONDS) "s",
                            console->database_url, NULL};
    struct outbox_error err;

    if (thread_conn != NULL && PQstatus(thread_conn) == CONNECTION_OK)
        return thread_conn;
    PQfinish(thread_conn);
    thread_conn = PQconnectdbParams(keywords, values, 1);
    if (thread_conn != NULL && PQstatus(thread_conn) == CONNECTION_OK) {
        PQsetNoticeProcessor(thread_conn, ignore_notice, NULL);
        if (thread_db_error[0] != '\0')
            report(NULL);
        thread_db_error[0] = '\0';
        return thread_conn;
    }
    outbox_error_from_connect(&err, thread_conn, console->database_url,
                              "unable to connect to the database");
    report(err.message);
    snprintf(thread_db_error, sizeof(thread_db_error), "%s", err.message);
    PQfinish(thread_conn);
    thread_conn = NULL;
    return NULL;
}

const char *
console_database_error(void)
{
    return thread_db_error;
}

void
console_database_failed(const struct outbox_error *err)
{
    if (thread_conn == NULL || PQstatus(thread_conn) == CONNECTION_OK)
        return;
    snprintf(thread_db_error, sizeof(thread_db_error), "%s", err->message);
    report(err->message);
    PQfinish(thread_conn);
    thread_conn = NULL;
}

void
console_database_close(void)
{
    PQfinish(thread_conn);
    thread_conn = NULL;
}

/* Percent-decodes text[0..length) ('+' is a space) into out; false when it does not fit. */
static bool
url_decode(const char *text, size_t length, char *out, size_t size)
{
    size_t used = 0;

    for (size_t i = 0; i < length; i++) {
        char c = text[i];

        if (c == '+') {
            c = ' ';
        } else if (c == '%' && i + 2 < length && url_hex_value(text[i + 1]) >= 0 &&
                   url_hex_value(text[i + 2]) >= 0) {
            c = (char)(url_hex_value(text[i + 1]) * 16 + url_hex_value(text[i + 2]));
            i += 2;
        }
        if (used + 1 >= size)
            return false;
        out[used++] = c;
    }
    out[used] = '\0';
    return true;
}

bool
console_param(const char *params, size_t length, const char *name, char *out, size_t size)
{
    size_t name_len = strlen(name);
    const char *p = params, *end = params + length;

    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *stop = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));

        if (eq != NULL && (size_t)(eq - p) == name_len && memcmp(p, name, name_len) == 0)
            return url_decode(eq + 1, (size_t)(stop - eq - 1), out, size) && out[0] != '\0';
        p = stop + 1;
    }
    return false;
}

void
console_respond_text(struct console_response *response, int status, const char *text)
{
    response->status = status;
    response->content_type = "text/plain; charset=utf-8";
    response->body.len = 0;
    buffer_puts(&response->body, text);
    buffer_putc(&response->body, '\n');
}
