/*
 * console_api.c - the JSON API under /api/v1/: the router (from the action
 * table), the helpers the endpoints' handlers answer with, and the reader
 * of the small JSON objects the actions take.
 *
 * Every action is logged on stderr in one line: who, what, on which rows,
 * how many. Bad input is a 400 with a one-line reason in {"error": ...}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "actions.h"
#include "console_api.h"
#include "error.h"
#include "json.h"
#include "store_admin.h"
#include "store_console.h"

#define API_FIELDS_MAX 8 /* the fields an action may carry; any other is refused */


/* ---- JSON out ---- */

/* Every string of an answer is written HTML-safe: a misread answer cannot become markup. */
void
console_json_string(struct buffer *out, const char *text)
{
    json_put_text(out, text, JSON_HTML_SAFE);
}

void
api_json_key(struct buffer *out, const char *key)
{
    buffer_printf(out, ",\"%s\":", key);
}

void
api_field_string(struct buffer *out, const char *key, const char *value)
{
    api_json_key(out, key);
    console_json_string(out, value);
}

/* A text that is "" or NULL for none (an owner, a lease) as a JSON string or null. */
void
api_field_text_or_null(struct buffer *out, const char *key, const char *text)
{
    api_field_string(out, key, text != NULL && text[0] != '\0' ? text : NULL);
}

/*
 * A JSON text from the database (a jsonb's text, valid JSON) as the value
 * of key, with < > & written as \u escapes like every other string of an
 * answer: outside strings a JSON text has none of them.
 */
void
api_field_json(struct buffer *out, const char *key, const char *json_text)
{
    api_json_key(out, key);
    if (json_text == NULL) {
        buffer_puts(out, "null");
        return;
    }
    for (const char *p = json_text; *p != '\0'; p++) {
        size_t plain = strcspn(p, "<>&");

        buffer_append(out, p, plain);
        p += plain;
        if (*p == '\0')
            break;
        buffer_printf(out, "\\u%04x", (unsigned)*p);
    }
}

void
api_field_int(struct buffer *out, const char *key, int64_t value)
{
    buffer_printf(out, ",\"%s\":%lld", key, (long long)value);
}

void
api_field_bool(struct buffer *out, const char *key, bool value)
{
    buffer_printf(out, ",\"%s\":%s", key, value ? "true" : "false");
}

void
api_respond_json(struct console_response *response, int status)
{
    response->status = status;
    response->content_type = "application/json";
    buffer_putc(&response->body, '\n');
}

void
api_respond_error(struct console_response *response, int status, const char *reason)
{
    response->body.len = 0;
    buffer_puts(&response->body, "{\"error\":");
    console_json_string(&response->body, reason);
    buffer_putc(&response->body, '}');
    api_respond_json(response, status);
}

/* Answers a failed store call: bad input 400, database away 503, else 500. */
void
api_respond_store_error(struct console_response *response, const struct outbox_error *err)
{
    int status = 500;

    console_database_failed(err);
    if (err->code == OUTBOX_ERR_INVALID || err->code == OUTBOX_ERR_CONSTRAINT)
        status = 400;
    else if (err->code == OUTBOX_ERR_CONNECTION || err->code == OUTBOX_ERR_TIMEOUT ||
             err->code == OUTBOX_ERR_SCHEMA || err->code == OUTBOX_ERR_BUSY)
        status = 503;
    api_respond_error(response, status, err->message);
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
    if (strcmp(key, "all") == 0)
        return json_read_bool(r, &body->all) < 0 ? body_fail(r, "all must be true or false") : 0;
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

void
api_log_action(const struct console_request *request, const char *action, const struct api_body *body,
           const char *outcome)
{
    char queue[80], key[80];

    fprintf(stderr,
            "outboxctl serve: action %s by %s: database=%s queue=%s key=%s job_ids=%zu: %s\n",
            action, request->who, request->database,
            body->has_queue ? outbox_error_quote(queue, sizeof(queue), body->queue) : "-",
            body->has_key ? outbox_error_quote(key, sizeof(key), body->ordering_key) : "-",
            body->job_count, outcome);
}

void
api_log_progress(void *arg, int64_t done)
{
    if (done % (CONSOLE_BATCH_SIZE * 10) == 0)
        fprintf(stderr, "outboxctl serve: %s: %lld rows so far\n", (const char *)arg,
                (long long)done);
}

/* ---- the console's own endpoint ---- */

/* Who the request is, its CSRF token, and whether this console serves actions. */
void
api_session(struct api_call *call)
{
    static const char *const names[] = {"nobody", "anonymous", "bearer", "cookie"};
    const struct console_request *request = call->request;
    struct buffer *out = &call->response->body;

    buffer_puts(out, "{\"identity\":");
    console_json_string(out, names[request->identity]);
    api_field_string(out, "csrf_token", request->session ? request->session->csrf : NULL);
    api_field_bool(out, "actions_allowed", call->console->allow_actions);
    buffer_puts(out, "}");
    api_respond_json(call->response, 200);
}

/* ---- routing ---- */

/* True when a Content-Type names JSON: application/json in any case, parameters after ';'. */
static bool
is_json(const char *content_type)
{
    if (content_type == NULL || strncasecmp(content_type, "application/json", 16) != 0)
        return false;
    return strchr(" \t;", content_type[16]) != NULL; /* also the end: strchr finds the NUL */
}

void
console_api(struct console *console, const struct console_request *request, const char *path,
            struct console_response *response)
{
    bool post = strcmp(request->method, "POST") == 0;
    const struct action *action = action_for_api(request->method, path);
    struct api_body body = {0};
    struct api_call call = {console, request, path, NULL, &body, response};
    struct outbox_error err;

    if (!post && action == NULL)
        return api_respond_error(response, 404, "no such endpoint");
    if (post && !is_json(request->content_type))
        return api_respond_error(response, 400, "the body must be Content-Type: application/json");
    if ((action == NULL || action->database) &&
        (call.conn = console_database(request->database, request->database_url)) == NULL)
        return api_respond_error(response, 503, console_database_error());
    if (post && parse_body(request, &body, &err) < 0)
        api_respond_error(response, err.code == OUTBOX_ERR_INVALID ? 400 : 500, err.message);
    else if (action == NULL)
        api_respond_error(response, 404, "no such action");
    else
        action->answer(&call);
    free(body.job_ids);
}
