/*
 * console_databases_view.c - the Databases view, GET /databases and GET
 * /api/v1/databases: every database of the console's list at a glance (its
 * reachability, schema, identity, whole-database pause, lease owner and
 * rows), each read on a short connection of its own by a few threads at
 * once.
 *
 * A database that is down costs its own entry only: its connect is bounded
 * by CONSOLE_PROBE_CONNECT_SECONDS, its statements by
 * CONSOLE_PROBE_STATEMENT_SECONDS, and no database is started on past
 * CONSOLE_PROBE_DEADLINE_SECONDS (its entry says so), so the view answers
 * within about the deadline and one database's bounds, whatever the list.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actions.h"
#include "clock.h"
#include "console_html.h"
#include "store_console.h"
#include "timeouts.h"

#define PROBE_THREADS 8 /* databases looked at at once */

/* One database of the view: what was read, or why not. */
struct probe_entry {
    const struct database_entry *database;
    bool reachable;                       /* connected */
    char error[OUTBOX_ERROR_MESSAGE_MAX]; /* one line; "" when everything was read */
    struct store_console_database state;
};

/* A look at every database of the list, shared by the threads doing it. */
struct probe {
    struct database_list list; /* a copy: the file may change meanwhile */
    char list_error[OUTBOX_ERROR_MESSAGE_MAX];
    struct probe_entry *entries;
    pthread_mutex_t lock; /* guards next */
    size_t next;          /* the next entry no thread took */
    double deadline;      /* clock_monotonic_seconds() after which none is started */
};

/* Connects to entry's database for a short look and reads it. */
static void
probe_one(struct probe_entry *entry)
{
    static const char *const keywords[] = {"connect_timeout", "fallback_application_name",
                                           "client_encoding", "options",
                                           "dbname",          NULL};
    const char *values[] = {
        TIMEOUT_TEXT(CONSOLE_PROBE_CONNECT_SECONDS),
        "outboxctl serve",
        "UTF8",
        "-c max_parallel_workers_per_gather=0 -c jit=off"
        " -c statement_timeout=" TIMEOUT_TEXT(CONSOLE_PROBE_STATEMENT_SECONDS) "s",
        entry->database->url,
        NULL};
    PGconn *conn = PQconnectdbParams(keywords, values, 1);
    struct outbox_error err;

    if (conn == NULL || PQstatus(conn) != CONNECTION_OK) {
        outbox_error_from_connect(&err, conn, entry->database->url,
                                  "unable to connect to the database");
        snprintf(entry->error, sizeof(entry->error), "%s", err.message);
    } else {
        entry->reachable = true;
        if (store_console_database(conn, &entry->state, &err) != 0)
            snprintf(entry->error, sizeof(entry->error), "%s", err.message);
    }
    PQfinish(conn);
}

/* A thread of the look: takes the next entry until none is left. */
static void *
probe_worker(void *arg)
{
    struct probe *probe = arg;

    for (;;) {
        struct probe_entry *entry;

        pthread_mutex_lock(&probe->lock);
        entry = probe->next < probe->list.count ? &probe->entries[probe->next++] : NULL;
        pthread_mutex_unlock(&probe->lock);
        if (entry == NULL)
            return NULL;
        if (clock_monotonic_seconds() < probe->deadline)
            probe_one(entry);
        else
            snprintf(entry->error, sizeof(entry->error),
                     "not looked at: the view's deadline of %d s passed first",
                     CONSOLE_PROBE_DEADLINE_SECONDS);
    }
}

/* Looks at every database of the console's list; -1 when out of memory. */
static int
probe_run(struct console *console, struct probe *probe)
{
    pthread_t threads[PROBE_THREADS - 1];
    size_t started = 0;

    memset(probe, 0, sizeof(*probe));
    if (console_databases_copy(&console->databases, &probe->list, probe->list_error,
                               sizeof(probe->list_error)) != 0)
        return -1;
    probe->entries = calloc(probe->list.count + 1, sizeof(*probe->entries));
    if (probe->entries == NULL) {
        database_list_clear(&probe->list);
        return -1;
    }
    for (size_t i = 0; i < probe->list.count; i++)
        probe->entries[i].database = &probe->list.items[i];
    pthread_mutex_init(&probe->lock, NULL);
    probe->deadline = clock_monotonic_seconds() + CONSOLE_PROBE_DEADLINE_SECONDS;
    while (started + 1 < PROBE_THREADS && started + 1 < probe->list.count &&
           pthread_create(&threads[started], NULL, probe_worker, probe) == 0)
        started++;
    probe_worker(probe); /* this thread too: the look goes on when none could start */
    for (size_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&probe->lock);
    return 0;
}

/* Frees what a look read, and its copy of the list. */
static void
probe_clear(struct probe *probe)
{
    for (size_t i = 0; i < probe->list.count; i++)
        store_console_database_clear(&probe->entries[i].state);
    free(probe->entries);
    database_list_clear(&probe->list);
}

/* The sums of the totals line. */
struct probe_totals {
    size_t ok, failed, paused;
    int64_t ready, running, dead, waiting;
};

/* Sums the databases read whole: failed ones count as failed only. */
static struct probe_totals
probe_totals(const struct probe *probe)
{
    struct probe_totals totals = {0};

    for (size_t i = 0; i < probe->list.count; i++) {
        const struct probe_entry *entry = &probe->entries[i];

        if (entry->error[0] != '\0') {
            totals.failed++;
            continue;
        }
        totals.ok++;
        totals.paused += entry->state.paused_at != NULL;
        totals.ready += entry->state.ready;
        totals.running += entry->state.running;
        totals.dead += entry->state.dead;
        totals.waiting += entry->state.waiting;
    }
    return totals;
}

/* ---- the API ---- */

/* One database as GET databases lists it: what could not be read is null. */
static void
entry_json(struct buffer *out, const struct probe_entry *entry)
{
    const struct store_console_database *state = &entry->state;
    bool read = entry->error[0] == '\0';

    buffer_puts(out, "{\"name\":");
    console_json_string(out, entry->database->name);
    api_field_bool(out, "reachable", entry->reachable);
    api_field_text_or_null(out, "error", entry->error);
    if (!read) {
        buffer_puts(out, ",\"schema_version\":null,\"identity\":null,\"paused\":null");
        buffer_puts(out, ",\"ready\":null,\"running\":null,\"dead\":null,\"waiting\":null}");
        return;
    }
    api_field_int(out, "schema_version", state->schema_version);
    api_json_key(out, "identity");
    if (state->identity_present) {
        buffer_puts(out, "{\"database_id\":");
        console_json_string(out, state->identity.database_id);
        api_field_string(out, "id_form", state->identity.id_form);
        api_field_int(out, "epoch", state->identity.epoch);
        buffer_puts(out, "}");
    } else {
        buffer_puts(out, "null");
    }
    api_field_bool(out, "paused", state->paused_at != NULL);
    api_field_string(out, "paused_at", state->paused_at);
    api_field_string(out, "paused_by", state->paused_by);
    api_field_string(out, "pause_reason", state->pause_reason);
    api_field_string(out, "lease_owner", state->lease_owner);
    api_field_string(out, "lease_until", state->lease_until);
    buffer_printf(out, ",\"ready\":%lld,\"running\":%lld,\"dead\":%lld,\"waiting\":%lld}",
                  (long long)state->ready, (long long)state->running, (long long)state->dead,
                  (long long)state->waiting);
}

void
api_databases(struct api_call *call)
{
    struct buffer *out = &call->response->body;
    struct probe probe;
    struct probe_totals totals;

    if (probe_run(call->console, &probe) != 0)
        return api_respond_error(call->response, 500, "out of memory");
    totals = probe_totals(&probe);
    buffer_puts(out, "{\"databases\":[");
    for (size_t i = 0; i < probe.list.count; i++) {
        if (i > 0)
            buffer_putc(out, ',');
        entry_json(out, &probe.entries[i]);
    }
    buffer_printf(out,
                  "],\"totals\":{\"databases\":%zu,\"ok\":%zu,\"failed\":%zu,"
                  "\"paused\":%zu,\"ready\":%lld,\"running\":%lld,\"dead\":%lld,"
                  "\"waiting\":%lld}",
                  probe.list.count, totals.ok, totals.failed, totals.paused,
                  (long long)totals.ready, (long long)totals.running, (long long)totals.dead,
                  (long long)totals.waiting);
    api_field_text_or_null(out, "list_error", probe.list_error);
    buffer_puts(out, "}");
    probe_clear(&probe);
    api_respond_json(call->response, 200);
}

/* ---- the page ---- */

/* The state, schema, identity, pause and lease cells of a database's row. */
static void
entry_cells(struct buffer *out, const struct probe_entry *entry)
{
    const struct store_console_database *state = &entry->state;

    if (entry->error[0] != '\0') {
        buffer_puts(out, "<td class=\"state bad\" colspan=\"9\">");
        console_html_escape(out, entry->error);
        buffer_puts(out, "</td>");
        return;
    }
    buffer_printf(out,
                  "<td class=\"state\">ok</td><td class=\"schema\">%d</td>"
                  "<td class=\"identity\">",
                  state->schema_version);
    if (state->identity_present) {
        console_html_escape(out, state->identity.database_id);
        buffer_printf(out, ":%d", state->identity.epoch);
    }
    buffer_puts(out, "</td><td class=\"paused\">");
    if (state->paused_at != NULL) {
        buffer_puts(out, "paused since ");
        console_html_escape(out, state->paused_at);
        buffer_puts(out, " by ");
        console_html_escape(out, state->paused_by);
        buffer_puts(out, state->pause_reason != NULL ? ": " : "");
        console_html_escape(out, state->pause_reason);
    }
    buffer_puts(out, "</td><td class=\"owner\">");
    console_html_escape(out, state->lease_owner != NULL ? state->lease_owner : "none");
    buffer_printf(out,
                  "</td><td class=\"ready\">%lld</td><td class=\"running\">%lld</td>"
                  "<td class=\"dead\">%lld</td><td class=\"waiting\">%lld</td>",
                  (long long)state->ready, (long long)state->running, (long long)state->dead,
                  (long long)state->waiting);
}

/* The table of the databases and its totals line. */
static void
databases_table(struct buffer *out, const struct probe *probe)
{
    static const char *const columns[] = {"Database", "State",       "Schema", "Identity",
                                          "Paused",   "Lease owner", "Ready",  "Running",
                                          "Dead",     "Waiting",     NULL};
    struct probe_totals totals = probe_totals(probe);

    if (console_table_open(out, "Databases", probe->list.count, "The list has no database.",
                           "databases", columns)) {
        for (size_t i = 0; i < probe->list.count; i++) {
            const char *name = probe->entries[i].database->name;

            buffer_puts(out, "<tr data-database=\"");
            console_html_escape(out, name);
            buffer_puts(out, "\"><td class=\"name\"><a href=\"/?database=");
            console_html_escape(out, name);
            buffer_puts(out, "\">");
            console_html_escape(out, name);
            buffer_puts(out, "</a></td>");
            entry_cells(out, &probe->entries[i]);
            buffer_puts(out, "</tr>");
        }
        buffer_puts(out, "</tbody></table>");
    }
    buffer_printf(out,
                  "<p id=\"databases-totals\">%zu database%s: %zu ok, %zu failed, "
                  "%zu paused; ready %lld, running %lld, dead %lld, waiting %lld.</p>",
                  probe->list.count, probe->list.count == 1 ? "" : "s", totals.ok, totals.failed,
                  totals.paused, (long long)totals.ready, (long long)totals.running,
                  (long long)totals.dead, (long long)totals.waiting);
}

void
console_databases_page(struct console *console, PGconn *conn, struct console_request *request,
                       struct console_response *response)
{
    struct buffer *out = &response->body;
    struct probe probe;

    (void)conn; /* reads every database of the list, each on a connection of its own */
    if (probe_run(console, &probe) != 0)
        return console_respond_text(response, 500, "out of memory");
    console_page_start(console, request, out, "Databases", "/databases");
    buffer_puts(out, "<h1>Databases</h1>");
    if (probe.list_error[0] != '\0') {
        buffer_puts(out, "<div class=\"banner\" id=\"list-error\">The list's file changed but "
                         "was not taken, the previous list is kept: ");
        console_html_escape(out, probe.list_error);
        buffer_puts(out, "</div>");
    }
    databases_table(out, &probe);
    buffer_printf(out,
                  "<p class=\"note\">Each database is read on a connection of its own "
                  "(connect within %d s, statements within %d s); ready, running, dead "
                  "and waiting stream rows are counted as the overview counts them. "
                  "Choose a database to see its pages.</p>",
                  CONSOLE_PROBE_CONNECT_SECONDS, CONSOLE_PROBE_STATEMENT_SECONDS);
    console_page_end(out);
    probe_clear(&probe);
    console_page_respond(response, 200);
}
