/*
 * ctl_common.c - what every outboxctl subcommand shares: the --help text,
 * option parsing, the one-line usage and runtime errors (with the password
 * scrubbed), the database connection and the batch progress lines. It
 * calls no subcommand; outboxctl.c and the ctl_<job>.c files stand above it.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "console.h"
#include "ctl.h"
#include "error.h"
#include "migrate.h"
#include "names.h"
#include "parse.h"
#include "redact.h"
#include "retention.h"
#include "timeouts.h"
#include "url_check.h"

#ifndef OUTBOX_VERSION
#define OUTBOX_VERSION "unknown"
#endif

void
ctl_print_usage(const struct ctl *ctl)
{
    if (ctl->print_usage != NULL)
        ctl->print_usage(stdout);
}

/* Prints "outboxctl: <message>" as one line on stderr and returns EXIT_USAGE. */
int
ctl_usage_error(const char *format, ...)
{
    va_list ap;

    fputs("outboxctl: ", stderr);
    va_start(ap, format);
    vfprintf(stderr, format, ap);
    va_end(ap);
    fputs(" (see outboxctl --help)\n", stderr);
    return EXIT_USAGE;
}

/* Prints a runtime error, scrubbed of passwords, and returns 1. */
int
ctl_runtime_error(const struct ctl *ctl, const struct outbox_error *err)
{
    char message[OUTBOX_ERROR_MESSAGE_MAX];

    url_redact_message(err->message, ctl->database_url, NULL, message, sizeof(message));
    fprintf(stderr, "outboxctl: %s\n", message);
    return 1;
}

int
ctl_out_of_memory(void)
{
    fputs("outboxctl: out of memory\n", stderr);
    return 1;
}

/*
 * When argv[*index] is option name, as "NAME VALUE" or "NAME=VALUE", stores
 * the value, moves *index to the last argument used and returns 1. Returns 0
 * for any other argument, and EXIT_USAGE (after the message) when the value
 * is missing.
 */
int
ctl_take_value(const struct ctl *ctl, int argc, char **argv, int *index, const char *name,
               const char **value)
{
    const char *arg = argv[*index];
    size_t len = strlen(name);

    if (strncmp(arg, name, len) != 0)
        return 0;
    if (arg[len] == '=') {
        *value = arg + len + 1;
        return 1;
    }
    if (arg[len] != '\0')
        return 0;
    if (*index + 1 >= argc)
        return ctl_usage_error("option '%s' of '%s' needs a value", name, ctl->command);
    *index += 1;
    *value = argv[*index];
    return 1;
}

/*
 * Options every command accepts: --database-url and --help. Returns 1 when
 * argv[*index] was one, 0 when not, EXIT_USAGE on a missing value.
 */
int
ctl_common_option(struct ctl *ctl, int argc, char **argv, int *index)
{
    int taken;

    if (strcmp(argv[*index], "--help") == 0 || strcmp(argv[*index], "-h") == 0) {
        ctl->help = true;
        return 1;
    }
    taken = ctl_take_value(ctl, argc, argv, index, "--database-url", &ctl->database_url);
    return taken;
}

int
ctl_unexpected_argument(const struct ctl *ctl, const char *arg)
{
    if (arg[0] == '-')
        return ctl_usage_error("unknown option '%s' for '%s'", arg, ctl->command);
    return ctl_usage_error("unexpected argument '%s' for '%s'", arg, ctl->command);
}

/*
 * Reads argv[first..] as the common options plus the command's own. Returns
 * CTL_GO_ON when the command should run, or the exit status to return
 * now: EXIT_USAGE after a usage message, 0 after printing --help.
 */
int
ctl_parse_options(struct ctl *ctl, int argc, char **argv, int first,
                  const struct ctl_option *options, size_t count)
{
    for (int i = first; i < argc; i++) {
        int taken = ctl_common_option(ctl, argc, argv, &i);

        for (size_t o = 0; o < count && taken == 0; o++) {
            if (options[o].flag != NULL) {
                if (strcmp(argv[i], options[o].name) == 0) {
                    *options[o].flag = true;
                    taken = 1;
                }
            } else {
                taken = ctl_take_value(ctl, argc, argv, &i, options[o].name, options[o].value);
            }
        }
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
        if (taken == 0)
            return ctl_unexpected_argument(ctl, argv[i]);
    }
    if (ctl->help) {
        ctl_print_usage(ctl);
        return 0;
    }
    return CTL_GO_ON;
}

/* Parses a numeric option value, reporting a usage error naming the option. */
int
ctl_number_option(const char *name, const char *text, int64_t min, int64_t max, int64_t *value)
{
    struct outbox_error err;

    if (parse_integer(text, min, max, value, &err) < 0)
        return ctl_usage_error("%s: %s", name, err.message);
    return 0;
}

/* Ignores NOTICEs; the library turns off the ones it expects anyway. */
static void
ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* Connects to the database; returns 0 or an exit code, after the message. */
int
ctl_connect(struct ctl *ctl)
{
    static const char *const keywords[] = {"connect_timeout", "fallback_application_name",
                                           "client_encoding", "dbname", NULL};
    const char *values[] = {TIMEOUT_TEXT(TIMEOUT_DATABASE_CONNECT_SECONDS), "outboxctl", "UTF8",
                            ctl->database_url, NULL};
    struct outbox_error err;

    if (ctl->database_url == NULL || ctl->database_url[0] == '\0')
        return ctl_usage_error("missing database URL: give --database-url or set "
                               "OUTBOX_DATABASE_URL");
    if (url_check_database(ctl->database_url, &err) != 0)
        return ctl_usage_error("--database-url: %s", err.message);

    /* dbname last: what the URL says wins over the defaults before it */
    ctl->conn = PQconnectdbParams(keywords, values, 1);
    if (ctl->conn == NULL)
        return ctl_out_of_memory();
    if (PQstatus(ctl->conn) != CONNECTION_OK) {
        outbox_error_from_connect(&err, ctl->conn, ctl->database_url,
                                  "unable to connect to the database");
        return ctl_runtime_error(ctl, &err);
    }
    PQsetNoticeProcessor(ctl->conn, ignore_notice, NULL);
    /* an old schema named as such, not by the first column a command misses */
    if (strcmp(ctl->command, "migrate") != 0 && outbox_schema_check(ctl->conn, &err) != 0)
        return ctl_runtime_error(ctl, &err);
    return 0;
}

/* A usage error (exit 2) for a bad queue name or ordering key; 0 when both are fine. */
int
ctl_check_queue_and_key(const char *queue, const char *key)
{
    char message[NAMES_MESSAGE_MAX];

    return names_check(queue, key, message, sizeof(message)) ? 0 : ctl_usage_error("%s", message);
}

/* ---- batched subcommands ------------------------------------------------ */

/* Keeps the rows done so far, told by the store after each batch. */
static void
batch_done(void *arg, int64_t rows)
{
    struct ctl_batch *batch = arg;

    batch->rows = rows;
}

void
ctl_batch_init(struct ctl_batch *batch, const char *verb, const char *what)
{
    batch->progress.batch_done = batch_done;
    batch->progress.arg = batch;
    batch->rows = 0;
    batch->verb = verb;
    batch->what = what;
}

int
ctl_batch_error(const struct ctl *ctl, const struct ctl_batch *batch,
                const struct outbox_error *err)
{
    if (batch->rows > 0)
        fprintf(stderr, "outboxctl: %s %lld %s before the error\n", batch->verb,
                (long long)batch->rows, batch->what);
    return ctl_runtime_error(ctl, err);
}
