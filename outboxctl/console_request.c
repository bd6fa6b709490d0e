/*
 * console_request.c - the console's shared ground: the database connection
 * of each worker thread (reconnected at the next request after a failure),
 * query and form parameters, and plain-text answers.
 *
 * Rules: calls no other console file; a lost connection is remembered with
 * its reason, which is logged once per database on stderr whichever worker
 * meets it. libpq connections are not shared between threads: each worker
 * holds its own, in thread-local storage, to the database of its last
 * request.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console_request.h"
#include "error.h"
#include "redact.h"
#include "timeouts.h"

/* The calling worker's connection, its database and why it is unavailable ("" when it is up). */
static _Thread_local PGconn *thread_conn;
static _Thread_local char *thread_url; /* the URL thread_conn is (or was last tried) to */
static _Thread_local char thread_name[DATABASE_NAME_MAX];
static _Thread_local char thread_db_error[OUTBOX_ERROR_MESSAGE_MAX];

/*
 * The problem last logged per database by any worker ("" when none): each
 * is logged once. A few databases' worth; beyond that the oldest slot is
 * reused, and a problem may be logged again.
 */
#define REPORTED_MAX 32
static pthread_mutex_t reported_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[DATABASE_NAME_MAX];
    char message[OUTBOX_ERROR_MESSAGE_MAX];
} reported[REPORTED_MAX];
static size_t reported_next;

/* Logs message of database name unless it is the one logged last; NULL: the database is back. */
static void
report(const char *name, const char *message)
{
    size_t slot = REPORTED_MAX;

    pthread_mutex_lock(&reported_lock);
    for (size_t i = 0; i < REPORTED_MAX && slot == REPORTED_MAX; i++)
        if (strcmp(reported[i].name, name) == 0)
            slot = i;
    if (slot == REPORTED_MAX && message != NULL) {
        slot = reported_next;
        reported_next = (reported_next + 1) % REPORTED_MAX;
        snprintf(reported[slot].name, sizeof(reported[slot].name), "%s", name);
        reported[slot].message[0] = '\0';
    }
    if (slot < REPORTED_MAX) {
        if (message == NULL && reported[slot].message[0] != '\0')
            fprintf(stderr, "outboxctl serve: database %s: connection back\n", name);
        else if (message != NULL && strcmp(reported[slot].message, message) != 0)
            fprintf(stderr, "outboxctl serve: database %s: %s\n", name, message);
        snprintf(reported[slot].message, sizeof(reported[slot].message), "%s",
                 message ? message : "");
    }
    pthread_mutex_unlock(&reported_lock);
}

/* The console's sessions only read: their NOTICEs are dropped. */
static void
quiet_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* Remembers the database the calling thread connects to next; false when out of memory. */
static bool
aim_at(const char *name, const char *url)
{
    snprintf(thread_name, sizeof(thread_name), "%s", name); /* a name may change, its URL not */
    if (thread_url != NULL && strcmp(thread_url, url) == 0)
        return true;
    PQfinish(thread_conn);
    thread_conn = NULL;
    free(thread_url);
    thread_db_error[0] = '\0';
    return (thread_url = strdup(url)) != NULL;
}

PGconn *
console_database(const char *name, const char *url)
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
    const char *values[] = {
        TIMEOUT_TEXT(TIMEOUT_DATABASE_CONNECT_SECONDS),
        "outboxctl serve",
        "UTF8",
        "-c max_parallel_workers_per_gather=0 -c jit=off"
        " -c statement_timeout=" TIMEOUT_TEXT(CONSOLE_STATEMENT_TIMEOUT_SECONDS) "s",
        url,
        NULL};
    struct outbox_error err;

    if (url == NULL || !aim_at(name, url)) {
        snprintf(thread_db_error, sizeof(thread_db_error), "%s",
                 url == NULL ? "the list of databases is empty" : "out of memory");
        return NULL;
    }
    if (thread_conn != NULL && PQstatus(thread_conn) == CONNECTION_OK)
        return thread_conn;
    PQfinish(thread_conn);
    thread_conn = PQconnectdbParams(keywords, values, 1);
    if (thread_conn != NULL && PQstatus(thread_conn) == CONNECTION_OK) {
        PQsetNoticeProcessor(thread_conn, quiet_notice, NULL);
        report(name, NULL);
        thread_db_error[0] = '\0';
        return thread_conn;
    }
    outbox_error_from_connect(&err, thread_conn, url, "unable to connect to the database");
    report(name, err.message);
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
    report(thread_name, err->message);
    PQfinish(thread_conn);
    thread_conn = NULL;
}

void
console_database_close(void)
{
    PQfinish(thread_conn);
    thread_conn = NULL;
    free(thread_url);
    thread_url = NULL;
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
