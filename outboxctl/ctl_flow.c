/*
 * outboxctl pause, resume and paused: the flow control of queues and of
 * single ordering keys, through outbox.pause() and outbox.resume(); relays
 * stop or start claiming at their next claim, producers are never stopped.
 * The pause list's table and JSON are shared with status.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "actions.h"
#include "ctl.h"

/* Writes the pauses as a JSON array. */
void
ctl_print_pauses_json(const struct store_pause_list *list)
{
    fputc('[', stdout);
    for (size_t i = 0; i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];

        fputs(i > 0 ? ",{\"queue\":" : "{\"queue\":", stdout);
        ctl_json_string(stdout, pause->queue);
        fputs(",\"ordering_key\":", stdout);
        ctl_json_string(stdout, pause->ordering_key);
        fputs(",\"reason\":", stdout);
        ctl_json_string(stdout, pause->reason);
        fputs(",\"paused_by\":", stdout);
        ctl_json_string(stdout, pause->paused_by);
        fputs(",\"paused_at\":", stdout);
        ctl_json_string(stdout, pause->paused_at);
        fputc('}', stdout);
    }
    fputc(']', stdout);
}

/* Adds the header and one row per pause to table (5 columns). */
bool
ctl_pauses_table(struct ctl_table *table, const struct store_pause_list *list)
{
    bool ok = ctl_table_add_row(table, "QUEUE", "ORDERING KEY", "PAUSED AT", "BY", "REASON");

    for (size_t i = 0; ok && i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];
        char key[256], reason[256];

        ok = ctl_table_add_row(
            table, pause->queue,
            pause->ordering_key ? ctl_one_line(key, sizeof(key), pause->ordering_key)
                                : "(whole queue)",
            pause->paused_at, pause->paused_by,
            pause->reason ? ctl_one_line(reason, sizeof(reason), pause->reason) : "-");
    }
    return ok;
}
/*
 * Takes argv[*first] as the command's positional QUEUE argument when it is
 * not an option. Returns 0 with *queue set, or EXIT_USAGE.
 */
static int
queue_argument(const struct ctl *ctl, int argc, char **argv, int *first, const char **queue)
{
    if (*first < argc && argv[*first][0] != '-') {
        *queue = argv[*first];
        *first += 1;
        return 0;
    }
    for (int i = *first; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 0; /* --help prints the usage, wanted or not */
    return ctl_usage_error("'%s' needs a QUEUE", ctl->command);
}

/*
 * What pause and resume do before their statement: QUEUE, the options, the
 * name checks, the connection and the schema check. Returns CTL_GO_ON with
 * ctl->conn ready, or the exit status (after the message).
 */
static int
flow_start(struct ctl *ctl, int argc, char **argv, int first, const struct ctl_option *options,
           size_t count, const char **queue, const char *const *key)
{
    struct outbox_error err;
    int taken;

    if ((taken = queue_argument(ctl, argc, argv, &first, queue)) != 0)
        return taken;
    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, count)) != CTL_GO_ON)
        return taken;
    if ((taken = ctl_check_queue_and_key(*queue, *key)) != 0)
        return taken;
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    return CTL_GO_ON;
}

int
ctl_command_pause(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *key = NULL, *reason = NULL;
    char key_text[256];
    struct outbox_error err;
    bool changed = false;
    int taken;

    const struct ctl_option options[] = {
        {"--ordering-key", &key, NULL}, {"--key", &key, NULL}, {"--reason", &reason, NULL}};

    if (first < argc && strcmp(argv[first], "--database") == 0)
        return ctl_command_database_pause(ctl, argc, argv, first + 1, CTL_PAUSE);
    if ((taken = flow_start(ctl, argc, argv, first, options, 3, &queue, &key)) != CTL_GO_ON)
        return taken;
    if (store_admin_pause(ctl->conn, queue, key, reason, &changed, &err) < 0) {
        taken = ctl_runtime_error(ctl, &err);
        return err.code == OUTBOX_ERR_INVALID ? EXIT_USAGE : taken; /* a key of a stream queue */
    }
    if (key != NULL)
        printf("%s ordering key '%s' of queue '%s'\n", changed ? "paused" : "already paused:",
               ctl_one_line(key_text, sizeof(key_text), key), queue);
    else
        printf("%s queue '%s'\n", changed ? "paused" : "already paused:", queue);
    return 0;
}

int
ctl_command_resume(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *key = NULL;
    char key_text[256];
    struct outbox_error err;
    bool changed = false;
    int64_t keys = 0;
    int taken;

    const struct ctl_option options[] = {{"--ordering-key", &key, NULL}, {"--key", &key, NULL}};

    if (first < argc && strcmp(argv[first], "--database") == 0)
        return ctl_command_database_pause(ctl, argc, argv, first + 1, CTL_RESUME);
    if ((taken = flow_start(ctl, argc, argv, first, options, 2, &queue, &key)) != CTL_GO_ON)
        return taken;
    if (store_admin_resume(ctl->conn, queue, key, &changed, &keys, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    if (key != NULL)
        printf("%s ordering key '%s' of queue '%s'\n", changed ? "resumed" : "was not paused:",
               ctl_one_line(key_text, sizeof(key_text), key), queue);
    else
        printf("%s queue '%s'\n", changed ? "resumed" : "was not paused:", queue);
    if (key == NULL && keys > 0)
        printf("%lld ordering key%s of queue '%s' stay%s paused"
               " (resume them with --ordering-key)\n",
               (long long)keys, keys == 1 ? "" : "s", queue, keys == 1 ? "s" : "");
    return 0;
}

int
ctl_command_paused(struct ctl *ctl, int argc, char **argv, int first)
{
    struct store_pause_list list;
    struct ctl_table table = {.columns = 5};
    struct outbox_error err;
    bool ok;
    int taken;

    if ((taken = ctl_parse_options(ctl, argc, argv, first, NULL, 0)) != CTL_GO_ON)
        return taken;
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_paused(ctl->conn, &list, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    if (list.count == 0) {
        puts("nothing is paused");
        return 0;
    }
    ok = ctl_pauses_table(&table, &list);
    if (ok)
        ctl_table_print(&table, stdout);
    ctl_table_clear(&table);
    store_pause_list_clear(&list);
    return ok ? 0 : ctl_out_of_memory();
}

/* ---- the console API ---- */

/* Pauses or resumes the queue, or one ordering key of it, the body names. */
static void
flow_action(struct api_call *call, enum ctl_flow flow)
{
    const struct api_body *body = call->body;
    struct console_response *response = call->response;
    PGconn *conn = call->conn;
    const char *key = body->has_key ? body->ordering_key : NULL;
    struct outbox_error err;
    bool changed = false;
    int64_t still = 0; /* not reported: read in the statement's snapshot, before the resume */
    int rc;

    if (!body->has_queue)
        return api_respond_error(response, 400, "queue is required");
    if (flow == CTL_PAUSE)
        rc = store_admin_pause(conn, body->queue, key, body->has_reason ? body->reason : NULL,
                               &changed, &err);
    else
        rc = store_admin_resume(conn, body->queue, key, &changed, &still, &err);
    api_log_action(call->request, flow == CTL_PAUSE ? "pause" : "resume", body,
                   rc < 0    ? err.message
                   : changed ? "1 row"
                             : "0 rows (no change)");
    if (rc < 0)
        return api_respond_store_error(response, &err);
    buffer_printf(&response->body, "{\"changed\":%s", changed ? "true" : "false");
    buffer_puts(&response->body, "}");
    api_respond_json(response, 200);
}

void
api_pause(struct api_call *call)
{
    flow_action(call, CTL_PAUSE);
}

void
api_resume(struct api_call *call)
{
    flow_action(call, CTL_RESUME);
}
