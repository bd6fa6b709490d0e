/*
 * outboxctl inbox purge: deletes the consumers' inbox records (and keyed
 * inbox marks) accepted longer ago than a duration, in short transactions;
 * what was deleted before an error is reported.
 */
#include <stdint.h>
#include <stdio.h>

#include "ctl.h"
#include "parse.h"

int
ctl_command_inbox_purge(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *older_than = NULL;
    int64_t seconds = 0, count = 0;
    struct outbox_error err;
    int taken;

    const struct ctl_option options[] = {{"--older-than", &older_than, NULL}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 1)) != CTL_GO_ON)
        return taken;
    if (older_than == NULL)
        return ctl_usage_error("'inbox purge' needs --older-than DURATION");
    if (parse_duration(older_than, &seconds, &err) < 0)
        return ctl_usage_error("--older-than: %s", err.message);
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_inbox_purge(ctl->conn, seconds, PURGE_BATCH_SIZE, &count, &err) < 0) {
        if (count > 0)
            fprintf(stderr, "outboxctl: purged %lld inbox records before the error\n",
                    (long long)count);
        return ctl_runtime_error(ctl, &err);
    }
    printf("purged %lld inbox record%s accepted more than %s ago\n", (long long)count,
           count == 1 ? "" : "s", older_than);
    return 0;
}
