/*
 * console_html.c - the console's pages, rendered on the server: overview
 * with the stream partitions and the traffic chart, dead rows, blocked and paused keys, replay, and
 * the login form.
 *
 * Every value from the database or the request goes through
 * console_html_escape(). The pages hold no inline script or style (the
 * Content-Security-Policy forbids both): forms that act carry a data-api
 * attribute, and /static/console.js posts them as JSON with the page's
 * CSRF token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console_auth.h"
#include "console_html.h"
#include "store_admin.h"
#include "store_console.h"
#include "store_dead.h"

#define SESSION_COOKIE "outbox_session"

void
console_html_escape(struct buffer *out, const char *text)
{
    if (text == NULL)
        return;
    for (const char *p = text; *p != '\0'; p++) {
        switch (*p) {
        case '&': buffer_puts(out, "&amp;"); break;
        case '<': buffer_puts(out, "&lt;"); break;
        case '>': buffer_puts(out, "&gt;"); break;
        case '"': buffer_puts(out, "&quot;"); break;
        case '\'': buffer_puts(out, "&#39;"); break;
        default: buffer_putc(out, *p);
        }
    }
}

/* Short alias: escaped text. */
static void
esc(struct buffer *out, const char *text)
{
    console_html_escape(out, text);
}

static void
format_bytes(char *buf, size_t size, int64_t bytes)
{
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB"};
    double value = (double)bytes;
    int unit = 0;

    while (value >= 1024 && unit < 4) {
        value /= 1024;
        unit++;
    }
    snprintf(buf, size, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
}

static void
format_age(char *buf, size_t size, double seconds)
{
    long s = (long)seconds;

    if (s < 60)
        snprintf(buf, size, "%lds", s);
    else if (s < 3600)
        snprintf(buf, size, "%ldm %lds", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, size, "%ldh %ldm", s / 3600, (s % 3600) / 60);
    else
        snprintf(buf, size, "%ldd %ldh", s / 86400, (s % 86400) / 3600);
}

/* ---- layout ---- */

static void
page_start(struct console *console, const struct console_request *request, struct buffer *out,
           const char *title, const char *current)
{
    static const char *const nav[][2] = {{"/", "Overview"},
                                         {"/dead", "Dead rows"},
                                         {"/keys", "Keys and pauses"},
                                         {"/replay", "Replay"}};

    buffer_puts(out, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                     "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                     "<title>");
    esc(out, title);
    buffer_puts(out, " - outbox console</title><meta name=\"csrf-token\" content=\"");
    if (request->session != NULL)
        esc(out, request->session->csrf);
    buffer_puts(out, "\"><link rel=\"stylesheet\" href=\"/static/console.css\">"
                     "<script src=\"/static/console.js\" defer></script></head>\n<body>"
                     "<header><span class=\"brand\">outbox console</span><nav>");
    for (size_t i = 0; i < sizeof(nav) / sizeof(nav[0]); i++)
        buffer_printf(out, "<a href=\"%s\"%s>%s</a>", nav[i][0],
                      strcmp(nav[i][0], current) == 0 ? " class=\"current\"" : "", nav[i][1]);
    buffer_printf(out, "</nav><span class=\"mode\">%s</span>",
                  console->allow_actions ? "actions allowed" : "read-only");
    if (request->identity == CONSOLE_COOKIE)
        buffer_puts(out, "<form method=\"post\" action=\"/logout\" class=\"logout\">"
                         "<button type=\"submit\">Log out</button></form>");
    buffer_puts(out, "</header>\n<p id=\"message\" role=\"status\"></p>\n<main>");
}

static void
page_end(struct buffer *out)
{
    buffer_puts(out, "</main></body></html>\n");
}

static void
respond_html(struct console_response *response, int status)
{
    response->status = status;
    response->content_type = "text/html; charset=utf-8";
}

/* The banner of a page whose database is away; answers 503. */
static void
database_banner(struct console *console, const struct console_request *request,
                struct console_response *response, const char *title, const char *current,
                const char *message)
{
    struct buffer *out = &response->body;

    out->len = 0;
    page_start(console, request, out, title, current);
    buffer_puts(out, "<div class=\"banner\" id=\"database-banner\">Database unavailable: ");
    esc(out, message);
    buffer_puts(out, ". The console reconnects at the next request; reload to try again.</div>");
    page_end(out);
    respond_html(response, 503);
}

/* ---- login ---- */

static void
login_page(struct console *console, const struct console_request *request,
           struct console_response *response, int status, const char *problem)
{
    struct buffer *out = &response->body;

    page_start(console, request, out, "Log in", "");
    buffer_puts(out, "<section class=\"login\"><h1>Log in</h1>");
    if (problem != NULL) {
        buffer_puts(out, "<p class=\"bad\">");
        esc(out, problem);
        buffer_puts(out, "</p>");
    }
    buffer_puts(out, "<form method=\"post\" action=\"/login\"><label>Access token "
                     "<input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\" "
                     "required autofocus></label> <button type=\"submit\">Log in</button></form>"
                     "<p class=\"note\">The token is the first line of the console's "
                     "--auth-token-file.</p></section>");
    page_end(out);
    respond_html(response, status);
}

static void
login_post(struct console *console, struct console_request *request,
           struct console_response *response)
{
    char token[4200];
    struct console_session opened, *session = &opened;

    if (console->token == NULL) {
        response->status = 303;
        buffer_puts(&response->headers, "Location: /\r\n");
        return;
    }
    if (!console_param(request->body, request->body_len, "token", token, sizeof(token)) ||
        !console_auth_login(console, token, &opened)) {
        fprintf(stderr, "outboxctl serve: failed login from %s\n", request->peer);
        request->session = NULL;
        return login_page(console, request, response, 401, "wrong token");
    }
    fprintf(stderr, "outboxctl serve: login of session %.8s from %s\n", session->id,
            request->peer);
    response->status = 303;
    buffer_printf(&response->headers,
                  "Set-Cookie: " SESSION_COOKIE "=%s; Path=/; HttpOnly; SameSite=Strict\r\n"
                  "Location: /\r\n",
                  session->id);
}

/* ---- overview ---- */

static void
chart_svg(struct buffer *out, const struct store_console_chart *chart)
{
    const int width = 600, height = 160, left = 50, top = 10, plot_h = 120;
    const int plot_w = width - left - 10;
    int64_t max = 1;

    for (int i = 0; i < STORE_CONSOLE_CHART_MINUTES; i++) {
        if (chart->enqueued[i] > max)
            max = chart->enqueued[i];
        if (chart->published[i] > max)
            max = chart->published[i];
    }
    buffer_printf(out, "<svg class=\"chart\" viewBox=\"0 0 %d %d\" role=\"img\" "
                       "aria-label=\"rows enqueued and published per minute, last hour\">",
                  width, height);
    buffer_printf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>", left,
                  top + plot_h, left + plot_w, top + plot_h);
    buffer_printf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">%lld/min"
                       "</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">0"
                       "</text>",
                  left - 4, top + 10, (long long)max, left - 4, top + plot_h);
    buffer_printf(out, "<text x=\"%d\" y=\"%d\" font-size=\"11\">-60 min</text>"
                       "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">now</text>",
                  left, height - 10, left + plot_w, height - 10);
    for (int series = 0; series < 2; series++) {
        const int64_t *values = series == 0 ? chart->enqueued : chart->published;

        buffer_printf(out, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" "
                           "stroke-width=\"2\" points=\"",
                      series == 0 ? "enqueued" : "published", series == 0 ? "#2b6cb0" : "#2f855a");
        for (int i = 0; i < STORE_CONSOLE_CHART_MINUTES; i++)
            buffer_printf(out, "%d,%d ", left + i * plot_w / (STORE_CONSOLE_CHART_MINUTES - 1),
                          top + plot_h - (int)(values[i] * plot_h / max));
        buffer_puts(out, "\"/>");
    }
    buffer_puts(out, "</svg><p class=\"legend\"><span class=\"key-enqueued\">enqueued</span> "
                     "<span class=\"key-published\">published</span> per minute, from "
                     "created_at and finished_at of the rows still in the table (within the "
                     "relays' retention)</p>");
}

/* The stream columns of a queue: "-" for a row-state queue with no stream row. */
static void
queue_stream_cells(struct buffer *out, const struct store_queue_status *q, bool estimated)
{
    if (!q->stream && q->stream_published + q->stream_waiting == 0) {
        buffer_puts(out, "<td class=\"stream-published\">-</td>"
                         "<td class=\"stream-waiting\">-</td>");
        return;
    }
    buffer_printf(out, "<td class=\"stream-published\">%s%lld</td>"
                       "<td class=\"stream-waiting\">%lld</td>",
                  estimated ? "&asymp;" : "", (long long)q->stream_published,
                  (long long)q->stream_waiting);
}

static void
queues_table(struct buffer *out, const struct store_console_overview *overview)
{
    const struct store_status *status = &overview->status;

    buffer_puts(out, "<table id=\"queues\"><thead><tr><th>Queue</th><th>Ready</th>"
                     "<th>Running</th><th>Succeeded</th><th>Dead</th><th>Stream published</th>"
                     "<th>Stream waiting</th><th>Oldest ready</th>"
                     "<th>Paused</th><th>Blocked keys</th></tr></thead><tbody>");
    for (size_t i = 0; i < status->queue_count; i++) {
        const struct store_queue_status *q = &status->queues[i];
        char age[32];

        format_age(age, sizeof(age), q->oldest_ready_seconds);
        buffer_puts(out, "<tr data-queue=\"");
        esc(out, q->queue);
        buffer_printf(out, "\"%s><td class=\"queue\"><a href=\"/dead?queue=",
                      q->stream ? " data-stream" : "");
        esc(out, q->queue);
        buffer_puts(out, "\">");
        esc(out, q->queue);
        buffer_printf(out, "</a>%s</td><td class=\"ready\">%lld</td><td class=\"running\">%lld"
                           "</td><td class=\"succeeded\">%s%lld</td><td class=\"dead\">%lld</td>",
                      q->stream ? " <span class=\"badge stream\">stream</span>" : "",
                      (long long)q->ready, (long long)q->running,
                      overview->succeeded_estimated ? "&asymp;" : "", (long long)q->succeeded,
                      (long long)q->dead);
        queue_stream_cells(out, q, overview->succeeded_estimated);
        buffer_printf(out, "<td class=\"age\">%s</td><td class=\"paused\">%s",
                      q->ready + q->stream_waiting > 0 ? age : "-", q->paused ? "paused" : "");
        if (q->paused_keys > 0)
            buffer_printf(out, "%s%lld key%s", q->paused ? ", " : "", (long long)q->paused_keys,
                          q->paused_keys == 1 ? "" : "s");
        buffer_printf(out, "</td><td class=\"blocked\">%lld</td></tr>",
                      (long long)q->blocked_keys);
    }
    buffer_puts(out, "</tbody></table>");
    buffer_printf(out, "<p class=\"note\">Ready, running and dead are exact counts from their "
                       "partial indexes, and so are a stream's rows waiting after its cursors. "
                       "Succeeded and a stream's published rows are %s.</p>",
                  overview->succeeded_estimated
                      ? "an estimate (&asymp;) from the planner's statistics of outbox.job, "
                        "as counting them would read the whole table"
                      : "exact (the table is small)");
}

static void
table_facts(struct buffer *out, const struct store_console_overview *overview)
{
    const struct store_status *status = &overview->status;
    const struct store_oldest_transaction *oldest = &status->oldest_transaction;
    char table[32], index[32], age[32];

    format_bytes(table, sizeof(table), status->table_bytes);
    format_bytes(index, sizeof(index), status->index_bytes);
    buffer_printf(out, "<dl class=\"facts\"><dt>Schema version</dt><dd id=\"schema-version\">"
                       "%d</dd><dt>outbox.job</dt><dd>%s table, %s indexes, &asymp;%lld live "
                       "rows (estimate)</dd><dt>Dead tuples</dt><dd>%lld (not yet vacuumed)</dd>"
                       "<dt>Last autovacuum</dt><dd>",
                  status->schema_version, table, index, (long long)status->live_tuples,
                  (long long)status->dead_tuples);
    esc(out, status->last_autovacuum ? status->last_autovacuum : "never");
    buffer_puts(out, "</dd><dt>Vacuum horizon held by</dt><dd>");
    if (oldest->present && oldest->prepared_gid != NULL && oldest->prepared_gid[0] != '\0') {
        format_age(age, sizeof(age), oldest->age_seconds);
        buffer_puts(out, "the prepared transaction <code>");
        esc(out, oldest->prepared_gid);
        buffer_puts(out, "</code> (database ");
        esc(out, oldest->database);
        buffer_printf(out, "), prepared %s ago, %lld transactions behind: end it with "
                           "<code>COMMIT PREPARED</code> or <code>ROLLBACK PREPARED</code>",
                      age, (long long)oldest->xid_age);
    } else if (oldest->present) {
        format_age(age, sizeof(age), oldest->age_seconds);
        buffer_printf(out, "pid %d (", oldest->pid);
        esc(out, oldest->application_name);
        buffer_puts(out, ", ");
        esc(out, oldest->state);
        buffer_printf(out, "), transaction age %s, %lld transactions behind", age,
                      (long long)oldest->xid_age);
    } else {
        buffer_puts(out, "nobody");
    }
    buffer_puts(out, "</dd></dl>");
}

/*
 * Writes a section's heading and, when it has rows, the head of its table
 * (columns NULL-terminated); with none, the note empty instead and false.
 */
static bool
table_open(struct buffer *out, const char *title, size_t rows, const char *empty, const char *id,
           const char *const columns[])
{
    buffer_printf(out, "<h2>%s</h2>", title);
    if (rows == 0) {
        buffer_printf(out, "<p class=\"note\">%s</p>", empty);
        return false;
    }
    buffer_printf(out, "<table id=\"%s\"><thead><tr>", id);
    for (size_t i = 0; columns[i] != NULL; i++)
        buffer_printf(out, "<th>%s</th>", columns[i]);
    buffer_puts(out, "</tr></thead><tbody>");
    return true;
}

static void
relays_table(struct buffer *out, const struct store_console_overview *overview)
{
    static const char *const columns[] = {"Worker id", "Rows held", "First lease expires in",
                                          "Last lease expires in", NULL};

    if (!table_open(out, "Relays seen", overview->relay_count,
                    "No relay holds a lease right now.", "relays", columns))
        return;
    for (size_t i = 0; i < overview->relay_count; i++) {
        const struct store_console_relay *relay = &overview->relays[i];

        buffer_puts(out, "<tr><td>");
        esc(out, relay->worker_id);
        buffer_printf(out, "</td><td>%lld</td><td>%.1fs</td><td>%.1fs</td></tr>",
                      (long long)relay->rows, relay->lease_min_seconds,
                      relay->lease_max_seconds);
    }
    buffer_puts(out, "</tbody></table>");
}

/* Each stream partition's lag and owner, then who holds the snapshot horizon. */
static void
streams_table(struct buffer *out, const struct store_console_streams *streams)
{
    static const char *const columns[] = {"Queue", "Partition", "Lag (rows)", "Lag (age)",
                                          "Owner",  "Lease until", NULL};
    const struct stream_horizon *horizon = &streams->horizon;
    char age[32];

    if (!table_open(out, "Streams", streams->count, "No queue is a stream.", "streams", columns))
        return;
    for (size_t i = 0; i < streams->count; i++) {
        const struct stream_lag *lag = &streams->partitions[i];

        format_age(age, sizeof(age), lag->seconds);
        buffer_puts(out, "<tr data-queue=\"");
        esc(out, lag->queue);
        buffer_printf(out, "\" data-partition=\"%d\"><td class=\"queue\">", lag->partition);
        esc(out, lag->queue);
        buffer_printf(out, "</td><td class=\"partition\">%d</td><td class=\"lag-rows\">%lld%s"
                           "</td><td class=\"lag-age\">%s</td><td class=\"owner\">",
                      lag->partition, (long long)lag->rows,
                      lag->rows >= STREAM_LAG_COUNT_MAX ? "+" : "", lag->rows > 0 ? age : "-");
        esc(out, lag->owner[0] != '\0' ? lag->owner : "none");
        buffer_puts(out, "</td><td class=\"lease\">");
        esc(out, lag->lease_until[0] != '\0' ? lag->lease_until : "-");
        buffer_puts(out, "</td></tr>");
    }
    buffer_puts(out, "</tbody></table><p class=\"note\" id=\"stream-horizon\">");
    if (!horizon->found) {
        buffer_puts(out, "No open transaction holds the streams back.</p>");
        return;
    }
    format_age(age, sizeof(age), horizon->seconds);
    if (horizon->prepared[0] != '\0') {
        buffer_puts(out, "Streams read only rows of transactions older than the oldest one open: "
                         "the prepared transaction <code class=\"gid\">");
        esc(out, horizon->prepared);
        buffer_puts(out, "</code> (owner ");
        esc(out, horizon->user);
        buffer_puts(out, ", database ");
        esc(out, horizon->database);
        buffer_printf(out, "), prepared %s ago. End it with <code>COMMIT PREPARED</code> or "
                           "<code>ROLLBACK PREPARED</code> of that gid.</p>",
                      age);
        return;
    }
    buffer_printf(out, "Streams read only rows of transactions older than the oldest one open: "
                       "pid <span class=\"pid\">%d</span> (",
                  horizon->pid);
    esc(out, horizon->application[0] != '\0' ? horizon->application : "no application name");
    buffer_puts(out, ", ");
    esc(out, horizon->user);
    buffer_printf(out, "), open for %s, last statement <code>", age);
    esc(out, horizon->query);
    buffer_puts(out, "</code>.</p>");
}

static void
overview_page(struct console *console, PGconn *conn, const struct console_request *request,
              struct console_response *response)
{
    struct store_console_overview overview;
    struct store_console_chart chart;
    struct store_console_streams streams;
    struct outbox_error err;
    struct buffer *out = &response->body;

    if (store_console_overview(conn, STORE_CONSOLE_EVERYTHING, &overview, &err) < 0) {
        console_database_failed(&err);
        return database_banner(console, request, response, "Overview", "/", err.message);
    }
    if (store_console_chart(conn, &chart, &err) < 0 ||
        store_console_streams(conn, &streams, &err) < 0) {
        store_console_overview_clear(&overview);
        console_database_failed(&err);
        return database_banner(console, request, response, "Overview", "/", err.message);
    }
    page_start(console, request, out, "Overview", "/");
    buffer_puts(out, "<h1>Overview</h1><h2>Queues</h2>");
    queues_table(out, &overview);
    streams_table(out, &streams);
    buffer_puts(out, "<h2>Last hour</h2>");
    chart_svg(out, &chart);
    buffer_puts(out, "<h2>Table</h2>");
    table_facts(out, &overview);
    relays_table(out, &overview);
    page_end(out);
    store_console_overview_clear(&overview);
    store_console_streams_clear(&streams);
    respond_html(response, 200);
}

/* ---- action forms ---- */

/* Opens a form that console.js posts as JSON to api; done names the outcome. */
static void
action_form(struct buffer *out, bool allowed, const char *api, const char *done, const char *cls)
{
    buffer_printf(out, "<form class=\"action %s\" data-api=\"/api/v1/%s\" data-done=\"%s\" "
                       "data-reload>%s",
                  cls, api, done, allowed ? "" : "<fieldset disabled>");
}

static void
action_form_end(struct buffer *out, bool allowed)
{
    buffer_puts(out, allowed ? "</form>" : "</fieldset></form>");
}

static void
hidden(struct buffer *out, const char *name, const char *value)
{
    if (value == NULL || value[0] == '\0')
        return;
    buffer_printf(out, "<input type=\"hidden\" name=\"%s\" value=\"", name);
    esc(out, value);
    buffer_puts(out, "\">");
}

static void
job_button(struct buffer *out, bool allowed, const char *api, const char *done, int64_t job_id,
           const char *label)
{
    char id[24];

    snprintf(id, sizeof(id), "%lld", (long long)job_id);
    action_form(out, allowed, api, done, "inline");
    hidden(out, "job_ids", id);
    buffer_printf(out, "<button type=\"submit\">%s</button>", label);
    action_form_end(out, allowed);
}

/* ---- dead rows ---- */

static void
dead_filter_form(struct buffer *out, const struct store_dead_filter *filter, int64_t limit)
{
    buffer_puts(out, "<form method=\"get\" action=\"/dead\" class=\"filter\">"
                     "<label>Queue <input name=\"queue\" value=\"");
    esc(out, filter->queue);
    buffer_puts(out, "\"></label> <label>Ordering key <input name=\"key\" value=\"");
    esc(out, filter->ordering_key);
    buffer_puts(out, "\"></label> <label>Error contains <input name=\"error\" value=\"");
    esc(out, filter->error_text);
    buffer_printf(out, "\"></label> <label>Limit <input name=\"limit\" type=\"number\" min=\"1\" "
                       "max=\"%d\" value=\"%lld\"></label> <button type=\"submit\">Filter</button>"
                       "</form>",
                  CONSOLE_DEAD_LIMIT_MAX, (long long)limit);
}

static void
dead_row(struct buffer *out, bool allowed, const struct store_dead_job *job)
{
    buffer_printf(out, "<tr data-job-id=\"%lld\"><td>%lld</td><td class=\"queue\">",
                  (long long)job->job_id, (long long)job->job_id);
    esc(out, job->queue);
    buffer_puts(out, "</td><td class=\"key\">");
    esc(out, job->ordering_key);
    buffer_printf(out, "</td><td>%d/%d</td><td>", (int)job->attempts, (int)job->max_attempts);
    esc(out, job->finished_at);
    buffer_puts(out, "</td><td class=\"last-error\"><details><summary>");
    esc(out, job->last_error ? job->last_error : "(no error recorded)");
    buffer_puts(out, "</summary><h3>last_error</h3><pre class=\"error-text\">");
    esc(out, job->last_error);
    buffer_puts(out, "</pre><h3>payload</h3><pre class=\"payload\">");
    esc(out, job->payload);
    buffer_puts(out, "</pre><h3>headers</h3><pre class=\"headers\">");
    esc(out, job->headers);
    buffer_puts(out, "</pre></details></td><td class=\"actions\">");
    job_button(out, allowed, "dead/retry", "retried", job->job_id, "Retry");
    job_button(out, allowed, "dead/delete", "deleted", job->job_id, "Delete");
    buffer_puts(out, "</td></tr>");
}

static void
dead_page(struct console *console, PGconn *conn, const struct console_request *request,
          struct console_response *response)
{
    char queue[256], key[1024], error[1024], number[32];
    const char *q = request->query;
    size_t q_len = strlen(q);
    struct store_dead_filter filter = {0};
    struct store_dead_list list;
    struct outbox_error err;
    struct buffer *out = &response->body;
    int64_t limit = CONSOLE_DEAD_LIMIT_DEFAULT;
    char *end;

    filter.queue = console_param(q, q_len, "queue", queue, sizeof(queue)) ? queue : NULL;
    filter.ordering_key = console_param(q, q_len, "key", key, sizeof(key)) ? key : NULL;
    filter.error_text = console_param(q, q_len, "error", error, sizeof(error)) ? error : NULL;
    if (console_param(q, q_len, "limit", number, sizeof(number))) {
        limit = strtoll(number, &end, 10);
        if (*end != '\0' || limit < 1 || limit > CONSOLE_DEAD_LIMIT_MAX)
            return console_respond_text(response, 400, "limit must be an integer from 1 to 10000");
    }
    if (store_dead_list(conn, &filter, limit, &list, &err) < 0) {
        console_database_failed(&err);
        return database_banner(console, request, response, "Dead rows", "/dead", err.message);
    }
    page_start(console, request, out, "Dead rows", "/dead");
    buffer_printf(out, "<h1>Dead rows</h1>");
    dead_filter_form(out, &filter, limit);
    buffer_printf(out, "<p class=\"note\">%zu row%s shown (at most %lld). Retry makes a row "
                       "ready again with one more attempt; delete removes it for good.</p>",
                  list.count, list.count == 1 ? "" : "s", (long long)limit);
    if (filter.queue != NULL || filter.ordering_key != NULL || filter.error_text != NULL) {
        action_form(out, console->allow_actions, "dead/retry", "retried", "bulk");
        hidden(out, "queue", filter.queue);
        hidden(out, "ordering_key", filter.ordering_key);
        hidden(out, "error", filter.error_text);
        buffer_puts(out, "<button type=\"submit\">Retry every dead row matching the filter"
                         "</button>");
        action_form_end(out, console->allow_actions);
    }
    buffer_puts(out, "<table id=\"dead\"><thead><tr><th>Job</th><th>Queue</th>"
                     "<th>Ordering key</th><th>Attempts</th><th>Finished</th>"
                     "<th>Last error (open for payload and headers)</th><th></th></tr>"
                     "</thead><tbody>");
    for (size_t i = 0; i < list.count; i++)
        dead_row(out, console->allow_actions, &list.jobs[i]);
    buffer_puts(out, "</tbody></table>");
    page_end(out);
    store_dead_list_clear(&list);
    respond_html(response, 200);
}

/* ---- keys and pauses ---- */

static void
blocked_table(struct buffer *out, bool allowed, const struct store_status *status)
{
    static const char *const columns[] = {"Queue",      "Ordering key", "Head job",
                                          "Head state", "Attempts",     "Last error",
                                          "Waiting behind", "", NULL};

    if (!table_open(out, "Blocked keys", status->blocked_count,
                    "No ordering key is held up by its head.", "blocked", columns))
        return;
    for (size_t i = 0; i < status->blocked_count; i++) {
        const struct store_blocked_key *key = &status->blocked[i];

        buffer_puts(out, "<tr><td>");
        esc(out, key->queue);
        buffer_puts(out, "</td><td class=\"key\">");
        esc(out, key->ordering_key);
        buffer_printf(out, "</td><td>%lld</td><td>", (long long)key->head_job_id);
        esc(out, key->head_state);
        buffer_printf(out, "</td><td>%d/%d</td><td class=\"last-error\">", (int)key->attempts,
                      (int)key->max_attempts);
        esc(out, key->last_error);
        buffer_printf(out, "</td><td>%lld</td><td>", (long long)key->waiting);
        if (strcmp(key->head_state ? key->head_state : "", "dead") == 0)
            job_button(out, allowed, "dead/retry", "retried", key->head_job_id, "Retry head");
        buffer_puts(out, "</td></tr>");
    }
    buffer_puts(out, "</tbody></table>");
}

static void
paused_table(struct buffer *out, bool allowed, const struct store_pause_list *list)
{
    static const char *const columns[] = {"Queue", "Ordering key", "Reason", "By", "Since", "",
                                          NULL};

    if (!table_open(out, "Paused", list->count, "Nothing is paused.", "paused", columns))
        return;
    for (size_t i = 0; i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];

        buffer_puts(out, "<tr><td class=\"queue\">");
        esc(out, pause->queue);
        buffer_puts(out, "</td><td class=\"key\">");
        esc(out, pause->ordering_key ? pause->ordering_key : "(whole queue)");
        buffer_puts(out, "</td><td>");
        esc(out, pause->reason);
        buffer_puts(out, "</td><td>");
        esc(out, pause->paused_by);
        buffer_puts(out, "</td><td>");
        esc(out, pause->paused_at);
        buffer_puts(out, "</td><td>");
        action_form(out, allowed, "resume", "resumed", "inline");
        hidden(out, "queue", pause->queue);
        hidden(out, "ordering_key", pause->ordering_key);
        buffer_puts(out, "<button type=\"submit\">Resume</button>");
        action_form_end(out, allowed);
        buffer_puts(out, "</td></tr>");
    }
    buffer_puts(out, "</tbody></table>");
}

static void
keys_page(struct console *console, PGconn *conn, const struct console_request *request,
          struct console_response *response)
{
    struct store_console_overview overview;
    struct outbox_error err;
    struct buffer *out = &response->body;
    bool allowed = console->allow_actions;

    if (store_console_overview(conn, STORE_CONSOLE_BLOCKED | STORE_CONSOLE_PAUSED, &overview,
                               &err) < 0) {
        console_database_failed(&err);
        return database_banner(console, request, response, "Keys and pauses", "/keys",
                               err.message);
    }
    page_start(console, request, out, "Keys and pauses", "/keys");
    buffer_puts(out, "<h1>Keys and pauses</h1>");
    blocked_table(out, allowed, &overview.status);
    paused_table(out, allowed, &overview.status.paused);
    buffer_puts(out, "<h2>Pause or resume</h2>");
    action_form(out, allowed, "pause", "paused", "pause");
    buffer_puts(out, "<label>Queue <input name=\"queue\" required></label> "
                     "<label>Ordering key (empty: the whole queue) <input name=\"ordering_key\">"
                     "</label> <label>Reason <input name=\"reason\"></label> "
                     "<button type=\"submit\">Pause</button>");
    action_form_end(out, allowed);
    action_form(out, allowed, "resume", "resumed", "resume");
    buffer_puts(out, "<label>Queue <input name=\"queue\" required></label> "
                     "<label>Ordering key <input name=\"ordering_key\"></label> "
                     "<button type=\"submit\">Resume</button>");
    action_form_end(out, allowed);
    buffer_puts(out, "<p class=\"note\">Relays stop claiming a paused queue or key at their "
                     "next claim; producers go on enqueueing.</p>");
    page_end(out);
    store_console_overview_clear(&overview);
    respond_html(response, 200);
}

/* ---- replay ---- */

static void
replay_page(struct console *console, const struct console_request *request,
            struct console_response *response)
{
    struct buffer *out = &response->body;
    bool allowed = console->allow_actions;

    page_start(console, request, out, "Replay", "/replay");
    buffer_puts(out, "<h1>Replay</h1><p class=\"note\">Publishes succeeded rows again, in "
                     "their order per key: those finished in a time range, or the given job "
                     "ids. Count them first (dry run); the replay button opens once the "
                     "count is shown, for exactly those fields.</p>");
    buffer_printf(out, "<form class=\"action replay\" id=\"replay-form\" "
                       "data-api=\"/api/v1/replay\" data-done=\"replayed\" data-replay>%s",
                  allowed ? "" : "<fieldset disabled>");
    buffer_puts(out, "<label>Queue <input name=\"queue\" required></label> "
                     "<label>Since <input name=\"since\" placeholder=\"2026-01-31 12:00+00\">"
                     "</label> <label>Until <input name=\"until\" placeholder=\"now\"></label> "
                     "<label>or job ids <input name=\"job_ids\" placeholder=\"12, 13\"></label> "
                     "<label>Ordering key <input name=\"ordering_key\"></label> "
                     "<button type=\"submit\" name=\"mode\" value=\"dry\">Count (dry run)"
                     "</button> <button type=\"submit\" name=\"mode\" value=\"run\" "
                     "id=\"replay-run\" disabled>Replay</button>");
    action_form_end(out, allowed);
    page_end(out);
    respond_html(response, 200);
}

void
console_html(struct console *console, const struct console_request *request,
             struct console_response *response)
{
    const char *path = request->path;
    PGconn *conn;

    if (strcmp(path, "/login") == 0) {
        if (strcmp(request->method, "POST") == 0)
            return login_post(console, (struct console_request *)request, response);
        return login_page(console, request, response, 200, NULL);
    }
    if (strcmp(path, "/logout") == 0) {
        console_auth_logout(console, (struct console_request *)request);
        response->status = 303;
        buffer_puts(&response->headers, "Set-Cookie: " SESSION_COOKIE "=; Path=/; HttpOnly; "
                                        "SameSite=Strict; Max-Age=0\r\nLocation: /login\r\n");
        return;
    }
    if (request->identity == CONSOLE_NOBODY)
        return login_page(console, request, response, 401, NULL);
    if (strcmp(path, "/replay") == 0)
        return replay_page(console, request, response);
    if (strcmp(path, "/") != 0 && strcmp(path, "/dead") != 0 && strcmp(path, "/keys") != 0)
        return console_respond_text(response, 404, "not found");
    if ((conn = console_database(console)) == NULL)
        return database_banner(console, request, response, "Overview", path,
                               console_database_error());
    if (strcmp(path, "/dead") == 0)
        return dead_page(console, conn, request, response);
    if (strcmp(path, "/keys") == 0)
        return keys_page(console, conn, request, response);
    overview_page(console, conn, request, response);
}
