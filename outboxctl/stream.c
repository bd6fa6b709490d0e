/*
 * stream.c - outboxctl stream: make a queue a stream, back again, and list streams.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>

#include <libpq-fe.h>

#include "clock.h"
#include "ctl.h"
#include "error.h"
#include "parse.h"
#include "store_admin_lock.h"
#include "store_stream.h"
#include "stream.h"
#include "timeouts.h"

/*
 * enable and disable change the trigger of outbox.job, which needs a lock
 * that an open transaction on the table holds off. Each try waits for it
 * at most CTL_STREAM_LOCK_TRY_MS, so producers queued behind the try wait
 * no longer; between tries they go on for CTL_STREAM_LOCK_PAUSE_MS.
 * --lock-wait bounds the whole.
 */
const char outboxctl_stream_usage[] =
    "  stream enable QUEUE [--partitions N] [--lock-wait DURATION]\n"
    "                       publish QUEUE as a stream: in commit order per partition, no\n"
    "                       write per row (N 1..256, default 1; ordering keys keep a partition)\n"
    "  stream disable QUEUE [--lock-wait DURATION]\n"
    "                       give QUEUE back to row-state claims (unpublished rows become ready)\n"
    "                       both wait for open transactions on outbox.job in "
    TIMEOUT_TEXT(CTL_STREAM_LOCK_TRY_MS) " ms tries, naming\n"
    "                       them, producers going on between tries; up to DURATION (default "
    TIMEOUT_TEXT(CTL_STREAM_LOCK_WAIT_DEFAULT_SECONDS) "s)\n"
    "  stream list          each stream partition: lag in rows and seconds, and its owner\n";

/* The arguments of one stream command. */
struct stream_args {
    const char *subcommand;
    const char *queue;
    const char *partitions;
    const char *lock_wait;
};

/* The common options, --partitions, then up to two words: the subcommand and QUEUE. */
static int
parse_args(struct ctl *ctl, struct stream_args *a, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i++) {
        int taken = ctl_common_option(ctl, argc, argv, &i);

        if (taken == 0)
            taken = ctl_take_value(ctl, argc, argv, &i, "--partitions", &a->partitions);
        if (taken == 0)
            taken = ctl_take_value(ctl, argc, argv, &i, "--lock-wait", &a->lock_wait);
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
check_args(const struct stream_args *a, int *partitions, int64_t *lock_wait_ms)
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
    if (a->lock_wait != NULL && list)
        return ctl_usage_error("--lock-wait is an option of 'stream enable' and 'stream disable'");
    if (parse_duration_ms(a->lock_wait != NULL
                              ? a->lock_wait
                              : TIMEOUT_TEXT(CTL_STREAM_LOCK_WAIT_DEFAULT_SECONDS) "s",
                          lock_wait_ms, &err) < 0)
        return ctl_usage_error("--lock-wait: %s", err.message);
    return 0;
}

/* One try of enable or disable, waiting at most CTL_STREAM_LOCK_TRY_MS for each lock. */
static int
try_change(PGconn *conn, const struct stream_args *a, int partitions, bool *changed,
           struct outbox_error *err)
{
    if (strcmp(a->subcommand, "enable") == 0)
        return stream_admin_enable(conn, a->queue, partitions, CTL_STREAM_LOCK_TRY_MS, changed,
                                   err);
    return stream_admin_disable(conn, a->queue, CTL_STREAM_LOCK_TRY_MS, changed, err);
}

/*
 * Tries enable or disable until it gets its locks or lock_wait_ms passed,
 * saying on stderr whom it waits for whenever that changes; the final error
 * names them.
 */
static int
change_with_lock_tries(PGconn *conn, const struct stream_args *a, int partitions,
                       int64_t lock_wait_ms, bool *changed, struct outbox_error *err)
{
    enum store_job_lock lock = strcmp(a->subcommand, "enable") == 0
                                   ? STORE_LOCK_SHARE_ROW_EXCLUSIVE
                                   : STORE_LOCK_ACCESS_EXCLUSIVE;
    int64_t start = clock_monotonic_ms(), left;
    char holders[1024], pids[256], said[256] = "";
    struct outbox_error ignored;

    for (;;) {
        if (try_change(conn, a, partitions, changed, err) == 0)
            return 0;
        if (!store_lock_timed_out(err))
            return -1;
        if (store_job_lock_holders(conn, lock, holders, sizeof(holders), pids, sizeof(pids),
                                   &ignored) < 0)
            snprintf(holders, sizeof(holders), "%s", "sessions that could not be read");
        if (holders[0] == '\0')
            snprintf(holders, sizeof(holders), "%s",
                     "no session now (the wait was for another lock)");
        left = lock_wait_ms - (clock_monotonic_ms() - start);
        if (left <= 0)
            return outbox_error_set(err, OUTBOX_ERR_BUSY,
                                    "unable to %s the stream: the lock on 'outbox.job' was not"
                                    " granted within --lock-wait %.1f s, held by %s",
                                    a->subcommand, (double)lock_wait_ms / 1000.0, holders);
        if (strcmp(pids, said) != 0) { /* the holders changed: say whom we wait for now */
            fprintf(stderr, "outboxctl: waiting for the lock on 'outbox.job', held by %s\n",
                    holders);
            snprintf(said, sizeof(said), "%s", pids);
        }
        /* producers go on */
        poll(NULL, 0, (int)(left < CTL_STREAM_LOCK_PAUSE_MS ? left : CTL_STREAM_LOCK_PAUSE_MS));
    }
}

/* Runs the checked command on conn; the exit status. */
static int
run_command(PGconn *conn, const struct stream_args *a, int partitions, int64_t lock_wait_ms,
            struct outbox_error *err)
{
    bool changed = false;

    if (strcmp(a->subcommand, "list") == 0)
        return stream_admin_list(conn, stdout, err);
    if (change_with_lock_tries(conn, a, partitions, lock_wait_ms, &changed, err) < 0)
        return -1;
    if (strcmp(a->subcommand, "enable") == 0) {
        printf("%s queue '%s' (%d partition%s)\n", changed ? "stream enabled:" : "already a stream:",
               a->queue, partitions, partitions == 1 ? "" : "s");
        return 0;
    }
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
    int64_t lock_wait_ms = 0;

    if ((rc = parse_args(&ctl, &a, argc, argv, first)) != 0)
        return rc;
    if (ctl.help) {
        fputs(outboxctl_stream_usage, stdout);
        return 0;
    }
    if ((rc = check_args(&a, &partitions, &lock_wait_ms)) != 0)
        return rc;
    if ((rc = ctl_connect(&ctl)) == 0 && run_command(ctl.conn, &a, partitions, lock_wait_ms, &err) != 0) {
        rc = ctl_runtime_error(&ctl, &err);
        if (err.code == OUTBOX_ERR_INVALID)
            rc = EXIT_USAGE;
    }
    PQfinish(ctl.conn);
    return rc;
}
