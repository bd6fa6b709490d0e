/*
 * console_html_overview.c - the console's overview page: the queues, the
 * stream partitions, the traffic chart of the last hour, the table's
 * figures and the relays seen. Every value from the database goes through
 * console_html_escape().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console_chart.h"
#include "console_html.h"
#include "store_admin.h"
#include "store_console.h"

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
    buffer_printf(out,
                  "<svg class=\"chart\" viewBox=\"0 0 %d %d\" role=\"img\" "
                  "aria-label=\"rows enqueued and published per minute, last hour\">",
                  width, height);
    buffer_printf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>", left,
                  top + plot_h, left + plot_w, top + plot_h);
    buffer_printf(out,
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">%lld/min"
                  "</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">0"
                  "</text>",
                  left - 4, top + 10, (long long)max, left - 4, top + plot_h);
    buffer_printf(out,
                  "<text x=\"%d\" y=\"%d\" font-size=\"11\">-60 min</text>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">now</text>",
                  left, height - 10, left + plot_w, height - 10);
    for (int series = 0; series < 2; series++) {
        const int64_t *values = series == 0 ? chart->enqueued : chart->published;

        buffer_printf(out,
                      "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" "
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
    buffer_printf(out,
                  "<td class=\"stream-published\">%s%lld</td>"
                  "<td class=\"stream-waiting\">%lld</td>",
                  estimated ? "&asymp;" : "", (long long)q->stream_published,
                  (long long)q->stream_waiting);
}

static void
queues_table(struct buffer *out, const struct console_request *request,
             const struct store_console_overview *overview)
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
        console_html_escape(out, q->queue);
        buffer_printf(out, "\"%s><td class=\"queue\"><a href=\"/dead?queue=",
                      q->stream ? " data-stream" : "");
        console_html_escape(out, q->queue);
        console_html_database_param(out, request, '&');
        buffer_puts(out, "\">");
        console_html_escape(out, q->queue);
        buffer_printf(out,
                      "</a>%s</td><td class=\"ready\">%lld</td><td class=\"running\">%lld"
                      "</td><td class=\"succeeded\">%s%lld",
                      q->stream ? " <span class=\"badge stream\">stream</span>" : "",
                      (long long)q->ready, (long long)q->running,
                      overview->succeeded_estimated ? "&asymp;" : "", (long long)q->succeeded);
        if (overview->succeeded_estimated)
            buffer_printf(out, " <span class=\"margin\">&plusmn;%lld</span>",
                          (long long)q->succeeded_margin);
        buffer_printf(out, "</td><td class=\"dead\">%lld</td>", (long long)q->dead);
        queue_stream_cells(out, q, overview->succeeded_estimated);
        buffer_printf(out, "<td class=\"age\">%s</td><td class=\"paused\">%s",
                      q->ready + q->stream_waiting > 0 ? age : "-", q->paused ? "paused" : "");
        if (q->paused_keys > 0)
            buffer_printf(out, "%s%lld key%s", q->paused ? ", " : "", (long long)q->paused_keys,
                          q->paused_keys == 1 ? "" : "s");
        buffer_printf(out, "</td><td class=\"blocked\">%lld</td></tr>", (long long)q->blocked_keys);
    }
    buffer_puts(out, "</tbody></table>");
    buffer_printf(out,
                  "<p class=\"note\">Ready, running and dead are exact counts from their "
                  "partial indexes, and so are a stream's rows waiting after its cursors. "
                  "Succeeded and a stream's published rows are %s.</p>",
                  overview->succeeded_estimated
                      ? "an estimate (&asymp;) from the planner's statistics of outbox.job, "
                        "as counting them would read the whole table: a queue's share of "
                        "the rows ANALYZE sampled (the share left over, spread evenly, for a "
                        "queue outside its most common values), &plusmn; the margin of that "
                        "share at 95 % (a queue much larger or smaller than the others outside "
                        "that list is further off)"
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
    buffer_printf(out,
                  "<dl class=\"facts\"><dt>Schema version</dt><dd id=\"schema-version\">"
                  "%d</dd><dt>outbox.job</dt><dd>%s table, %s indexes, &asymp;%lld live "
                  "rows (estimate)</dd><dt>Dead tuples</dt><dd>%lld (not yet vacuumed)</dd>"
                  "<dt>Last autovacuum</dt><dd>",
                  status->schema_version, table, index, (long long)status->live_tuples,
                  (long long)status->dead_tuples);
    console_html_escape(out, status->last_autovacuum ? status->last_autovacuum : "never");
    buffer_puts(out, "</dd><dt>Vacuum horizon held by</dt><dd>");
    if (oldest->present && oldest->prepared_gid != NULL && oldest->prepared_gid[0] != '\0') {
        format_age(age, sizeof(age), oldest->age_seconds);
        buffer_puts(out, "the prepared transaction <code>");
        console_html_escape(out, oldest->prepared_gid);
        buffer_puts(out, "</code> (database ");
        console_html_escape(out, oldest->database);
        buffer_printf(out,
                      "), prepared %s ago, %lld transactions behind: end it with "
                      "<code>COMMIT PREPARED</code> or <code>ROLLBACK PREPARED</code>",
                      age, (long long)oldest->xid_age);
    } else if (oldest->present) {
        format_age(age, sizeof(age), oldest->age_seconds);
        buffer_printf(out, "pid %d (", oldest->pid);
        console_html_escape(out, oldest->application_name);
        buffer_puts(out, ", ");
        console_html_escape(out, oldest->state);
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
static void
relays_table(struct buffer *out, const struct store_console_overview *overview)
{
    static const char *const columns[] = {"Worker id", "Rows held", "First lease expires in",
                                          "Last lease expires in", NULL};

    if (!console_table_open(out, "Relays seen", overview->relay_count,
                            "No relay holds a lease right now.", "relays", columns))
        return;
    for (size_t i = 0; i < overview->relay_count; i++) {
        const struct store_console_relay *relay = &overview->relays[i];

        buffer_puts(out, "<tr><td>");
        console_html_escape(out, relay->worker_id);
        buffer_printf(out, "</td><td>%lld</td><td>%.1fs</td><td>%.1fs</td></tr>",
                      (long long)relay->rows, relay->lease_min_seconds, relay->lease_max_seconds);
    }
    buffer_puts(out, "</tbody></table>");
}

/* Each stream partition's lag and owner, then who holds the snapshot horizon. */
static void
streams_table(struct buffer *out, const struct store_console_streams *streams)
{
    static const char *const columns[] = {"Queue", "Partition",   "Lag (rows)", "Lag (age)",
                                          "Owner", "Lease until", NULL};
    const struct stream_horizon *horizon = &streams->horizon;
    char age[32];

    if (!console_table_open(out, "Streams", streams->count, "No queue is a stream.", "streams",
                            columns))
        return;
    for (size_t i = 0; i < streams->count; i++) {
        const struct stream_lag *lag = &streams->partitions[i];

        format_age(age, sizeof(age), lag->seconds);
        buffer_puts(out, "<tr data-queue=\"");
        console_html_escape(out, lag->queue);
        buffer_printf(out, "\" data-partition=\"%d\"><td class=\"queue\">", lag->partition);
        console_html_escape(out, lag->queue);
        buffer_printf(out,
                      "</td><td class=\"partition\">%d</td><td class=\"lag-rows\">%lld%s"
                      "</td><td class=\"lag-age\">%s</td><td class=\"owner\">",
                      lag->partition, (long long)lag->rows,
                      lag->rows >= STREAM_LAG_COUNT_MAX ? "+" : "", lag->rows > 0 ? age : "-");
        console_html_escape(out, lag->owner[0] != '\0' ? lag->owner : "none");
        buffer_puts(out, "</td><td class=\"lease\">");
        console_html_escape(out, lag->lease_until[0] != '\0' ? lag->lease_until : "-");
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
        console_html_escape(out, horizon->prepared);
        buffer_puts(out, "</code> (owner ");
        console_html_escape(out, horizon->user);
        buffer_puts(out, ", database ");
        console_html_escape(out, horizon->database);
        buffer_printf(out,
                      "), prepared %s ago. End it with <code>COMMIT PREPARED</code> or "
                      "<code>ROLLBACK PREPARED</code> of that gid.</p>",
                      age);
        return;
    }
    buffer_printf(out,
                  "Streams read only rows of transactions older than the oldest one open: "
                  "pid <span class=\"pid\">%d</span> (",
                  horizon->pid);
    console_html_escape(out, horizon->application[0] != '\0' ? horizon->application
                                                             : "no application name");
    buffer_puts(out, ", ");
    console_html_escape(out, horizon->user);
    buffer_printf(out, "), open for %s, last statement <code>", age);
    console_html_escape(out, horizon->query);
    buffer_puts(out, "</code>.</p>");
}

void
console_overview_page(struct console *console, PGconn *conn, struct console_request *request,
                      struct console_response *response)
{
    struct store_console_overview overview;
    struct store_console_chart chart;
    struct store_console_streams streams;
    struct outbox_error err;
    struct buffer *out = &response->body;

    if (store_console_overview(conn, STORE_CONSOLE_EVERYTHING, &overview, &err) < 0) {
        console_database_failed(&err);
        return console_page_banner(console, request, response, "Overview", "/", err.message);
    }
    if (console_chart(conn, request->database, &chart, &err) < 0 ||
        store_console_streams(conn, &streams, &err) < 0) {
        store_console_overview_clear(&overview);
        console_database_failed(&err);
        return console_page_banner(console, request, response, "Overview", "/", err.message);
    }
    console_page_start(console, request, out, "Overview", "/");
    buffer_puts(out, "<h1>Overview</h1><h2>Queues</h2>");
    queues_table(out, request, &overview);
    streams_table(out, &streams);
    buffer_puts(out, "<h2>Last hour</h2>");
    chart_svg(out, &chart);
    buffer_puts(out, "<h2>Table</h2>");
    table_facts(out, &overview);
    relays_table(out, &overview);
    console_page_end(out);
    store_console_overview_clear(&overview);
    store_console_streams_clear(&streams);
    console_page_respond(response, 200);
}
