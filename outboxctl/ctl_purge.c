/*
 * outboxctl purge and inbox purge: delete succeeded jobs finished (or inbox
 * records and keyed inbox marks accepted) longer ago than a duration, in
 * short transactions that take turns with the relays; what was deleted
 * before an error stopped it is reported. Both run the same steps, told
 * apart by a struct purge_kind.
 */
#include <stdint.h>
#include <stdio.h>

#include "ctl.h"
#include "parse.h"

/* What one purge subcommand deletes, and how it speaks of it. */
struct purge_kind {
    const char *command; /* as usage errors name it */
    int (*purge)(PGconn *conn, int64_t older_than_seconds, int batch_size,
                 const struct store_progress *progress, int64_t *count, struct outbox_error *err);
    const char *rows;     /* "succeeded jobs", for the line an error ends */
    const char *row;      /* "succeeded job", for the result: plural with s */
    const char *finished; /* "finished" or "accepted" */
};

static const struct purge_kind job_purge = {"purge", store_admin_purge, "succeeded jobs",
                                            "succeeded job", "finished"};

static const struct purge_kind inbox_purge = {"inbox purge", store_admin_inbox_purge,
                                              "inbox records", "inbox record", "accepted"};

static int
run_purge(struct ctl *ctl, int argc, char **argv, int first, const struct purge_kind *kind)
{
    const char *older_than = NULL;
    int64_t seconds = 0, count = 0;
    struct ctl_batch batch;
    struct outbox_error err;
    int taken;

    const struct ctl_option options[] = {{"--older-than", &older_than, NULL}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 1)) != CTL_GO_ON)
        return taken;
    if (older_than == NULL)
        return ctl_usage_error("'%s' needs --older-than DURATION", kind->command);
    if (parse_duration(older_than, &seconds, &err) < 0)
        return ctl_usage_error("--older-than: %s", err.message);
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    ctl_batch_init(&batch, "purged", kind->rows);
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        kind->purge(ctl->conn, seconds, PURGE_BATCH_SIZE, &batch.progress, &count, &err) < 0)
        return ctl_batch_error(ctl, &batch, &err);
    printf("purged %lld %s%s %s more than %s ago\n", (long long)count, kind->row,
           count == 1 ? "" : "s", kind->finished, older_than);
    return 0;
}

int
ctl_command_purge(struct ctl *ctl, int argc, char **argv, int first)
{
    return run_purge(ctl, argc, argv, first, &job_purge);
}

int
ctl_command_inbox_purge(struct ctl *ctl, int argc, char **argv, int first)
{
    return run_purge(ctl, argc, argv, first, &inbox_purge);
}
