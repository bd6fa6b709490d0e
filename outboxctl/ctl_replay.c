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

#include "ctl.h"
#include "parse.h"

#define REPLAY_BATCH_SIZE 1000
#define REPLAY_JOBS_MAX 100000

/*
 * The value of --since or --until: a timestamp PostgreSQL reads, or a
 * DURATION meaning that long ago. Durations become "now - N seconds" texts
 * in buf. Returns 0, or an exit code after the message.
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
    if (store_admin_check_time(ctl->conn, text, &err) < 0) {
        if (err.code == OUTBOX_ERR_INVALID)
            return ctl_usage_error("%s: '%.60s' is neither a timestamp nor a duration", name, text);
        return ctl_runtime_error(ctl, &err);
    }
    *out = text;
    return 0;
}

int
ctl_command_replay(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *since = NULL, *until = NULL, *key = NULL;
    char since_buf[64], until_buf[64];
    struct store_replay_request request = {.batch_size = REPLAY_BATCH_SIZE};
    struct store_replay_result result;
    struct outbox_error err;
    int64_t *ids = NULL;
    size_t id_count = 0;
    int taken, rc;

    const struct ctl_option options[] = {{"--queue", &queue, NULL},
                                             {"--since", &since, NULL},
                                             {"--until", &until, NULL},
                                             {"--ordering-key", &key, NULL},
                                             {"--key", &key, NULL},
                                             {"--dry-run", NULL, &request.dry_run}};

    /* --job repeats, so replay reads its options itself; the rest as everywhere */
    ids = calloc((size_t)argc, sizeof(*ids));
    if (ids == NULL)
        return ctl_out_of_memory();
    taken = 0;
    for (int i = first; i < argc && taken != EXIT_USAGE; i++) {
        const char *job = NULL;
        int64_t id;

        taken = ctl_common_option(ctl, argc, argv, &i);
        if (taken == 0 && (taken = ctl_take_value(ctl, argc, argv, &i, "--job", &job)) == 1) {
            if (ctl_number_option("--job", job, 1, INT64_MAX, &id) != 0)
                taken = EXIT_USAGE;
            else if (id_count == REPLAY_JOBS_MAX)
                taken = ctl_usage_error("at most %d --job ids at a time", REPLAY_JOBS_MAX);
            else
                ids[id_count++] = id;
        }
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
    if (taken == EXIT_USAGE || ctl->help) {
        free(ids);
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
        ctl_print_usage();
        return 0;
    }
    rc = 0;
    if (queue == NULL)
        rc = ctl_usage_error("'replay' needs --queue Q");
    else if (id_count == 0 && since == NULL)
        rc = ctl_usage_error("'replay' needs --since TIME or --job ID");
    else if (id_count > 0 && (since != NULL || until != NULL))
        rc = ctl_usage_error("'replay' takes either --since/--until or --job, not both");
    else
        rc = ctl_check_queue_and_key(queue, key);
    if (rc != 0) {
        free(ids);
        return rc;
    }
    if ((taken = ctl_connect(ctl)) != 0 ||
        (since != NULL &&
         (taken = replay_time(ctl, "--since", since, since_buf, sizeof(since_buf), &since)) != 0) ||
        (until != NULL &&
         (taken = replay_time(ctl, "--until", until, until_buf, sizeof(until_buf), &until)) != 0)) {
        free(ids);
        return taken;
    }
    request.queue = queue;
    request.since = since;
    request.until = until;
    request.job_ids = ids;
    request.job_count = id_count;
    request.ordering_key = key;
    rc = store_admin_check_schema(ctl->conn, &err) < 0 ||
         store_admin_replay(ctl->conn, &request, &result, &err) < 0;
    free(ids);
    if (rc != 0) {
        if (result.replayed > 0)
            fprintf(stderr, "outboxctl: replayed %lld jobs before the error\n",
                    (long long)result.replayed);
        return ctl_runtime_error(ctl, &err);
    }
    printf("%s %lld succeeded job%s of queue '%s'\n",
           request.dry_run ? "would replay" : "replayed", (long long)result.replayed,
           result.replayed == 1 ? "" : "s", queue);
    if (result.ready + result.running + result.dead > 0)
        printf("refused %lld job%s not in state succeeded: %lld ready, %lld running, %lld dead\n",
               (long long)(result.ready + result.running + result.dead),
               result.ready + result.running + result.dead == 1 ? "" : "s",
               (long long)result.ready, (long long)result.running, (long long)result.dead);
    if (result.missing > 0)
        printf("not found in queue '%s'%s: %lld job id%s\n", queue,
               key != NULL ? " with that ordering key" : "", (long long)result.missing,
               result.missing == 1 ? "" : "s");
    return 0;
}
