/*
 * outboxctl replay: publishes succeeded jobs of one queue again, chosen by
 * finish time (a timestamp or a duration ago) or by id, optionally of one
 * ordering key; --dry-run only counts. Rows in other states are counted as
 * refused, never changed.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actions.h"
#include "ctl.h"
#include "parse.h"

#define REPLAY_BATCH_SIZE 1000
#define REPLAY_JOBS_MAX 100000

/*
 * The value of --since or --until: a timestamp PostgreSQL reads, or a
 * DURATION (10m) or a PostgreSQL interval ('10 minutes') meaning that long
 * ago, which become the time it was then in buf. Returns 0, or an exit
 * code after the message.
 */
static int
replay_time(struct ctl *ctl, const char *name, const char *text, char *buf, size_t size,
            const char **out)
{
    struct outbox_error err;
    int64_t seconds;

    if (parse_duration(text, &seconds, &err) == 0) {
        if (store_admin_time_ago(ctl->conn, seconds, buf, size, &err) < 0)
            return ctl_runtime_error(ctl, &err);
        *out = buf;
        return 0;
    }
    if (store_admin_check_time(ctl->conn, text, &err) == 0) {
        *out = text;
        return 0;
    }
    if (err.code == OUTBOX_ERR_INVALID &&
        store_admin_interval_ago(ctl->conn, text, buf, size, &err) == 0) {
        *out = buf;
        return 0;
    }
    if (err.code == OUTBOX_ERR_INVALID)
        return ctl_usage_error("%s: '%.60s' is neither a timestamp, a duration (10m) nor an "
                               "interval ('10 minutes')", name, text);
    return ctl_runtime_error(ctl, &err);
}

/* What the command line asks of a replay. */
struct replay_args {
    const char *queue;
    const char *since;
    const char *until;
    const char *key;
    bool dry_run;
    int64_t *ids; /* calloc'd, room for every argument */
    size_t id_count;
};

/* Takes argv[*index] when it is --job ID: 1 when taken, 0 when not, EXIT_USAGE. */
static int
take_job(const struct ctl *ctl, int argc, char **argv, int *index, struct replay_args *args)
{
    const char *job = NULL;
    int64_t id;
    int taken = ctl_take_value(ctl, argc, argv, index, "--job", &job);

    if (taken != 1)
        return taken;
    if (ctl_number_option("--job", job, 1, INT64_MAX, &id) != 0)
        return EXIT_USAGE;
    if (args->id_count == REPLAY_JOBS_MAX)
        return ctl_usage_error("at most %d --job ids at a time", REPLAY_JOBS_MAX);
    args->ids[args->id_count++] = id;
    return 1;
}

/*
 * Reads replay's options: --job repeats, so replay reads them itself, the
 * rest as ctl_parse_options() does. Returns CTL_GO_ON, or the exit status
 * after --help or a usage message.
 */
static int
parse_replay(struct ctl *ctl, int argc, char **argv, int first, struct replay_args *args)
{
    const struct ctl_option options[] = {
        {"--queue", &args->queue, NULL}, {"--since", &args->since, NULL},
        {"--until", &args->until, NULL}, {"--ordering-key", &args->key, NULL},
        {"--key", &args->key, NULL},     {"--dry-run", NULL, &args->dry_run}};
    int taken = 0;

    for (int i = first; i < argc && taken != EXIT_USAGE; i++) {
        taken = ctl_common_option(ctl, argc, argv, &i);
        if (taken == 0)
            taken = take_job(ctl, argc, argv, &i, args);
        for (size_t o = 0; o < sizeof(options) / sizeof(options[0]) && taken == 0; o++) {
            if (options[o].flag != NULL && strcmp(argv[i], options[o].name) == 0) {
                *options[o].flag = true;
                taken = 1;
            } else if (options[o].flag == NULL) {
                taken = ctl_take_value(ctl, argc, argv, &i, options[o].name, options[o].value);
            }
        }
        if (taken == 0)
            taken = ctl_unexpected_argument(ctl, argv[i]);
    }
    if (taken == EXIT_USAGE)
        return EXIT_USAGE;
    if (ctl->help) {
        ctl_print_usage(ctl);
        return 0;
    }
    return CTL_GO_ON;
}

/* The usage error for options that do not make one replay; 0 when they do. */
static int
check_replay(const struct replay_args *args)
{
    if (args->queue == NULL)
        return ctl_usage_error("'replay' needs --queue Q");
    if (args->id_count == 0 && args->since == NULL)
        return ctl_usage_error("'replay' needs --since TIME or --job ID");
    if (args->id_count > 0 && (args->since != NULL || args->until != NULL))
        return ctl_usage_error("'replay' takes either --since/--until or --job, not both");
    return ctl_check_queue_and_key(args->queue, args->key);
}

static void
print_replay(const struct replay_args *args, const struct store_replay_result *result)
{
    int64_t refused = result->ready + result->running + result->dead;

    printf("%s %lld succeeded job%s of queue '%s'\n", args->dry_run ? "would replay" : "replayed",
           (long long)result->replayed, result->replayed == 1 ? "" : "s", args->queue);
    if (refused > 0)
        printf("refused %lld job%s not in state succeeded: %lld ready, %lld running, %lld dead\n",
               (long long)refused, refused == 1 ? "" : "s", (long long)result->ready,
               (long long)result->running, (long long)result->dead);
    if (result->missing > 0)
        printf("not found in queue '%s'%s: %lld job id%s\n", args->queue,
               args->key != NULL ? " with that ordering key" : "", (long long)result->missing,
               result->missing == 1 ? "" : "s");
}

/* Connects, turns --since and --until into timestamps, and replays; returns the exit status. */
static int
run_replay(struct ctl *ctl, struct replay_args *args)
{
    char since_buf[64], until_buf[64];
    struct store_replay_request request = {.batch_size = REPLAY_BATCH_SIZE};
    struct store_replay_result result;
    struct ctl_batch batch;
    struct outbox_error err;
    int taken;

    if ((taken = ctl_connect(ctl)) != 0 ||
        (args->since != NULL && (taken = replay_time(ctl, "--since", args->since, since_buf,
                                                     sizeof(since_buf), &args->since)) != 0) ||
        (args->until != NULL && (taken = replay_time(ctl, "--until", args->until, until_buf,
                                                     sizeof(until_buf), &args->until)) != 0))
        return taken;
    ctl_batch_init(&batch, "replayed", "jobs");
    request.queue = args->queue;
    request.since = args->since;
    request.until = args->until;
    request.job_ids = args->ids;
    request.job_count = args->id_count;
    request.ordering_key = args->key;
    request.dry_run = args->dry_run;
    request.progress = &batch.progress;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_replay(ctl->conn, &request, &result, &err) < 0)
        return ctl_batch_error(ctl, &batch, &err);
    print_replay(args, &result);
    return 0;
}

int
ctl_command_replay(struct ctl *ctl, int argc, char **argv, int first)
{
    struct replay_args args = {0};
    int rc;

    args.ids = calloc((size_t)argc, sizeof(*args.ids));
    if (args.ids == NULL)
        return ctl_out_of_memory();
    rc = parse_replay(ctl, argc, argv, first, &args);
    if (rc == CTL_GO_ON)
        rc = check_replay(&args);
    if (rc == 0 && !ctl->help)
        rc = run_replay(ctl, &args);
    free(args.ids);
    return rc;
}

/* ---- the console API ---- */

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
                api_respond_store_error(response, &err);
                return false;
            }
            snprintf(reason, sizeof(reason), "%s is not a time: %.100s", i ? "until" : "since",
                     times[i]);
            api_respond_error(response, 400, reason);
            return false;
        }
    }
    return true;
}

void
api_replay(struct api_call *call)
{
    const struct api_body *body = call->body;
    struct console_response *response = call->response;
    PGconn *conn = call->conn;
    struct store_replay_request replay = {0};
    struct store_replay_result result = {0};
    struct outbox_error err;
    char outcome[600];
    int rc;

    if (!body->has_queue)
        return api_respond_error(response, 400, "queue is required");
    if (body->has_job_ids == body->has_since)
        return api_respond_error(response, 400, "give either since (with until) or job_ids");
    if (body->has_until && !body->has_since)
        return api_respond_error(response, 400, "until needs since");
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
    api_log_action(call->request, "replay", body, outcome);
    if (rc < 0)
        return api_respond_store_error(response, &err);
    buffer_printf(&response->body, "{\"dry_run\":%s", body->dry_run ? "true" : "false");
    api_field_int(&response->body, "replayed", result.replayed);
    api_field_int(&response->body, "ready", result.ready);
    api_field_int(&response->body, "running", result.running);
    api_field_int(&response->body, "dead", result.dead);
    api_field_int(&response->body, "missing", result.missing);
    buffer_puts(&response->body, "}");
    api_respond_json(response, 200);
}
