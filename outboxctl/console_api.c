/*
 * console_api.c - the JSON API under /api/v1/: one function per endpoint,
 * the same store queries as the pages and outboxctl, and a strict reader
 * for the small JSON objects the actions take.
 *
 * Every action is logged on stderr in one line: who, what, on which rows,
 * how many. Bad input is a 400 with a one-line reason in {"error": ...}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "console_api.h"
#include "error.h"
#include "json.h"
#include "store_admin.h"
#include "store_console.h"

#define API_FIELDS_MAX 8 /* the fields an action may carry; any other is refused */

/* The fields an action may carry; each has_* says whether the body gave it. */
struct api_body {
    char queue[256];
    char ordering_key[1024];
    char error[1024];
    char reason[1024];
    char since[128];
    char until[128];
    int64_t *job_ids;
    size_t job_count;
    bool has_queue, has_key, has_error, has_reason, has_since, has_until, has_job_ids;
    bool dry_run;
};

/* ---- JSON out ---- */

/* Every string of an answer is written HTML-safe: a misread answer cannot become markup. */
void
console_json_string(struct buffer *out, const char *text)
{
    json_put_text(out, text, JSON_HTML_SAFE);
}

static void
json_key(struct buffer *out, bool first, const char *key)
{
    buffer_printf(out, "%s\"%s\":", first ? "" : ",", key);
}

static void
json_field_string(struct buffer *out, const char *key, const char *value)
{
    json_key(out, false, key);
    console_json_string(out, value);
}

/* A text that is "" or NULL for none (an owner, a lease) as a JSON string or null. */
static void
json_field_text_or_null(struct buffer *out, const char *key, const char *text)
{
    json_field_string(out, key, text != NULL && text[0] != '\0' ? text : NULL);
}

static void
json_field_int(struct buffer *out, const char *key, int64_t value)
{
    buffer_printf(out, ",\"%s\":%lld", key, (long long)value);
}

static void
json_field_bool(struct buffer *out, const char *key, bool value)
{
    buffer_printf(out, ",\"%s\":%s", key, value ? "true" : "false");
}

static void
respond_json(struct console_response *response, int status)
{
    response->status = status;
    response->content_type = "application/json";
    buffer_putc(&response->body, '\n');
}

static void
respond_error(struct console_response *response, int status, const char *reason)
{
    response->body.len = 0;
    buffer_puts(&response->body, "{\"error\":");
    console_json_string(&response->body, reason);
    buffer_putc(&response->body, '}');
    respond_json(response, status);
}

/* Answers a failed store call: bad input 400, database away 503, else 500. */
static void
respond_store_error(struct console_response *response, const struct outbox_error *err)
{
    int status = 500;

    console_database_failed(err);
    if (err->code == OUTBOX_ERR_INVALID || err->code == OUTBOX_ERR_CONSTRAINT)
        status = 400;
    else if (err->code == OUTBOX_ERR_CONNECTION || err->code == OUTBOX_ERR_TIMEOUT ||
             err->code == OUTBOX_ERR_SCHEMA || err->code == OUTBOX_ERR_BUSY)
        status = 503;
    respond_error(response, status, err->message);
}

/* ---- JSON in ---- */

/* What the body reader carries between members: the body and the keys seen. */
struct body_reader {
    struct api_body *body;
    char seen[API_FIELDS_MAX][64];
    size_t seen_count;
};

static int
body_fail(struct json_reader *r, const char *reason)
{
    return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "%s", reason);
}

/* One job id: a positive integer, at most CONSOLE_JOB_IDS_MAX of them. */
static int
read_job_id(struct json_reader *r, void *arg)
{
    struct api_body *body = arg;
    int64_t id;

    if (body->job_count >= CONSOLE_JOB_IDS_MAX)
        return body_fail(r, "too many job ids (at most 10000)");
    if (json_read_integer(r, &id) < 0 || id <= 0)
        return body_fail(r, "job ids must be positive integers");
    body->job_ids[body->job_count++] = id;
    return 0;
}

static int
read_ids(struct json_reader *r, struct api_body *body)
{
    if (r->text[r->at] != '[')
        return body_fail(r, "job_ids must be an array of integers");
    free(body->job_ids);
    body->job_ids = calloc(CONSOLE_JOB_IDS_MAX, sizeof(*body->job_ids));
    body->job_count = 0;
    if (body->job_ids == NULL)
        return body_fail(r, "out of memory");
    body->has_job_ids = true;
    if (json_read_array(r, read_job_id, body) < 0)
        return -1;
    return body->job_count == 0 ? body_fail(r, "job_ids must not be empty") : 0;
}

/* Reads a string value into out (size bytes); too long or a NUL byte is an error. */
static int
read_text(struct json_reader *r, char *out, size_t size)
{
    const char *value;
    size_t len;

    if (json_read_string(r, &value, &len) < 0)
        return -1;
    if (len >= size)
        return body_fail(r, "a json string is too long");
    if (memchr(value, '\0', len) != NULL)
        return body_fail(r, "NUL character in a json string");
    memcpy(out, value, len + 1);
    return 0;
}

/* Notes key among the seen ones; -1 when the object gave it already. */
static int
key_seen(struct json_reader *r, struct body_reader *reader, const char *key)
{
    for (size_t i = 0; i < reader->seen_count; i++)
        if (strcmp(reader->seen[i], key) == 0)
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "duplicate field '%.60s'", key);
    if (reader->seen_count < API_FIELDS_MAX)
        snprintf(reader->seen[reader->seen_count++], sizeof(reader->seen[0]), "%s", key);
    return 0;
}

/* Reads the value of member key into the body: a known field, at most once. */
static int
read_member(struct json_reader *r, const char *key, size_t key_len, void *arg)
{
    struct body_reader *reader = arg;
    struct api_body *body = reader->body;
    struct {
        const char *name;
        char *out;
        size_t size;
        bool *has;
    } strings[] = {
        {"queue", body->queue, sizeof(body->queue), &body->has_queue},
        {"ordering_key", body->ordering_key, sizeof(body->ordering_key), &body->has_key},
        {"error", body->error, sizeof(body->error), &body->has_error},
        {"reason", body->reason, sizeof(body->reason), &body->has_reason},
        {"since", body->since, sizeof(body->since), &body->has_since},
        {"until", body->until, sizeof(body->until), &body->has_until},
    };

    if (key_len >= sizeof(reader->seen[0]) || memchr(key, '\0', key_len) != NULL)
        return body_fail(r, "bad key in the json object");
    if (key_seen(r, reader, key) < 0)
        return -1;
    if (json_read_null(r))
        return 0;
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        if (strcmp(key, strings[i].name) == 0) {
            if (read_text(r, strings[i].out, strings[i].size) < 0)
                return -1;
            *strings[i].has = strings[i].out[0] != '\0';
            return 0;
        }
    }
    if (strcmp(key, "job_ids") == 0)
        return read_ids(r, body);
    if (strcmp(key, "dry_run") == 0)
        return json_read_bool(r, &body->dry_run) < 0 ? body_fail(r, "dry_run must be true or false")
                                                      : 0;
    return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "unknown field '%.60s'", key);
}

/*
 * Parses the request body as one JSON object of known fields, each at most
 * once (a repeated one is refused, not read last-one-wins); -1 with err.
 */
static int
parse_body(const struct console_request *request, struct api_body *body, struct outbox_error *err)
{
    struct body_reader reader = {.body = body};
    struct json_reader r;
    int rc;

    if (json_reader_init(&r, request->body, request->body_len, err) < 0)
        return -1;
    while (r.at < r.length && r.text[r.at] != '\0' && strchr(" \t\r\n", r.text[r.at]) != NULL)
        r.at++;
    if (r.at >= r.length || r.text[r.at] != '{')
        rc = body_fail(&r, "the body must be a json object");
    else
        rc = json_read_object(&r, read_member, &reader);
    json_reader_clear(&r);
    return rc;
}

/* ---- logging ---- */

static void
log_action(const struct console_request *request, const char *action, const struct api_body *body,
           const char *outcome)
{
    char queue[80], key[80];

    fprintf(stderr, "outboxctl serve: action %s by %s: queue=%s key=%s job_ids=%zu: %s\n",
            action, request->who,
            body->has_queue ? outbox_error_quote(queue, sizeof(queue), body->queue) : "-",
            body->has_key ? outbox_error_quote(key, sizeof(key), body->ordering_key) : "-",
            body->job_count, outcome);
}

static void
log_progress(void *arg, int64_t done)
{
    if (done % (CONSOLE_BATCH_SIZE * 10) == 0)
        fprintf(stderr, "outboxctl serve: %s: %lld rows so far\n", (const char *)arg,
                (long long)done);
}

/* ---- GET endpoints ---- */

static void
queue_json(struct buffer *out, const struct store_queue_status *queue)
{
    buffer_puts(out, "{");
    json_key(out, true, "queue");
    console_json_string(out, queue->queue);
    json_field_int(out, "ready", queue->ready);
    json_field_int(out, "running", queue->running);
    json_field_int(out, "succeeded", queue->succeeded);
    json_field_int(out, "dead", queue->dead);
    buffer_printf(out, ",\"oldest_ready_seconds\":%.3f", queue->oldest_ready_seconds);
    json_field_bool(out, "paused", queue->paused);
    json_field_int(out, "paused_keys", queue->paused_keys);
    json_field_int(out, "blocked_keys", queue->blocked_keys);
    json_field_bool(out, "stream", queue->stream);
    json_field_int(out, "stream_published", queue->stream_published);
    json_field_int(out, "stream_waiting", queue->stream_waiting);
    buffer_puts(out, "}");
}

static void
blocked_json(struct buffer *out, const struct store_blocked_key *key)
{
    buffer_puts(out, "{");
    json_key(out, true, "queue");
    console_json_string(out, key->queue);
    json_field_string(out, "ordering_key", key->ordering_key);
    json_field_int(out, "head_job_id", key->head_job_id);
    json_field_string(out, "head_state", key->head_state);
    json_field_int(out, "attempts", key->attempts);
    json_field_int(out, "max_attempts", key->max_attempts);
    json_field_string(out, "last_error", key->last_error);
    buffer_printf(out, ",\"retry_in_seconds\":%.3f", key->retry_in_seconds);
    json_field_int(out, "waiting", key->waiting);
    buffer_puts(out, "}");
}

static void
pauses_json(struct buffer *out, const struct store_pause_list *list)
{
    buffer_puts(out, "[");
    for (size_t i = 0; i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];

        buffer_puts(out, i > 0 ? ",{" : "{");
        json_key(out, true, "queue");
        console_json_string(out, pause->queue);
        json_field_string(out, "ordering_key", pause->ordering_key);
        json_field_string(out, "reason", pause->reason);
        json_field_string(out, "paused_by", pause->paused_by);
        json_field_string(out, "paused_at", pause->paused_at);
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

        buffer_puts(out, i > 0 ? ",{" : "{");
        json_key(out, true, "worker_id");
        console_json_string(out, relay->worker_id);
        json_field_int(out, "rows", relay->rows);
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
    json_field_bool(out, "succeeded_estimated", overview->succeeded_estimated);
    buffer_printf(out, ",\"table\":{\"table_bytes\":%lld,\"index_bytes\":%lld,"
                       "\"live_tuples_estimate\":%lld,\"dead_tuples\":%lld",
                  (long long)status->table_bytes, (long long)status->index_bytes,
                  (long long)status->live_tuples, (long long)status->dead_tuples);
    json_field_string(out, "last_autovacuum", status->last_autovacuum);
    json_field_string(out, "last_autoanalyze", status->last_autoanalyze);
    buffer_printf(out, "},\"vacuum_horizon\":{\"present\":%s", oldest->present ? "true" : "false");
    json_field_int(out, "pid", oldest->pid);
    json_field_string(out, "application_name", oldest->application_name);
    json_field_string(out, "state", oldest->state);
    buffer_printf(out, ",\"age_seconds\":%.3f", oldest->age_seconds);
    json_field_int(out, "xid_age", oldest->xid_age);
    json_field_string(out, "database", oldest->database);
    json_field_text_or_null(out, "prepared_gid", oldest->prepared_gid);
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

static void
api_overview(PGconn *conn, const char *only, struct console_response *response)
{
    struct store_console_overview overview;
    struct outbox_error err;

    if (store_console_overview(conn, overview_parts(only), &overview, &err) < 0)
        return respond_store_error(response, &err);
    overview_json(&response->body, &overview, only);
    store_console_overview_clear(&overview);
    respond_json(response, 200);
}

static void
api_chart(PGconn *conn, struct console_response *response)
{
    struct store_console_chart chart;
    struct outbox_error err;
    struct buffer *out = &response->body;

    if (store_console_chart(conn, &chart, &err) < 0)
        return respond_store_error(response, &err);
    buffer_puts(out, "{\"minutes\":[");
    for (int i = 0; i < STORE_CONSOLE_CHART_MINUTES; i++)
        buffer_printf(out, "%s{\"minute\":%lld,\"enqueued\":%lld,\"published\":%lld}",
                      i > 0 ? "," : "", (long long)chart.minute_epoch[i],
                      (long long)chart.enqueued[i], (long long)chart.published[i]);
    buffer_puts(out, "]}");
    respond_json(response, 200);
}

static void
streams_json(struct buffer *out, const struct store_console_streams *streams)
{
    const struct stream_horizon *horizon = &streams->horizon;

    buffer_puts(out, "{\"partitions\":[");
    for (size_t i = 0; i < streams->count; i++) {
        const struct stream_lag *lag = &streams->partitions[i];

        buffer_puts(out, i > 0 ? ",{" : "{");
        json_key(out, true, "queue");
        console_json_string(out, lag->queue);
        json_field_int(out, "partition", lag->partition);
        json_field_int(out, "lag_rows", lag->rows);
        buffer_printf(out, ",\"lag_seconds\":%.3f", lag->seconds);
        json_field_text_or_null(out, "owner", lag->owner);
        json_field_text_or_null(out, "lease_until", lag->lease_until);
        buffer_puts(out, "}");
    }
    buffer_puts(out, "],\"horizon\":");
    if (!horizon->found) {
        buffer_puts(out, "null}");
        return;
    }
    buffer_printf(out, "{\"pid\":%d", horizon->pid);
    buffer_printf(out, ",\"age_seconds\":%.3f", horizon->seconds);
    json_field_string(out, "user", horizon->user);
    json_field_string(out, "database", horizon->database);
    json_field_string(out, "application_name", horizon->application);
    json_field_string(out, "query", horizon->query);
    json_field_text_or_null(out, "prepared_gid", horizon->prepared);
    buffer_puts(out, "}}");
}

static void
api_streams(PGconn *conn, struct console_response *response)
{
    struct store_console_streams streams;
    struct outbox_error err;

    if (store_console_streams(conn, &streams, &err) < 0)
        return respond_store_error(response, &err);
    streams_json(&response->body, &streams);
    store_console_streams_clear(&streams);
    respond_json(response, 200);
}

/* Reads the dead-row filter of a query string; false after a 400 answer. */
static bool
query_filter(const struct console_request *request, struct api_body *body, int64_t *limit,
             struct console_response *response)
{
    const char *q = request->query;
    size_t len = strlen(q);
    char number[32], *end;

    body->has_queue = console_param(q, len, "queue", body->queue, sizeof(body->queue));
    body->has_key = console_param(q, len, "key", body->ordering_key, sizeof(body->ordering_key));
    body->has_error = console_param(q, len, "error", body->error, sizeof(body->error));
    *limit = CONSOLE_DEAD_LIMIT_DEFAULT;
    if (console_param(q, len, "limit", number, sizeof(number))) {
        *limit = strtoll(number, &end, 10);
        if (*end != '\0' || *limit < 1 || *limit > CONSOLE_DEAD_LIMIT_MAX) {
            respond_error(response, 400, "limit must be an integer from 1 to 10000");
            return false;
        }
    }
    if (console_param(q, len, "job_id", number, sizeof(number))) {
        body->job_ids = calloc(1, sizeof(*body->job_ids));
        if (body->job_ids == NULL || (body->job_ids[0] = strtoll(number, &end, 10)) < 1 ||
            *end != '\0') {
            respond_error(response, 400, "job_id must be a positive integer");
            return false;
        }
        body->job_count = 1;
    }
    return true;
}

static void
filter_of(const struct api_body *body, struct store_console_filter *filter)
{
    filter->queue = body->has_queue ? body->queue : NULL;
    filter->ordering_key = body->has_key ? body->ordering_key : NULL;
    filter->error_text = body->has_error ? body->error : NULL;
    filter->job_ids = body->job_ids;
    filter->job_count = body->job_count;
}

static void
dead_job_json(struct buffer *out, const struct store_console_dead_job *job)
{
    buffer_printf(out, "{\"job_id\":%lld", (long long)job->job_id);
    json_field_string(out, "queue", job->queue);
    json_field_string(out, "ordering_key", job->ordering_key);
    json_field_int(out, "attempts", job->attempts);
    json_field_int(out, "max_attempts", job->max_attempts);
    json_field_string(out, "finished_at", job->finished_at);
    json_field_string(out, "last_error", job->last_error);
    /* payload and headers are jsonb texts: valid JSON, but escaped like any value */
    json_key(out, false, "payload");
    buffer_puts(out, job->payload ? job->payload : "null");
    json_key(out, false, "headers");
    buffer_puts(out, job->headers ? job->headers : "null");
    buffer_puts(out, "}");
}

static void
api_dead(PGconn *conn, const struct console_request *request,
         struct console_response *response)
{
    struct api_body body = {0};
    struct store_console_filter filter;
    struct store_console_dead_list list;
    struct outbox_error err;
    int64_t limit;

    if (!query_filter(request, &body, &limit, response))
        goto done;
    filter_of(&body, &filter);
    if (store_console_dead_list(conn, &filter, limit, &list, &err) < 0) {
        respond_store_error(response, &err);
        goto done;
    }
    buffer_puts(&response->body, "[");
    for (size_t i = 0; i < list.count; i++) {
        if (i > 0)
            buffer_putc(&response->body, ',');
        dead_job_json(&response->body, &list.jobs[i]);
    }
    buffer_puts(&response->body, "]");
    store_console_dead_list_clear(&list);
    respond_json(response, 200);
done:
    free(body.job_ids);
}

static void
api_session(struct console *console, const struct console_request *request,
            struct console_response *response)
{
    static const char *const names[] = {"nobody", "anonymous", "bearer", "cookie"};
    struct buffer *out = &response->body;

    buffer_puts(out, "{\"identity\":");
    console_json_string(out, names[request->identity]);
    json_field_string(out, "csrf_token", request->session ? request->session->csrf : NULL);
    json_field_bool(out, "actions_allowed", console->allow_actions);
    buffer_puts(out, "}");
    respond_json(response, 200);
}

/* ---- POST endpoints ---- */

static void
api_dead_action(PGconn *conn, const struct console_request *request,
                const struct api_body *body, bool delete, struct console_response *response)
{
    const char *action = delete ? "dead/delete" : "dead/retry";
    struct store_console_filter filter;
    struct outbox_error err;
    char outcome[600];
    int64_t count = 0;
    int rc;

    if (!body->has_job_ids && !body->has_queue && !body->has_key && !body->has_error)
        return respond_error(response, 400,
                             "give job_ids, or a queue (with ordering_key or error to narrow it)");
    filter_of(body, &filter);
    rc = delete ? store_console_dead_delete(conn, &filter, CONSOLE_BATCH_SIZE, log_progress,
                                            (void *)action, &count, &err)
                : store_console_dead_retry(conn, &filter, CONSOLE_BATCH_SIZE, log_progress,
                                           (void *)action, &count, &err);
    snprintf(outcome, sizeof(outcome), "%lld rows%s%s", (long long)count, rc < 0 ? ", then " : "",
             rc < 0 ? err.message : "");
    log_action(request, action, body, outcome);
    if (rc < 0)
        return respond_store_error(response, &err);
    buffer_printf(&response->body, "{\"%s\":%lld}", delete ? "deleted" : "retried",
                  (long long)count);
    respond_json(response, 200);
}

static void
api_pause(PGconn *conn, const struct console_request *request,
          const struct api_body *body, bool pause, struct console_response *response)
{
    const char *key = body->has_key ? body->ordering_key : NULL;
    struct outbox_error err;
    bool changed = false;
    int64_t still = 0; /* not reported: read in the statement's snapshot, before the resume */
    int rc;

    if (!body->has_queue)
        return respond_error(response, 400, "queue is required");
    if (pause)
        rc = store_admin_pause(conn, body->queue, key, body->has_reason ? body->reason : NULL,
                               &changed, &err);
    else
        rc = store_admin_resume(conn, body->queue, key, &changed, &still, &err);
    log_action(request, pause ? "pause" : "resume", body,
               rc < 0 ? err.message : changed ? "1 row" : "0 rows (no change)");
    if (rc < 0)
        return respond_store_error(response, &err);
    buffer_printf(&response->body, "{\"changed\":%s", changed ? "true" : "false");
    buffer_puts(&response->body, "}");
    respond_json(response, 200);
}

/* Checks since and until with the server's timestamptz reader; false after a 400. */
static bool
replay_times_ok(PGconn *conn, const struct api_body *body,
                struct console_response *response)
{
    const char *times[2] = {body->has_since ? body->since : NULL,
                            body->has_until ? body->until : NULL};
    struct outbox_error err;

    for (int i = 0; i < 2; i++) {
        if (times[i] != NULL && store_admin_check_time(conn, times[i], &err) < 0) {
            char reason[200];

            if (err.code != OUTBOX_ERR_INVALID) {
                respond_store_error(response, &err);
                return false;
            }
            snprintf(reason, sizeof(reason), "%s is not a time: %.100s", i ? "until" : "since",
                     times[i]);
            respond_error(response, 400, reason);
            return false;
        }
    }
    return true;
}

static void
api_replay(PGconn *conn, const struct console_request *request,
           const struct api_body *body, struct console_response *response)
{
    struct store_replay_request replay = {0};
    struct store_replay_result result = {0};
    struct outbox_error err;
    char outcome[600];
    int rc;

    if (!body->has_queue)
        return respond_error(response, 400, "queue is required");
    if (body->has_job_ids == body->has_since)
        return respond_error(response, 400, "give either since (with until) or job_ids");
    if (body->has_until && !body->has_since)
        return respond_error(response, 400, "until needs since");
    if (!replay_times_ok(conn, body, response))
        return;
    replay.queue = body->queue;
    replay.since = body->has_since ? body->since : NULL;
    replay.until = body->has_until ? body->until : NULL;
    replay.job_ids = body->job_ids;
    replay.job_count = body->job_count;
    replay.ordering_key = body->has_key ? body->ordering_key : NULL;
    replay.dry_run = body->dry_run;
    replay.batch_size = CONSOLE_BATCH_SIZE;
    rc = store_admin_replay(conn, &replay, &result, &err);
    snprintf(outcome, sizeof(outcome), "%s%lld rows%s%s", body->dry_run ? "dry run, " : "",
             (long long)result.replayed, rc < 0 ? ", then " : "", rc < 0 ? err.message : "");
    log_action(request, "replay", body, outcome);
    if (rc < 0)
        return respond_store_error(response, &err);
    buffer_printf(&response->body, "{\"dry_run\":%s", body->dry_run ? "true" : "false");
    json_field_int(&response->body, "replayed", result.replayed);
    json_field_int(&response->body, "ready", result.ready);
    json_field_int(&response->body, "running", result.running);
    json_field_int(&response->body, "dead", result.dead);
    json_field_int(&response->body, "missing", result.missing);
    buffer_puts(&response->body, "}");
    respond_json(response, 200);
}

static void
api_post(PGconn *conn, const struct console_request *request,
         const char *path, struct console_response *response)
{
    struct api_body body = {0};
    struct outbox_error err;

    if (parse_body(request, &body, &err) < 0) {
        respond_error(response, err.code == OUTBOX_ERR_INVALID ? 400 : 500, err.message);
    } else if (strcmp(path, "dead/retry") == 0) {
        api_dead_action(conn, request, &body, false, response);
    } else if (strcmp(path, "dead/delete") == 0) {
        api_dead_action(conn, request, &body, true, response);
    } else if (strcmp(path, "pause") == 0 || strcmp(path, "resume") == 0) {
        api_pause(conn, request, &body, strcmp(path, "pause") == 0, response);
    } else if (strcmp(path, "replay") == 0) {
        api_replay(conn, request, &body, response);
    } else {
        respond_error(response, 404, "no such action");
    }
    free(body.job_ids);
}

/* True when a Content-Type names JSON: application/json in any case, parameters after ';'. */
static bool
is_json(const char *content_type)
{
    if (content_type == NULL || strncasecmp(content_type, "application/json", 16) != 0)
        return false;
    return strchr(" \t;", content_type[16]) != NULL; /* also the end: strchr finds the NUL */
}

static bool
is_get_endpoint(const char *path)
{
    static const char *const names[] = {"overview", "queues", "blocked", "paused", "relays",
                                        "dead",     "chart",  "session", "streams"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(path, names[i]) == 0)
            return true;
    return false;
}

void
console_api(struct console *console, const struct console_request *request, const char *path,
            struct console_response *response)
{
    bool post = strcmp(request->method, "POST") == 0;
    PGconn *conn;

    if (!post && !is_get_endpoint(path))
        return respond_error(response, 404, "no such endpoint");
    if (!post && strcmp(path, "session") == 0)
        return api_session(console, request, response);
    if (post && !is_json(request->content_type))
        return respond_error(response, 400, "the body must be Content-Type: application/json");
    if ((conn = console_database(console)) == NULL)
        return respond_error(response, 503, console_database_error());
    if (post)
        return api_post(conn, request, path, response);
    if (strcmp(path, "dead") == 0)
        return api_dead(conn, request, response);
    if (strcmp(path, "chart") == 0)
        return api_chart(conn, response);
    if (strcmp(path, "streams") == 0)
        return api_streams(conn, response);
    api_overview(conn, path, response);
}
