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

#include "ctl.h"
#include "parse.h"
#include "retention.h"

/* Longest last_error shown in status's blocked keys table; --json has it whole. */
#define BLOCKED_ERROR_WIDTH 60

static void
print_status_json(const struct store_status *status)
{
    const struct store_oldest_transaction *oldest = &status->oldest_transaction;

    printf("{\"schema_version\":%d,\"queues\":[", status->schema_version);
    for (size_t i = 0; i < status->queue_count; i++) {
        const struct store_queue_status *queue = &status->queues[i];

        printf("%s{\"queue\":", i > 0 ? "," : "");
        ctl_json_string(stdout, queue->queue);
        printf(",\"ready\":%lld,\"running\":%lld,\"succeeded\":%lld,\"dead\":%lld,"
               "\"oldest_ready_age_seconds\":%.3f,\"paused\":%s,\"paused_keys\":%lld,"
               "\"blocked_keys\":%lld,\"blocked\":[",
               (long long)queue->ready, (long long)queue->running, (long long)queue->succeeded,
               (long long)queue->dead, queue->oldest_ready_seconds,
               queue->paused ? "true" : "false", (long long)queue->paused_keys,
               (long long)queue->blocked_keys);
        for (size_t k = 0, shown = 0; k < status->blocked_count; k++) {
            const struct store_blocked_key *key = &status->blocked[k];

            if (strcmp(key->queue, queue->queue) != 0)
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
        fputs("]}", stdout);
    }
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
    if (!oldest->present) {
        fputs("null", stdout);
    } else {
        printf("{\"pid\":%d,\"application_name\":", oldest->pid);
        ctl_json_string(stdout, oldest->application_name);
        fputs(",\"state\":", stdout);
        ctl_json_string(stdout, oldest->state);
        printf(",\"age_seconds\":%.3f,\"xid_age\":%lld}", oldest->age_seconds,
               (long long)oldest->xid_age);
    }
    fputs("}\n", stdout);
}

static int
print_status_text(const struct store_status *status)
{
    static const bool numbers[] = {false, true, true, true, true, true, true};
    const struct store_oldest_transaction *oldest = &status->oldest_transaction;
    struct ctl_table summary = {.columns = 2};
    static const bool blocked_numbers[] = {false, false, true, false, true, true, false};
    struct ctl_table queues = {.columns = 7, .right_aligned = numbers};
    struct ctl_table blocked = {.columns = 7, .right_aligned = blocked_numbers};
    struct ctl_table paused = {.columns = 5};
    char a[64], b[64], c[64], d[64], e[64], line[256];
    bool ok = true;

    snprintf(a, sizeof(a), "%d", status->schema_version);
    ok = ok && ctl_table_add_row(&summary, "schema version", a);
    snprintf(line, sizeof(line), "%s table, %s indexes",
             ctl_format_bytes(a, sizeof(a), status->table_bytes),
             ctl_format_bytes(b, sizeof(b), status->index_bytes));
    ok = ok && ctl_table_add_row(&summary, "outbox.job size", line);
    snprintf(line, sizeof(line), "%lld live, %lld dead (not yet vacuumed)",
             (long long)status->live_tuples, (long long)status->dead_tuples);
    ok = ok && ctl_table_add_row(&summary, "row versions", line);
    ok = ok && ctl_table_add_row(&summary, "last autovacuum",
                             status->last_autovacuum ? status->last_autovacuum : "never");
    ok = ok && ctl_table_add_row(&summary, "last autoanalyze",
                             status->last_autoanalyze ? status->last_autoanalyze : "never");
    if (status->cleanup.past_retention_rows > 0)
        snprintf(line, sizeof(line),
                 "%lld, of them %lld past the retention of %.0fs (the oldest by %.1fs)",
                 (long long)status->cleanup.succeeded_rows,
                 (long long)status->cleanup.past_retention_rows, status->retention_seconds,
                 status->cleanup.oldest_past_retention_seconds);
    else if (status->retention_seconds <= 0)
        snprintf(line, sizeof(line), "%lld, kept (retention 0)",
                 (long long)status->cleanup.succeeded_rows);
    else
        snprintf(line, sizeof(line), "%lld, none past the retention of %.0fs",
                 (long long)status->cleanup.succeeded_rows, status->retention_seconds);
    ok = ok && ctl_table_add_row(&summary, "succeeded rows", line);
    if (oldest->present)
        snprintf(line, sizeof(line), "pid %d (%s, %s), open %.1fs, xmin %lld transactions old",
                 oldest->pid,
                 oldest->application_name[0] ? oldest->application_name : "no application name",
                 oldest->state[0] ? oldest->state : "unknown state", oldest->age_seconds,
                 (long long)oldest->xid_age);
    else
        snprintf(line, sizeof(line), "none");
    ok = ok && ctl_table_add_row(&summary, "oldest transaction", line);

    ok = ok &&
         ctl_table_add_row(&queues, "QUEUE", "READY", "RUNNING", "SUCCEEDED", "DEAD", "OLDEST READY",
                       "BLOCKED KEYS");
    for (size_t i = 0; ok && i < status->queue_count; i++) {
        const struct store_queue_status *queue = &status->queues[i];

        snprintf(a, sizeof(a), "%lld", (long long)queue->ready);
        snprintf(b, sizeof(b), "%lld", (long long)queue->running);
        snprintf(c, sizeof(c), "%lld", (long long)queue->succeeded);
        snprintf(d, sizeof(d), "%lld", (long long)queue->dead);
        snprintf(e, sizeof(e), "%.1fs", queue->oldest_ready_seconds);
        snprintf(line, sizeof(line), "%lld", (long long)queue->blocked_keys);
        ok = ctl_table_add_row(&queues, queue->queue, a, b, c, d, e, line);
    }
    if (ok && status->blocked_count > 0) {
        ok = ctl_table_add_row(&blocked, "QUEUE", "ORDERING KEY", "HEAD JOB", "HEAD STATE",
                           "ATTEMPTS", "WAITING", "LAST ERROR");
        for (size_t i = 0; ok && i < status->blocked_count; i++) {
            const struct store_blocked_key *key = &status->blocked[i];
            char error[BLOCKED_ERROR_WIDTH + 4];

            snprintf(a, sizeof(a), "%lld", (long long)key->head_job_id);
            if (strcmp(key->head_state, "ready") == 0 && key->retry_in_seconds < 0)
                snprintf(b, sizeof(b), "retry never");
            else if (strcmp(key->head_state, "ready") == 0 && key->retry_in_seconds > 0)
                snprintf(b, sizeof(b), "retry in %.0fs", key->retry_in_seconds);
            else if (strcmp(key->head_state, "ready") == 0)
                snprintf(b, sizeof(b), "retry due");
            else if (strcmp(key->head_state, "running") == 0 && key->last_error != NULL)
                snprintf(b, sizeof(b), "retrying");
            else if (strcmp(key->head_state, "running") == 0)
                snprintf(b, sizeof(b), "running");
            else
                snprintf(b, sizeof(b), "%s", key->head_state);
            snprintf(c, sizeof(c), "%d/%d", (int)key->attempts, (int)key->max_attempts);
            snprintf(d, sizeof(d), "%lld", (long long)key->waiting);
            ctl_one_line(error, BLOCKED_ERROR_WIDTH + 1, key->last_error ? key->last_error : "-");
            if (key->last_error != NULL && strlen(key->last_error) > BLOCKED_ERROR_WIDTH)
                strcat(error, "...");
            ok = ctl_table_add_row(&blocked, key->queue, ctl_one_line(line, sizeof(line), key->ordering_key),
                               a, b, c, d, error);
        }
    }
    if (ok && status->paused.count > 0)
        ok = ctl_pauses_table(&paused, &status->paused);
    if (ok) {
        ctl_table_print(&summary, stdout);
        fputc('\n', stdout);
        if (status->queue_count == 0)
            fputs("no jobs\n", stdout);
        else
            ctl_table_print(&queues, stdout);
        if (status->blocked_count > 0) {
            printf("\nblocked ordering keys (head dead, retrying or stuck running;"
                   " oldest %d per queue):\n",
                   STORE_BLOCKED_KEYS_PER_QUEUE);
            ctl_table_print(&blocked, stdout);
        }
        if (status->paused.count > 0) {
            fputs("\npaused (relays claim nothing of these):\n", stdout);
            ctl_table_print(&paused, stdout);
        }
    }
    ctl_table_clear(&paused);
    ctl_table_clear(&summary);
    ctl_table_clear(&queues);
    ctl_table_clear(&blocked);
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
