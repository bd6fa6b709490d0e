/*
 * stream.c - outboxctl stream: make a queue a stream, back again, and list streams.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "error.h"
#include "parse.h"
#include "store_admin.h"
#include "store_stream.h"
#include "stream.h"
#include "redact.h"
#include "url_check.h"

#define STREAM_EXIT_USAGE 2

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
    const char *database_url;
    bool help;
};

static int usage(const char *format, ...) __attribute__((format(printf, 1, 2)));

static int
usage(const char *format, ...)
{
    va_list ap;

    fputs("outboxctl: ", stderr);
    va_start(ap, format);
    vfprintf(stderr, format, ap);
    va_end(ap);
    fputs(" (see outboxctl --help)\n", stderr);
    return STREAM_EXIT_USAGE;
}

/* "--name VALUE" or "--name=VALUE" at argv[*i]: 1 taken, 0 not this option, 2 no value. */
static int
option_value(int argc, char **argv, int *i, const char *name, const char **value)
{
    size_t len = strlen(name);

    if (strncmp(argv[*i], name, len) != 0)
        return 0;
    if (argv[*i][len] == '=') {
        *value = argv[*i] + len + 1;
        return 1;
    }
    if (argv[*i][len] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        usage("option '%s' of 'stream' needs a value", name);
        return 2;
    }
    *value = argv[++*i];
    return 1;
}

static int
parse_args(struct stream_args *a, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i++) {
        int taken;

        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            a->help = true;
            continue;
        }
        taken = option_value(argc, argv, &i, "--database-url", &a->database_url);
        if (taken == 0)
            taken = option_value(argc, argv, &i, "--partitions", &a->partitions);
        if (taken == 2)
            return STREAM_EXIT_USAGE;
        if (taken == 1)
            continue;
        if (argv[i][0] == '-')
            return usage("unknown option '%s' for 'stream'", argv[i]);
        if (a->subcommand == NULL)
            a->subcommand = argv[i];
        else if (a->queue == NULL)
            a->queue = argv[i];
        else
            return usage("unexpected argument '%s' for 'stream'", argv[i]);
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
        return usage("'stream' needs a subcommand: enable, disable or list");
    list = strcmp(a->subcommand, "list") == 0;
    if (!list && strcmp(a->subcommand, "enable") != 0 && strcmp(a->subcommand, "disable") != 0)
        return usage("unknown subcommand '%s' for 'stream': use enable, disable or list",
                     a->subcommand);
    if (list && a->queue != NULL)
        return usage("unexpected argument '%s' for 'stream list'", a->queue);
    if (!list && a->queue == NULL)
        return usage("'stream %s' needs a QUEUE", a->subcommand);
    if (a->partitions != NULL && strcmp(a->subcommand, "enable") != 0)
        return usage("--partitions is an option of 'stream enable' only");
    if (a->partitions != NULL && parse_integer(a->partitions, 1, 256, &value, &err) < 0)
        return usage("--partitions: %s", err.message);
    *partitions = (int)value;
    if (a->database_url == NULL || a->database_url[0] == '\0')
        return usage("missing database URL: give --database-url or set OUTBOX_DATABASE_URL");
    if (url_check_database(a->database_url, &err) != 0)
        return usage("--database-url: %s", err.message);
    return 0;
}

/* Runs the checked command on conn; the exit status. */
static int
run_command(PGconn *conn, const struct stream_args *a, int partitions, struct outbox_error *err)
{
    bool changed = false;

    if (store_admin_check_schema(conn, err) < 0)
        return -1;
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
    struct stream_args a = {.database_url = database_url};
    struct outbox_error err;
    char message[OUTBOX_ERROR_MESSAGE_MAX];
    PGconn *conn;
    int partitions = 1, rc;

    if ((rc = parse_args(&a, argc, argv, first)) != 0)
        return rc;
    if (a.help) {
        fputs(outboxctl_stream_usage, stdout);
        return 0;
    }
    if ((rc = check_args(&a, &partitions)) != 0)
        return rc;
    conn = PQconnectdb(a.database_url);
    if (PQstatus(conn) != CONNECTION_OK) {
        outbox_error_from_connect(&err, conn, a.database_url, "unable to connect to the database");
        rc = 1;
    } else {
        rc = run_command(conn, &a, partitions, &err) == 0 ? 0 : 1;
        if (rc != 0 && err.code == OUTBOX_ERR_INVALID)
            rc = STREAM_EXIT_USAGE;
    }
    PQfinish(conn);
    if (rc != 0) {
        url_redact_message(err.message, a.database_url, NULL, message, sizeof(message));
        fprintf(stderr, "outboxctl: %s\n", message);
    }
    return rc;
}
