/*
 * console_api.h - the console's JSON API under /api/v1/: the request of one
 * endpoint (struct api_call), the helpers every endpoint's handler answers
 * with, and the router. Which endpoints there are, and which handler answers
 * each, is the action table's to say (actions.c); the handlers live with
 * their topic (ctl_status.c, ctl_dead.c...). Every string from the database
 * is written as an escaped, HTML-safe JSON string.
 */
#ifndef OUTBOX_CONSOLE_API_H
#define OUTBOX_CONSOLE_API_H

#include "console_request.h"
#include "store_console.h"
#include "store_dead.h"

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
    bool all; /* "all": true, what an action over every queue must say */
};

/* One API request on its way to its handler. */
struct api_call {
    struct console *console;
    const struct console_request *request;
    const char *path;        /* under /api/v1/, e.g. "dead/retry" */
    PGconn *conn;            /* the worker's connection; NULL for an endpoint without database */
    const struct api_body *body; /* a POST's fields; all empty for a GET */
    struct console_response *response;
};

/* An endpoint's handler: answers call->response, a JSON body and a status. */
typedef void api_fn(struct api_call *call);

/* Answers a request under /api/v1/ (path without that prefix) from the action table. */
void console_api(struct console *console, const struct console_request *request,
                 const char *path, struct console_response *response);

/* Writes text as a JSON string (with <, > and & as \u escapes). NULL writes null. */
void console_json_string(struct buffer *out, const char *text);

/* The parts of an answer: a key after the first (,"key":) and ,"key":value fields. */
void api_json_key(struct buffer *out, const char *key);
void api_field_string(struct buffer *out, const char *key, const char *value);
/* A text that is "" or NULL for none (an owner, a lease) as a JSON string or null. */
void api_field_text_or_null(struct buffer *out, const char *key, const char *text);
/* A JSON text from the database (jsonb) as is, but with < > & as \u escapes; NULL: null. */
void api_field_json(struct buffer *out, const char *key, const char *json_text);
void api_field_int(struct buffer *out, const char *key, int64_t value);
void api_field_bool(struct buffer *out, const char *key, bool value);

/* Ends a JSON answer with status. */
void api_respond_json(struct console_response *response, int status);
/* Answers {"error": reason} with status. */
void api_respond_error(struct console_response *response, int status, const char *reason);
/* Answers a failed store call: bad input 400, database away 503, else 500. */
void api_respond_store_error(struct console_response *response, const struct outbox_error *err);

/* Logs an action on stderr in one line: who, what, on which database and rows, the outcome. */
void api_log_action(const struct console_request *request, const char *action,
                    const struct api_body *body, const char *outcome);
/* Progress of a long action (a store progress callback; arg: the action's name). */
void api_log_progress(void *arg, int64_t done);

#endif
