/*
 * outboxctl dead list and dead retry: the jobs that ran out of attempts,
 * with their last error, and making them ready again with more attempts.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actions.h"
#include "ctl.h"

#define DEAD_LIST_LIMIT_DEFAULT 100
#define DEAD_LIST_LIMIT_MAX 1000000
#define EXTRA_ATTEMPTS_MAX 1000000

int
ctl_command_dead_list(struct ctl *ctl, int argc, char **argv, int first)
{
    static const bool numbers[] = {true, false, true, false, false};
    const char *queue = NULL, *limit_text = NULL;
    int64_t limit = DEAD_LIST_LIMIT_DEFAULT;
    struct store_dead_filter filter = {0};
    struct store_dead_list list;
    struct ctl_table table = {.columns = 5, .right_aligned = numbers};
    struct outbox_error err;
    bool ok;
    int taken;

    const struct ctl_option options[] = {{"--queue", &queue, NULL}, {"--limit", &limit_text, NULL}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 2)) != CTL_GO_ON)
        return taken;
    if (limit_text != NULL &&
        ctl_number_option("--limit", limit_text, 1, DEAD_LIST_LIMIT_MAX, &limit) != 0)
        return EXIT_USAGE;
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    filter.queue = queue;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_dead_list(ctl->conn, &filter, limit, &list, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    if (list.count == 0) {
        puts("no dead jobs");
        return 0;
    }
    ok = ctl_table_add_row(&table, "JOB_ID", "QUEUE", "ATTEMPTS", "FINISHED_AT", "LAST_ERROR");
    for (size_t i = 0; ok && i < list.count; i++) {
        const struct store_dead_job *job = &list.jobs[i];
        char id[24], attempts[32], error[1024];

        snprintf(id, sizeof(id), "%lld", (long long)job->job_id);
        snprintf(attempts, sizeof(attempts), "%d/%d", (int)job->attempts, (int)job->max_attempts);
        ok = ctl_table_add_row(&table, id, job->queue, attempts, job->finished_at,
                               job->last_error ? ctl_one_line(error, sizeof(error), job->last_error)
                                               : "-");
    }
    if (ok)
        ctl_table_print(&table, stdout);
    ctl_table_clear(&table);
    store_dead_list_clear(&list);
    return ok ? 0 : ctl_out_of_memory();
}

int
ctl_command_dead_retry(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *job_text = NULL, *extra_text = NULL;
    int64_t job_id = 0, extra = 1, count = 0;
    struct outbox_error err;
    bool all = false;
    int taken;

    const struct ctl_option options[] = {{"--queue", &queue, NULL},
                                         {"--job", &job_text, NULL},
                                         {"--extra-attempts", &extra_text, NULL},
                                         {"--all", NULL, &all}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 4)) != CTL_GO_ON)
        return taken;
    if (job_text != NULL && ctl_number_option("--job", job_text, 1, INT64_MAX, &job_id) != 0)
        return EXIT_USAGE;
    if (extra_text != NULL &&
        ctl_number_option("--extra-attempts", extra_text, 1, EXTRA_ATTEMPTS_MAX, &extra) != 0)
        return EXIT_USAGE;
    if (all == (queue != NULL || job_text != NULL))
        return ctl_usage_error("%s", all ? "--all excludes --queue and --job"
                                         : "give --queue Q or --job ID, or --all for every queue");
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_dead_retry(ctl->conn, queue, job_id, (int32_t)extra, &count, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    printf("retried %lld dead job%s\n", (long long)count, count == 1 ? "" : "s");
    return 0;
}

/* ---- the console API ---- */

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
            api_respond_error(response, 400, "limit must be an integer from 1 to 10000");
            return false;
        }
    }
    if (console_param(q, len, "job_id", number, sizeof(number))) {
        body->job_ids = calloc(1, sizeof(*body->job_ids));
        if (body->job_ids == NULL || (body->job_ids[0] = strtoll(number, &end, 10)) < 1 ||
            *end != '\0') {
            api_respond_error(response, 400, "job_id must be a positive integer");
            return false;
        }
        body->job_count = 1;
    }
    return true;
}

static void
filter_of(const struct api_body *body, struct store_dead_filter *filter)
{
    filter->queue = body->has_queue ? body->queue : NULL;
    filter->ordering_key = body->has_key ? body->ordering_key : NULL;
    filter->error_text = body->has_error ? body->error : NULL;
    filter->job_ids = body->job_ids;
    filter->job_count = body->job_count;
}

static void
dead_job_json(struct buffer *out, const struct store_dead_job *job)
{
    buffer_printf(out, "{\"job_id\":%lld", (long long)job->job_id);
    api_field_string(out, "queue", job->queue);
    api_field_string(out, "ordering_key", job->ordering_key);
    api_field_int(out, "attempts", job->attempts);
    api_field_int(out, "max_attempts", job->max_attempts);
    api_field_string(out, "finished_at", job->finished_at);
    api_field_string(out, "last_error", job->last_error);
    api_field_json(out, "payload", job->payload);
    api_field_json(out, "headers", job->headers);
    buffer_puts(out, "}");
}

void
api_dead(struct api_call *call)
{
    struct console_response *response = call->response;
    struct api_body body = {0};
    struct store_dead_filter filter;
    struct store_dead_list list;
    struct outbox_error err;
    int64_t limit;

    if (!query_filter(call->request, &body, &limit, response))
        goto done;
    filter_of(&body, &filter);
    if (store_dead_list(call->conn, &filter, limit, &list, &err) < 0) {
        api_respond_store_error(response, &err);
        goto done;
    }
    buffer_puts(&response->body, "[");
    for (size_t i = 0; i < list.count; i++) {
        if (i > 0)
            buffer_putc(&response->body, ',');
        dead_job_json(&response->body, &list.jobs[i]);
    }
    buffer_puts(&response->body, "]");
    store_dead_list_clear(&list);
    api_respond_json(response, 200);
done:
    free(body.job_ids);
}

/* What the console does to the dead rows a body selects. */
enum dead_verb { DEAD_RETRY, DEAD_DELETE };

/* Retries or deletes the dead rows the body selects. */
static void
dead_action(struct api_call *call, enum dead_verb verb)
{
    bool delete = verb == DEAD_DELETE;
    const struct api_body *body = call->body;
    struct console_response *response = call->response;
    const char *action = delete ? "dead/delete" : "dead/retry";
    struct store_dead_filter filter;
    struct outbox_error err;
    char outcome[600];
    int64_t count = 0;
    int rc;

    if (body->all && (body->has_job_ids || body->has_queue))
        return api_respond_error(response, 400, "\"all\": true excludes job_ids and queue");
    if (!body->all && !body->has_job_ids && !body->has_queue)
        return api_respond_error(response, 400,
                                 "give job_ids, or a queue (with ordering_key or error to narrow "
                                 "it), or \"all\": true for every queue");
    filter_of(body, &filter);
    rc = delete ? store_dead_delete(call->conn, &filter, CONSOLE_BATCH_SIZE, api_log_progress,
                                            (void *)action, &count, &err)
                : store_dead_retry(call->conn, &filter, CONSOLE_BATCH_SIZE, api_log_progress,
                                           (void *)action, &count, &err);
    snprintf(outcome, sizeof(outcome), "%lld rows%s%s", (long long)count, rc < 0 ? ", then " : "",
             rc < 0 ? err.message : "");
    api_log_action(call->request, action, body, outcome);
    if (rc < 0)
        return api_respond_store_error(response, &err);
    buffer_printf(&response->body, "{\"%s\":%lld}", delete ? "deleted" : "retried",
                  (long long)count);
    api_respond_json(response, 200);
}

void
api_dead_retry(struct api_call *call)
{
    dead_action(call, DEAD_RETRY);
}

void
api_dead_delete(struct api_call *call)
{
    dead_action(call, DEAD_DELETE);
}
