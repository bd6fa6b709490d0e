/*
 * outboxctl dead list and dead retry: the jobs that ran out of attempts,
 * with their last error, and making them ready again with more attempts.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

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
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_dead_list(ctl->conn, queue, limit, &list, &err) < 0)
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
    int taken;

    const struct ctl_option options[] = {{"--queue", &queue, NULL},
                                         {"--job", &job_text, NULL},
                                         {"--extra-attempts", &extra_text, NULL}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 3)) != CTL_GO_ON)
        return taken;
    if (job_text != NULL && ctl_number_option("--job", job_text, 1, INT64_MAX, &job_id) != 0)
        return EXIT_USAGE;
    if (extra_text != NULL &&
        ctl_number_option("--extra-attempts", extra_text, 1, EXTRA_ATTEMPTS_MAX, &extra) != 0)
        return EXIT_USAGE;
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_dead_retry(ctl->conn, queue, job_id, (int32_t)extra, &count, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    printf("retried %lld dead job%s\n", (long long)count, count == 1 ? "" : "s");
    return 0;
}
