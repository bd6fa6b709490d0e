/*
 * console_html.c - the console's own pages: dead rows, blocked and paused
 * keys, replay, and logging in and out; the overview is
 * console_html_overview.c's, the Databases view console_databases_view.c's,
 * and which path shows which is the page table's (console_pages.c).
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

/* ---- login ---- */

static void
login_page(struct console *console, const struct console_request *request,
           struct console_response *response, int status, const char *problem)
{
    struct buffer *out = &response->body;

    console_page_start(console, request, out, "Log in", "");
    buffer_puts(out, "<section class=\"login\"><h1>Log in</h1>");
    if (problem != NULL) {
        buffer_puts(out, "<p class=\"bad\">");
        console_html_escape(out, problem);
        buffer_puts(out, "</p>");
    }
    buffer_puts(out, "<form method=\"post\" action=\"/login\"><label>Access token "
                     "<input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\" "
                     "required autofocus></label> <button type=\"submit\">Log in</button></form>"
                     "<p class=\"note\">The token is the first line of the console's "
                     "--auth-token-file.</p></section>");
    console_page_end(out);
    console_page_respond(response, status);
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
    if (console_auth_throttled(console, request->peer))
        return login_page(console, request, response, 429,
                          "too many failed logins from this address: try again in a minute");
    if (!console_param(request->body, request->body_len, "token", token, sizeof(token)) ||
        !console_auth_login(console, token, &opened)) {
        console_auth_failed(console, request->peer);
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

void
console_login_page(struct console *console, PGconn *conn, struct console_request *request,
                   struct console_response *response)
{
    (void)conn;
    if (strcmp(request->method, "POST") == 0)
        return login_post(console, request, response);
    login_page(console, request, response, request->identity == CONSOLE_NOBODY &&
                                                   strcmp(request->path, "/login") != 0
                                               ? 401
                                               : 200,
               NULL);
}

void
console_logout_page(struct console *console, PGconn *conn, struct console_request *request,
                    struct console_response *response)
{
    (void)conn;
    console_auth_logout(console, request);
    response->status = 303;
    buffer_puts(&response->headers, "Set-Cookie: " SESSION_COOKIE "=; Path=/; HttpOnly; "
                                    "SameSite=Strict; Max-Age=0\r\nLocation: /login\r\n");
}

/* ---- action forms ---- */

/* What the action forms of a page need: whether actions are served, and the page's database. */
struct forms {
    bool allowed;
    const struct console_request *request;
};

/*
 * Opens a form that console.js posts as JSON to api, on the page's
 * database (database=NAME of the query); done names the outcome.
 */
static void
action_form(struct buffer *out, const struct forms *forms, const char *api, const char *done,
            const char *cls)
{
    buffer_printf(out, "<form class=\"action %s\" data-api=\"/api/v1/%s", cls, api);
    console_html_database_param(out, forms->request, '?');
    buffer_printf(out, "\" data-done=\"%s\" data-reload>%s", done,
                  forms->allowed ? "" : "<fieldset disabled>");
}

static void
action_form_end(struct buffer *out, const struct forms *forms)
{
    buffer_puts(out, forms->allowed ? "</form>" : "</fieldset></form>");
}

static void
hidden(struct buffer *out, const char *name, const char *value)
{
    if (value == NULL || value[0] == '\0')
        return;
    buffer_printf(out, "<input type=\"hidden\" name=\"%s\" value=\"", name);
    console_html_escape(out, value);
    buffer_puts(out, "\">");
}

static void
job_button(struct buffer *out, const struct forms *forms, const char *api, const char *done,
           int64_t job_id, const char *label)
{
    char id[24];

    snprintf(id, sizeof(id), "%lld", (long long)job_id);
    action_form(out, forms, api, done, "inline");
    hidden(out, "job_ids", id);
    buffer_printf(out, "<button type=\"submit\">%s</button>", label);
    action_form_end(out, forms);
}

/* ---- dead rows ---- */

static void
dead_filter_form(struct buffer *out, const struct console_request *request,
                 const struct store_dead_filter *filter, int64_t limit)
{
    buffer_puts(out, "<form method=\"get\" action=\"/dead\" class=\"filter\">");
    hidden(out, "database", request->database);
    buffer_puts(out, "<label>Queue <input name=\"queue\" value=\"");
    console_html_escape(out, filter->queue);
    buffer_puts(out, "\"></label> <label>Ordering key <input name=\"key\" value=\"");
    console_html_escape(out, filter->ordering_key);
    buffer_puts(out, "\"></label> <label>Error contains <input name=\"error\" value=\"");
    console_html_escape(out, filter->error_text);
    buffer_printf(out, "\"></label> <label>Limit <input name=\"limit\" type=\"number\" min=\"1\" "
                       "max=\"%d\" value=\"%lld\"></label> <button type=\"submit\">Filter</button>"
                       "</form>",
                  CONSOLE_DEAD_LIMIT_MAX, (long long)limit);
}

/* One table cell of text, escaped; class NULL for none. */
static void
text_cell(struct buffer *out, const char *class, const char *text)
{
    if (class != NULL)
        buffer_printf(out, "<td class=\"%s\">", class);
    else
        buffer_puts(out, "<td>");
    console_html_escape(out, text);
    buffer_puts(out, "</td>");
}

static void
dead_row(struct buffer *out, const struct forms *forms, const struct store_dead_job *job)
{
    buffer_printf(out, "<tr data-job-id=\"%lld\"><td>%lld</td>", (long long)job->job_id,
                  (long long)job->job_id);
    text_cell(out, "queue", job->queue);
    text_cell(out, "key", job->ordering_key);
    buffer_printf(out, "<td>%d/%d</td>", (int)job->attempts, (int)job->max_attempts);
    text_cell(out, NULL, job->finished_at);
    buffer_puts(out, "<td class=\"last-error\"><details><summary>");
    console_html_escape(out, job->last_error ? job->last_error : "(no error recorded)");
    buffer_puts(out, "</summary><h3>last_error</h3><pre class=\"error-text\">");
    console_html_escape(out, job->last_error);
    buffer_puts(out, "</pre><h3>payload</h3><pre class=\"payload\">");
    console_html_escape(out, job->payload);
    buffer_puts(out, "</pre><h3>headers</h3><pre class=\"headers\">");
    console_html_escape(out, job->headers);
    buffer_puts(out, "</pre></details></td><td class=\"actions\">");
    job_button(out, forms, "dead/retry", "retried", job->job_id, "Retry");
    job_button(out, forms, "dead/delete", "deleted", job->job_id, "Delete");
    buffer_puts(out, "</td></tr>");
}

void
console_dead_page(struct console *console, PGconn *conn, struct console_request *request,
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
    const struct forms forms = {console->allow_actions, request};
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
        if (err.code == OUTBOX_ERR_INVALID || err.code == OUTBOX_ERR_CONSTRAINT)
            return console_respond_text(response, 400, err.message); /* as the API answers */
        return console_page_banner(console, request, response, "Dead rows", "/dead", err.message);
    }
    console_page_start(console, request, out, "Dead rows", "/dead");
    buffer_printf(out, "<h1>Dead rows</h1>");
    dead_filter_form(out, request, &filter, limit);
    buffer_printf(out, "<p class=\"note\">%zu row%s shown (at most %lld). Retry makes a row "
                       "ready again with one more attempt; delete removes it for good.</p>",
                  list.count, list.count == 1 ? "" : "s", (long long)limit);
    if (filter.queue != NULL || filter.ordering_key != NULL || filter.error_text != NULL) {
        action_form(out, &forms, "dead/retry", "retried", "bulk");
        hidden(out, "queue", filter.queue);
        hidden(out, "ordering_key", filter.ordering_key);
        hidden(out, "error", filter.error_text);
        hidden(out, "all", filter.queue == NULL ? "true" : NULL); /* no queue: says so */
        buffer_puts(out, "<button type=\"submit\">Retry every dead row matching the filter"
                         "</button>");
        action_form_end(out, &forms);
    }
    buffer_puts(out, "<table id=\"dead\"><thead><tr><th>Job</th><th>Queue</th>"
                     "<th>Ordering key</th><th>Attempts</th><th>Finished</th>"
                     "<th>Last error (open for payload and headers)</th><th></th></tr>"
                     "</thead><tbody>");
    for (size_t i = 0; i < list.count; i++)
        dead_row(out, &forms, &list.jobs[i]);
    buffer_puts(out, "</tbody></table>");
    console_page_end(out);
    store_dead_list_clear(&list);
    console_page_respond(response, 200);
}

/* ---- keys and pauses ---- */

static void
blocked_table(struct buffer *out, const struct forms *forms, const struct store_status *status)
{
    static const char *const columns[] = {"Queue",      "Ordering key", "Head job",
                                          "Head state", "Attempts",     "Last error",
                                          "Waiting behind", "", NULL};

    if (!console_table_open(out, "Blocked keys", status->blocked_count,
                            "No ordering key is held up by its head.", "blocked", columns))
        return;
    for (size_t i = 0; i < status->blocked_count; i++) {
        const struct store_blocked_key *key = &status->blocked[i];

        buffer_puts(out, "<tr>");
        text_cell(out, NULL, key->queue);
        text_cell(out, "key", key->ordering_key);
        buffer_printf(out, "<td>%lld</td>", (long long)key->head_job_id);
        text_cell(out, NULL, key->head_state);
        buffer_printf(out, "<td>%d/%d</td>", (int)key->attempts, (int)key->max_attempts);
        text_cell(out, "last-error", key->last_error);
        buffer_printf(out, "<td>%lld</td><td>", (long long)key->waiting);
        if (strcmp(key->head_state ? key->head_state : "", "dead") == 0)
            job_button(out, forms, "dead/retry", "retried", key->head_job_id, "Retry head");
        buffer_puts(out, "</td></tr>");
    }
    buffer_puts(out, "</tbody></table>");
}

static void
paused_table(struct buffer *out, const struct forms *forms, const struct store_pause_list *list)
{
    static const char *const columns[] = {"Queue", "Ordering key", "Reason", "By", "Since", "",
                                          NULL};

    if (!console_table_open(out, "Paused", list->count, "Nothing is paused.", "paused", columns))
        return;
    for (size_t i = 0; i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];

        buffer_puts(out, "<tr>");
        text_cell(out, "queue", pause->queue);
        text_cell(out, "key", pause->ordering_key ? pause->ordering_key : "(whole queue)");
        text_cell(out, NULL, pause->reason);
        text_cell(out, NULL, pause->paused_by);
        text_cell(out, NULL, pause->paused_at);
        buffer_puts(out, "<td>");
        action_form(out, forms, "resume", "resumed", "inline");
        hidden(out, "queue", pause->queue);
        hidden(out, "ordering_key", pause->ordering_key);
        buffer_puts(out, "<button type=\"submit\">Resume</button>");
        action_form_end(out, forms);
        buffer_puts(out, "</td></tr>");
    }
    buffer_puts(out, "</tbody></table>");
}

void
console_keys_page(struct console *console, PGconn *conn, struct console_request *request,
                  struct console_response *response)
{
    struct store_console_overview overview;
    struct outbox_error err;
    struct buffer *out = &response->body;
    const struct forms forms = {console->allow_actions, request};

    if (store_console_overview(conn, STORE_CONSOLE_BLOCKED | STORE_CONSOLE_PAUSED, &overview,
                               &err) < 0) {
        console_database_failed(&err);
        return console_page_banner(console, request, response, "Keys and pauses", "/keys",
                                   err.message);
    }
    console_page_start(console, request, out, "Keys and pauses", "/keys");
    buffer_puts(out, "<h1>Keys and pauses</h1>");
    blocked_table(out, &forms, &overview.status);
    paused_table(out, &forms, &overview.status.paused);
    buffer_puts(out, "<h2>Pause or resume</h2>");
    action_form(out, &forms, "pause", "paused", "pause");
    buffer_puts(out, "<label>Queue <input name=\"queue\" required></label> "
                     "<label>Ordering key (empty: the whole queue) <input name=\"ordering_key\">"
                     "</label> <label>Reason <input name=\"reason\"></label> "
                     "<button type=\"submit\">Pause</button>");
    action_form_end(out, &forms);
    action_form(out, &forms, "resume", "resumed", "resume");
    buffer_puts(out, "<label>Queue <input name=\"queue\" required></label> "
                     "<label>Ordering key <input name=\"ordering_key\"></label> "
                     "<button type=\"submit\">Resume</button>");
    action_form_end(out, &forms);
    buffer_puts(out, "<p class=\"note\">Relays stop claiming a paused queue or key at their "
                     "next claim; producers go on enqueueing.</p>");
    console_page_end(out);
    store_console_overview_clear(&overview);
    console_page_respond(response, 200);
}

/* ---- replay ---- */

void
console_replay_page(struct console *console, PGconn *conn, struct console_request *request,
                    struct console_response *response)
{
    struct buffer *out = &response->body;

    (void)conn;
    const struct forms forms = {console->allow_actions, request};

    console_page_start(console, request, out, "Replay", "/replay");
    buffer_puts(out, "<h1>Replay</h1><p class=\"note\">Publishes succeeded rows again, in "
                     "their order per key: those finished in a time range, or the given job "
                     "ids. Count them first (dry run); the replay button opens once the "
                     "count is shown, for exactly those fields.</p>");
    buffer_puts(out, "<form class=\"action replay\" id=\"replay-form\" data-api=\"/api/v1/replay");
    console_html_database_param(out, request, '?');
    buffer_printf(out, "\" data-done=\"replayed\" data-replay>%s",
                  forms.allowed ? "" : "<fieldset disabled>");
    buffer_puts(out, "<label>Queue <input name=\"queue\" required></label> "
                     "<label>Since <input name=\"since\" placeholder=\"2026-01-31 12:00+00\">"
                     "</label> <label>Until <input name=\"until\" placeholder=\"now\"></label> "
                     "<label>or job ids <input name=\"job_ids\" placeholder=\"12, 13\"></label> "
                     "<label>Ordering key <input name=\"ordering_key\"></label> "
                     "<button type=\"submit\" name=\"mode\" value=\"dry\">Count (dry run)"
                     "</button> <button type=\"submit\" name=\"mode\" value=\"run\" "
                     "id=\"replay-run\" disabled>Replay</button>");
    action_form_end(out, &forms);
    console_page_end(out);
    console_page_respond(response, 200);
}
