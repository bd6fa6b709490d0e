/*
 * stream.c - outboxctl stream: make a queue a stream, back again, and list streams.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "ctl.h"
#include "error.h"
#include "parse.h"
#include "store_stream.h"
#include "stream.h"

const char outboxctl_stream_usage[] =
    "  stream enable QUEUE [--partitions N]\n"
    "                       publish QUEUE as a stream: in commit order per partition, no\n"
    "                       write per row (N 1..256, default 1; ordering keys keep a partition)\n"
    "  stream disable QUEUE give QUEUE back to row-state claims (unpublished rows become ready)\n"
    "  stream list          each stream partition: lag in rows and seconds, and its owner\n";

/* The arguments of one stream command. */
struct stream_args {
    const char *subcommand;
    const char *queue;
    const char *partitions;
};

/* The common options, --partitions, then up to two words: the subcommand and QUEUE. */
static int
parse_args(struct ctl *ctl, struct stream_args *a, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i++) {
        int taken = ctl_common_option(ctl, argc, argv, &i);

        if (taken == 0)
            taken = ctl_take_value(ctl, argc, argv, &i, "--partitions", &a->partitions);
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
        if (taken == 1)
            continue;
        if (argv[i][0] == '-' || a->queue != NULL)
            return ctl_unexpected_argument(ctl, argv[i]);
        if (a->subcommand == NULL)
            a->subcommand = argv[i];
        else
            a->queue = argv[i];
    }
    return 0;
}

/* Checks the arguments against the subcommand; 0 or the usage exit status. */
static int
check_args(const struct stream_args *a, int *partitions)
{
    struct outbox_error err;
    int64_t value = 1;
    bool list;

    if (a->subcommand == NULL)
        return ctl_usage_error("'stream' needs a subcommand: enable, disable or list");
    list = strcmp(a->subcommand, "list") == 0;
    if (!list && strcmp(a->subcommand, "enable") != 0 && strcmp(a->subcommand, "disable") != 0)
        return ctl_usage_error("unknown subcommand '%s' for 'stream': use enable, disable or list",
                     a->subcommand);
    if (list && a->queue != NULL)
        return ctl_usage_error("unexpected argument '%s' for 'stream list'", a->queue);
    if (!list && a->queue == NULL)
        return ctl_usage_error("'stream %s' needs a QUEUE", a->subcommand);
    if (a->partitions != NULL && strcmp(a->subcommand, "enable") != 0)
        return ctl_usage_error("--partitions is an option of 'stream enable' only");
    if (a->partitions != NULL && parse_integer(a->partitions, 1, 256, &value, &err) < 0)
        return ctl_usage_error("--partitions: %s", err.message);
    *partitions = (int)value;
    return 0;
}

/* Runs the checked command on conn; the exit status. */
static int
run_command(PGconn *conn, const struct stream_args *a, int partitions, struct outbox_error *err)
{
    bool changed = false;

    if (strcmp(a->subcommand, "list") == 0)
        return stream_admin_list(conn, stdout, err);
    if (strcmp(a->subcommand, "enable") == 0) {
        if (stream_admin_enable(conn, a->queue, partitions, &changed, err) < 0)
            return -1;
        printf("%s queue '%s' (%d partition%s)\n", changed ? "stream enabled:" : "already a stream:",
               a->queue, partitions, partitions == 1 ? "" : "s");
        return 0;
    }
    if (stream_admin_disable(conn, a->queue, &changed, err) < 0)
        return -1;
    printf("%s queue '%s'\n", changed ? "stream disabled:" : "not a stream:", a->queue);
    return 0;
}

int
outboxctl_stream(const char *database_url, int argc, char **argv, int first)
{
    struct ctl ctl = {.database_url = database_url, .command = "stream"};
    struct stream_args a = {0};
    struct outbox_error err;
    int partitions = 1, rc;

    if ((rc = parse_args(&ctl, &a, argc, argv, first)) != 0)
        return rc;
    if (ctl.help) {
        fputs(outboxctl_stream_usage, stdout);
        return 0;
    }
    if ((rc = check_args(&a, &partitions)) != 0)
        return rc;
    if ((rc = ctl_connect(&ctl)) == 0 && run_command(ctl.conn, &a, partitions, &err) != 0) {
        rc = ctl_runtime_error(&ctl, &err);
        if (err.code == OUTBOX_ERR_INVALID)
            rc = EXIT_USAGE;
    }
    PQfinish(ctl.conn);
    return rc;
}
