/*
 * outboxctl status: jobs per queue and state, table and vacuum figures, the
 * oldest transaction, blocked ordering keys and pauses, as text tables or
 * one JSON object (--json). Reading only; the JSON field names are an
 * interface scripts rely on.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actions.h"
#include "console_chart.h"
#include "ctl.h"
#include "parse.h"
#include "retention.h"

/* Longest last_error shown in status's blocked keys table; --json has it whole. */
#define BLOCKED_ERROR_WIDTH 60

/* The blocked keys of one queue, as the JSON array of its "blocked". */
static void
print_blocked_json(const struct store_status *status, const char *queue)
{
    for (size_t k = 0, shown = 0; k < status->blocked_count; k++) {
        const struct store_blocked_key *key = &status->blocked[k];

        if (strcmp(key->queue, queue) != 0)
            continue;
        fputs(shown++ > 0 ? ",{\"ordering_key\":" : "{\"ordering_key\":", stdout);
        ctl_json_string(stdout, key->ordering_key);
        printf(",\"head_job_id\":%lld,\"head_state\":", (long long)key->head_job_id);
        ctl_json_string(stdout, key->head_state);
        printf(",\"attempts\":%d,\"max_attempts\":%d,\"retry_in_seconds\":", (int)key->attempts,
               (int)key->max_attempts);
        if (key->retry_in_seconds < 0)
            fputs("null", stdout); /* never */
        else
            printf("%.3f", key->retry_in_seconds);
        printf(",\"waiting\":%lld,\"last_error\":", (long long)key->waiting);
        ctl_json_string(stdout, key->last_error);
        fputs("}", stdout);
    }
}

/* The queues, each with its blocked keys, as the JSON array of "queues". */
static void
print_queues_json(const struct store_status *status)
{
    for (size_t i = 0; i < status->queue_count; i++) {
        const struct store_queue_status *queue = &status->queues[i];

        printf("%s{\"queue\":", i > 0 ? "," : "");
        ctl_json_string(stdout, queue->queue);
        printf(",\"ready\":%lld,\"running\":%lld,\"succeeded\":%lld,\"dead\":%lld,"
               "\"stream\":%s,\"stream_published\":%lld,\"stream_waiting\":%lld,"
               "\"oldest_ready_age_seconds\":%.3f,\"paused\":%s,\"paused_keys\":%lld,"
               "\"blocked_keys\":%lld,\"blocked\":[",
               (long long)queue->ready, (long long)queue->running, (long long)queue->succeeded,
               (long long)queue->dead, queue->stream ? "true" : "false",
               (long long)queue->stream_published, (long long)queue->stream_waiting,
               queue->oldest_ready_seconds,
               queue->paused ? "true" : "false", (long long)queue->paused_keys,
               (long long)queue->blocked_keys);
        print_blocked_json(status, queue->queue);
        fputs("]}", stdout);
    }
}

/* The oldest transaction as a JSON object, or null when there is none. */
static void
print_oldest_json(const struct store_oldest_transaction *oldest)
{
    if (!oldest->present) {
        fputs("null", stdout);
        return;
    }
    printf("{\"pid\":%d,\"application_name\":", oldest->pid);
    ctl_json_string(stdout, oldest->application_name);
    fputs(",\"state\":", stdout);
    ctl_json_string(stdout, oldest->state);
    printf(",\"age_seconds\":%.3f,\"xid_age\":%lld,\"database\":", oldest->age_seconds,
           (long long)oldest->xid_age);
    ctl_json_string(stdout, oldest->database);
    fputs(",\"prepared_gid\":", stdout);
    if (oldest->prepared_gid != NULL && oldest->prepared_gid[0] != '\0')
        ctl_json_string(stdout, oldest->prepared_gid);
    else
        fputs("null", stdout);
    fputs("}", stdout);
}

static void
print_status_json(const struct store_status *status)
{
    printf("{\"schema_version\":%d,\"identity\":", status->schema_version);
    ctl_identity_json(stdout, &status->identity);
    fputs(",\"queues\":[", stdout);
    print_queues_json(status);
    fputs("],\"paused\":", stdout);
    ctl_print_pauses_json(&status->paused);
    printf(",\"table\":{\"table_bytes\":%lld,\"index_bytes\":%lld,\"live_tuples\":%lld,"
           "\"dead_tuples\":%lld,\"last_autovacuum\":",
           (long long)status->table_bytes, (long long)status->index_bytes,
           (long long)status->live_tuples, (long long)status->dead_tuples);
    ctl_json_string(stdout, status->last_autovacuum);
    fputs(",\"last_autoanalyze\":", stdout);
    ctl_json_string(stdout, status->last_autoanalyze);
    printf(",\"retention_seconds\":%.0f,\"succeeded_rows\":%lld,"
           "\"succeeded_past_retention_rows\":%lld,"
           "\"oldest_succeeded_past_retention_seconds\":%.3f",
           status->retention_seconds, (long long)status->cleanup.succeeded_rows,
           (long long)status->cleanup.past_retention_rows,
           status->cleanup.oldest_past_retention_seconds);
    fputs("},\"oldest_transaction\":", stdout);
    print_oldest_json(&status->oldest_transaction);
    fputs("}\n", stdout);
}

/* The succeeded rows' line: how many, and how many of them are past the retention. */
static void
succeeded_text(char *line, size_t size, const struct store_status *status)
{
    if (status->cleanup.past_retention_rows > 0)
        snprintf(line, size, "%lld, of them %lld past the retention of %.0fs (the oldest by %.1fs)",
                 (long long)status->cleanup.succeeded_rows,
                 (long long)status->cleanup.past_retention_rows, status->retention_seconds,
                 status->cleanup.oldest_past_retention_seconds);
    else if (status->retention_seconds <= 0)
        snprintf(line, size, "%lld, kept (retention 0)", (long long)status->cleanup.succeeded_rows);
    else
        snprintf(line, size, "%lld, none past the retention of %.0fs",
                 (long long)status->cleanup.succeeded_rows, status->retention_seconds);
}

/* The oldest transaction's line: who holds the xmin horizon back, and by how much. */
static void
oldest_transaction_text(char *line, size_t size, const struct store_oldest_transaction *oldest)
{
    if (oldest->present && oldest->prepared_gid[0] != '\0')
        snprintf(line, size,
                 "prepared transaction '%s' (database %s), prepared %.1fs ago, xmin %lld"
                 " transactions old: end it with COMMIT PREPARED or ROLLBACK PREPARED '%s'",
                 oldest->prepared_gid, oldest->database, oldest->age_seconds,
                 (long long)oldest->xid_age, oldest->prepared_gid);
    else if (oldest->present)
        snprintf(line, size, "pid %d (%s, %s, database %s), open %.1fs, xmin %lld transactions old",
                 oldest->pid,
                 oldest->application_name[0] ? oldest->application_name : "no application name",
                 oldest->state[0] ? oldest->state : "unknown state", oldest->database,
                 oldest->age_seconds, (long long)oldest->xid_age);
    else
        snprintf(line, size, "none");
}

/* The summary: schema, table size and vacuum, succeeded rows, oldest transaction (2 columns). */
static bool
summary_rows(struct ctl_table *summary, const struct store_status *status)
{
    char a[64], b[64], line[640];
    bool ok = true;

    snprintf(a, sizeof(a), "%d", status->schema_version);
    ok = ok && ctl_table_add_row(summary, "schema version", a);
    ctl_identity_text(line, sizeof(line), &status->identity);
    ok = ok && ctl_table_add_row(summary, "database identity", line);
    snprintf(line, sizeof(line), "%s table, %s indexes",
             ctl_format_bytes(a, sizeof(a), status->table_bytes),
             ctl_format_bytes(b, sizeof(b), status->index_bytes));
    ok = ok && ctl_table_add_row(summary, "outbox.job size", line);
    snprintf(line, sizeof(line), "%lld live, %lld dead (not yet vacuumed)",
             (long long)status->live_tuples, (long long)status->dead_tuples);
    ok = ok && ctl_table_add_row(summary, "row versions", line);
    ok = ok && ctl_table_add_row(summary, "last autovacuum",
                                 status->last_autovacuum ? status->last_autovacuum : "never");
    ok = ok && ctl_table_add_row(summary, "last autoanalyze",
                                 status->last_autoanalyze ? status->last_autoanalyze : "never");
    succeeded_text(line, sizeof(line), status);
    ok = ok && ctl_table_add_row(summary, "succeeded rows", line);
    oldest_transaction_text(line, sizeof(line), &status->oldest_transaction);
    ok = ok && ctl_table_add_row(summary, "oldest transaction", line);
    return ok;
}

/* The header and one row per queue (9 columns; the stream ones "-" for row-state queues). */
static bool
queue_rows(struct ctl_table *queues, const struct store_status *status)
{
    char a[64], b[64], c[64], d[64], e[64], f[64], g[64], h[64];
    bool ok = ctl_table_add_row(queues, "QUEUE", "READY", "RUNNING", "SUCCEEDED", "DEAD",
                                "OLDEST READY", "BLOCKED KEYS", "STREAM PUBLISHED",
                                "STREAM WAITING");

    for (size_t i = 0; ok && i < status->queue_count; i++) {
        const struct store_queue_status *queue = &status->queues[i];

        snprintf(a, sizeof(a), "%lld", (long long)queue->ready);
        snprintf(b, sizeof(b), "%lld", (long long)queue->running);
        snprintf(c, sizeof(c), "%lld", (long long)queue->succeeded);
        snprintf(d, sizeof(d), "%lld", (long long)queue->dead);
        snprintf(e, sizeof(e), "%.1fs", queue->oldest_ready_seconds);
        snprintf(f, sizeof(f), "%lld", (long long)queue->blocked_keys);
        snprintf(g, sizeof(g), "%lld", (long long)queue->stream_published);
        snprintf(h, sizeof(h), "%lld", (long long)queue->stream_waiting);
        if (!queue->stream && queue->stream_published + queue->stream_waiting == 0) {
            snprintf(g, sizeof(g), "-");
            snprintf(h, sizeof(h), "-");
        }
        ok = ctl_table_add_row(queues, queue->queue, a, b, c, d, e, f, g, h);
    }
    return ok;
}

/* What a blocked key's head is doing, as the HEAD STATE column says it. */
static void
head_state_text(char *buf, size_t size, const struct store_blocked_key *key)
{
    bool ready = strcmp(key->head_state, "ready") == 0;
    bool running = strcmp(key->head_state, "running") == 0;

    if (ready && key->retry_in_seconds < 0)
        snprintf(buf, size, "retry never");
    else if (ready && key->retry_in_seconds > 0)
        snprintf(buf, size, "retry in %.0fs", key->retry_in_seconds);
    else if (ready)
        snprintf(buf, size, "retry due");
    else if (running && key->last_error != NULL)
        snprintf(buf, size, "retrying");
    else if (running)
        snprintf(buf, size, "running");
    else
        snprintf(buf, size, "%s", key->head_state);
}

/* The header and one row per blocked ordering key (7 columns). */
static bool
blocked_rows(struct ctl_table *blocked, const struct store_status *status)
{
    char a[64], b[64], c[64], d[64], key_text[256];
    bool ok = ctl_table_add_row(blocked, "QUEUE", "ORDERING KEY", "HEAD JOB", "HEAD STATE",
                                "ATTEMPTS", "WAITING", "LAST ERROR");

    for (size_t i = 0; ok && i < status->blocked_count; i++) {
        const struct store_blocked_key *key = &status->blocked[i];
        char error[BLOCKED_ERROR_WIDTH + 4];

        snprintf(a, sizeof(a), "%lld", (long long)key->head_job_id);
        head_state_text(b, sizeof(b), key);
        snprintf(c, sizeof(c), "%d/%d", (int)key->attempts, (int)key->max_attempts);
        snprintf(d, sizeof(d), "%lld", (long long)key->waiting);
        ctl_one_line(error, BLOCKED_ERROR_WIDTH + 1, key->last_error ? key->last_error : "-");
        if (key->last_error != NULL && strlen(key->last_error) > BLOCKED_ERROR_WIDTH)
            strcat(error, "...");
        ok = ctl_table_add_row(blocked, key->queue,
                               ctl_one_line(key_text, sizeof(key_text), key->ordering_key), a, b, c,
                               d, error);
    }
    return ok;
}

/* The tables of status, their order and their headings. */
struct status_tables {
    struct ctl_table summary;
    struct ctl_table queues;
    struct ctl_table blocked;
    struct ctl_table paused;
};

static void
print_status_tables(const struct status_tables *tables, const struct store_status *status)
{
    ctl_table_print(&tables->summary, stdout);
    fputc('\n', stdout);
    if (status->queue_count == 0)
        fputs("no jobs\n", stdout);
    else
        ctl_table_print(&tables->queues, stdout);
    if (status->blocked_count > 0) {
        printf("\nblocked ordering keys (head dead, retrying or stuck running;"
               " oldest %d per queue):\n",
               STORE_BLOCKED_KEYS_PER_QUEUE);
        ctl_table_print(&tables->blocked, stdout);
    }
    if (status->paused.count > 0) {
        fputs("\npaused (relays claim nothing of these):\n", stdout);
        ctl_table_print(&tables->paused, stdout);
    }
}

static int
print_status_text(const struct store_status *status)
{
    static const bool numbers[] = {false, true, true, true, true, true, true, true, true};
    static const bool blocked_numbers[] = {false, false, true, false, true, true, false};
    struct status_tables tables = {
        .summary = {.columns = 2},
        .queues = {.columns = 9, .right_aligned = numbers},
        .blocked = {.columns = 7, .right_aligned = blocked_numbers},
        .paused = {.columns = 5},
    };
    bool ok = summary_rows(&tables.summary, status) && queue_rows(&tables.queues, status);

    if (ok && status->blocked_count > 0)
        ok = blocked_rows(&tables.blocked, status);
    if (ok && status->paused.count > 0)
        ok = ctl_pauses_table(&tables.paused, &status->paused);
    if (ok)
        print_status_tables(&tables, status);
    ctl_table_clear(&tables.paused);
    ctl_table_clear(&tables.summary);
    ctl_table_clear(&tables.queues);
    ctl_table_clear(&tables.blocked);
    return ok ? 0 : ctl_out_of_memory();
}

int
ctl_command_status(struct ctl *ctl, int argc, char **argv, int first)
{
    struct store_status status;
    struct outbox_error err;
    bool json = false;
    const char *retention = getenv("OUTBOX_RETENTION");
    int64_t retention_seconds = 0;
    int taken, rc;

    const struct ctl_option options[] = {{"--json", NULL, &json},
                                         {"--retention", &retention, NULL}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 2)) != CTL_GO_ON)
        return taken;
    if (retention == NULL || retention[0] == '\0')
        retention = OUTBOX_RETENTION_DEFAULT;
    if (parse_duration(retention, &retention_seconds, &err) < 0)
        return ctl_usage_error("--retention: %s", err.message);
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_status(ctl->conn, (double)retention_seconds, &status, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    rc = 0;
    if (json)
        print_status_json(&status);
    else
        rc = print_status_text(&status);
    store_status_clear(&status);
    return rc;
}

/* ---- the console API ---- */

/* One queue's counts, as GET queues lists them. */
static void
queue_json(struct buffer *out, const struct store_queue_status *queue)
{
    buffer_puts(out, "{\"queue\":");
    console_json_string(out, queue->queue);
    buffer_printf(out, ",\"ready\":%lld,\"running\":%lld,\"succeeded\":%lld,\"dead\":%lld",
                  (long long)queue->ready, (long long)queue->running, (long long)queue->succeeded,
                  (long long)queue->dead);
    /* an estimated succeeded: plus or minus this many rows (95 %); 0 when counted */
    api_field_int(out, "succeeded_margin", queue->succeeded_margin);
    buffer_printf(out, ",\"oldest_ready_seconds\":%.3f", queue->oldest_ready_seconds);
    api_field_bool(out, "paused", queue->paused);
    buffer_printf(out, ",\"paused_keys\":%lld,\"blocked_keys\":%lld", (long long)queue->paused_keys,
                  (long long)queue->blocked_keys);
    api_field_bool(out, "stream", queue->stream);
    buffer_printf(out, ",\"stream_published\":%lld,\"stream_waiting\":%lld",
                  (long long)queue->stream_published, (long long)queue->stream_waiting);
    buffer_puts(out, "}");
}

/* One blocked ordering key, as GET blocked lists them. */
static void
blocked_json(struct buffer *out, const struct store_blocked_key *key)
{
    buffer_puts(out, "{\"queue\":");
    console_json_string(out, key->queue);
    api_field_string(out, "ordering_key", key->ordering_key);
    api_field_int(out, "head_job_id", key->head_job_id);
    api_field_string(out, "head_state", key->head_state);
    buffer_printf(out, ",\"attempts\":%lld,\"max_attempts\":%lld", (long long)key->attempts,
                  (long long)key->max_attempts);
    api_field_string(out, "last_error", key->last_error);
    buffer_printf(out, ",\"retry_in_seconds\":%.3f", key->retry_in_seconds);
    api_field_int(out, "waiting", key->waiting);
    buffer_puts(out, "}");
}

static void
pauses_json(struct buffer *out, const struct store_pause_list *list)
{
    buffer_puts(out, "[");
    for (size_t i = 0; i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];

        buffer_puts(out, i > 0 ? ",{\"queue\":" : "{\"queue\":");
        console_json_string(out, pause->queue);
        api_field_string(out, "ordering_key", pause->ordering_key);
        api_field_string(out, "reason", pause->reason);
        api_field_string(out, "paused_by", pause->paused_by);
        api_field_string(out, "paused_at", pause->paused_at);
        buffer_puts(out, "}");
    }
    buffer_puts(out, "]");
}

static void
relays_json(struct buffer *out, const struct store_console_overview *overview)
{
    buffer_puts(out, "[");
    for (size_t i = 0; i < overview->relay_count; i++) {
        const struct store_console_relay *relay = &overview->relays[i];

        buffer_puts(out, i > 0 ? ",{\"worker_id\":" : "{\"worker_id\":");
        console_json_string(out, relay->worker_id);
        api_field_int(out, "rows", relay->rows);
        buffer_printf(out, ",\"lease_expires_in_seconds\":%.3f,\"last_lease_expires_in_seconds\":%.3f",
                      relay->lease_min_seconds, relay->lease_max_seconds);
        buffer_puts(out, "}");
    }
    buffer_puts(out, "]");
}

static void
overview_json(struct buffer *out, const struct store_console_overview *overview, const char *only)
{
    const struct store_status *status = &overview->status;
    const struct store_oldest_transaction *oldest = &status->oldest_transaction;

    if (strcmp(only, "queues") == 0 || strcmp(only, "blocked") == 0) {
        bool queues = strcmp(only, "queues") == 0;
        size_t count = queues ? status->queue_count : status->blocked_count;

        buffer_puts(out, "[");
        for (size_t i = 0; i < count; i++) {
            if (i > 0)
                buffer_putc(out, ',');
            if (queues)
                queue_json(out, &status->queues[i]);
            else
                blocked_json(out, &status->blocked[i]);
        }
        buffer_puts(out, "]");
        return;
    }
    if (strcmp(only, "relays") == 0)
        return relays_json(out, overview);
    if (strcmp(only, "paused") == 0)
        return pauses_json(out, &status->paused);
    buffer_printf(out, "{\"schema_version\":%d", status->schema_version);
    api_field_bool(out, "succeeded_estimated", overview->succeeded_estimated);
    buffer_printf(out, ",\"table\":{\"table_bytes\":%lld,\"index_bytes\":%lld,"
                       "\"live_tuples_estimate\":%lld,\"dead_tuples\":%lld",
                  (long long)status->table_bytes, (long long)status->index_bytes,
                  (long long)status->live_tuples, (long long)status->dead_tuples);
    api_field_string(out, "last_autovacuum", status->last_autovacuum);
    api_field_string(out, "last_autoanalyze", status->last_autoanalyze);
    buffer_printf(out, "},\"vacuum_horizon\":{\"present\":%s", oldest->present ? "true" : "false");
    api_field_int(out, "pid", oldest->pid);
    api_field_string(out, "application_name", oldest->application_name);
    api_field_string(out, "state", oldest->state);
    buffer_printf(out, ",\"age_seconds\":%.3f", oldest->age_seconds);
    api_field_int(out, "xid_age", oldest->xid_age);
    api_field_string(out, "database", oldest->database);
    api_field_text_or_null(out, "prepared_gid", oldest->prepared_gid);
    buffer_puts(out, "},\"queues\":");
    overview_json(out, overview, "queues");
    buffer_puts(out, ",\"relays\":");
    relays_json(out, overview);
    buffer_puts(out, ",\"blocked_keys\":");
    overview_json(out, overview, "blocked");
    buffer_puts(out, ",\"paused\":");
    pauses_json(out, &status->paused);
    buffer_puts(out, "}");
}

/* What each endpoint of the overview reads: only what it shows. */
static unsigned
overview_parts(const char *only)
{
    if (strcmp(only, "queues") == 0)
        return STORE_CONSOLE_QUEUES;
    if (strcmp(only, "blocked") == 0)
        return STORE_CONSOLE_BLOCKED;
    if (strcmp(only, "paused") == 0)
        return STORE_CONSOLE_PAUSED;
    if (strcmp(only, "relays") == 0)
        return STORE_CONSOLE_RELAYS;
    return STORE_CONSOLE_EVERYTHING;
}

void
api_overview(struct api_call *call)
{
    const char *only = call->path;
    struct console_response *response = call->response;
    struct store_console_overview overview;
    struct outbox_error err;

    if (store_console_overview(call->conn, overview_parts(only), &overview, &err) < 0)
        return api_respond_store_error(response, &err);
    overview_json(&response->body, &overview, only);
    store_console_overview_clear(&overview);
    api_respond_json(response, 200);
}

void
api_chart(struct api_call *call)
{
    struct console_response *response = call->response;
    struct store_console_chart chart;
    struct outbox_error err;
    struct buffer *out = &response->body;

    if (console_chart(call->conn, call->request->database, &chart, &err) < 0)
        return api_respond_store_error(response, &err);
    buffer_puts(out, "{\"minutes\":[");
    for (int i = 0; i < STORE_CONSOLE_CHART_MINUTES; i++)
        buffer_printf(out, "%s{\"minute\":%lld,\"enqueued\":%lld,\"published\":%lld}",
                      i > 0 ? "," : "", (long long)chart.minute_epoch[i],
                      (long long)chart.enqueued[i], (long long)chart.published[i]);
    buffer_puts(out, "]}");
    api_respond_json(response, 200);
}

/* The oldest snapshot holding the horizon back (the session, its age, what it runs), or null. */
static void
horizon_json(struct buffer *out, const struct stream_horizon *horizon)
{
    if (!horizon->found) {
        buffer_puts(out, "null");
        return;
    }
    buffer_printf(out, "{\"pid\":%d,\"age_seconds\":%.3f", horizon->pid, horizon->seconds);
    api_field_string(out, "user", horizon->user);
    api_field_string(out, "database", horizon->database);
    api_field_string(out, "application_name", horizon->application);
    api_field_string(out, "query", horizon->query);
    api_field_text_or_null(out, "prepared_gid", horizon->prepared);
    buffer_putc(out, '}');
}

static void
streams_json(struct buffer *out, const struct store_console_streams *streams)
{
    buffer_puts(out, "{\"partitions\":[");
    for (size_t i = 0; i < streams->count; i++) {
        const struct stream_lag *lag = &streams->partitions[i];

        buffer_puts(out, i > 0 ? ",{\"queue\":" : "{\"queue\":");
        console_json_string(out, lag->queue);
        api_field_int(out, "partition", lag->partition);
        api_field_int(out, "lag_rows", lag->rows);
        buffer_printf(out, ",\"lag_seconds\":%.3f", lag->seconds);
        api_field_text_or_null(out, "owner", lag->owner);
        api_field_text_or_null(out, "lease_until", lag->lease_until);
        buffer_puts(out, "}");
    }
    buffer_puts(out, "],\"horizon\":");
    horizon_json(out, &streams->horizon);
    buffer_putc(out, '}');
}

void
api_streams(struct api_call *call)
{
    struct console_response *response = call->response;
    struct store_console_streams streams;
    struct outbox_error err;

    if (store_console_streams(call->conn, &streams, &err) < 0)
        return api_respond_store_error(response, &err);
    streams_json(&response->body, &streams);
    store_console_streams_clear(&streams);
    api_respond_json(response, 200);
}
