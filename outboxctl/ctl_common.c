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

static const char usage_text[] =
    "usage: outboxctl [--database-url URL] COMMAND [OPTIONS]\n"
    "       outboxctl --databases FILE COMMAND [OPTIONS]   (each database of a relay's list)\n"
    "\n"
    "commands:\n"
    "  migrate                          apply the schema migrations not yet applied\n"
    "  status [--json] [--retention DURATION]\n"
    "                                   jobs per queue and state, oldest ready age,\n"
    "                                   table size, vacuum and xmin horizon figures,\n"
    "                                   succeeded jobs past the relays' retention\n"
    "                                   (default $OUTBOX_RETENTION, else " OUTBOX_RETENTION_DEFAULT "),\n"
    "                                   ordering keys blocked by a dead, retrying or\n"
    "                                   stuck running head\n"
    "  dead list [--queue Q] [--limit N]\n"
    "                                   dead jobs with their last error (limit 100)\n"
    "  dead retry [--queue Q] [--job ID] [--extra-attempts N]\n"
    "                                   make dead jobs ready again with N more\n"
    "                                   attempts (default 1); all dead jobs when\n"
    "                                   neither --queue nor --job is given\n"
    "  purge --older-than DURATION      delete succeeded jobs finished longer ago\n"
    "                                   than DURATION (90s, 15m, 24h, 7d, 1h30m;\n"
    "                                   0: all of them), in batches of 5000\n"
    "  enqueue --queue Q (--payload JSON | --payload-file PATH) [--idempotency-key K]\n"
    "          [--exchange X] [--routing-key R]\n"
    "                                   add one job and print its id; a known key\n"
    "                                   prints the existing job's id; the payload\n"
    "                                   is read from PATH, or stdin for '-'; X and R\n"
    "                                   route it (default: the relay's --exchange, Q)\n"
    "                                   (--key is an old spelling of --idempotency-key)\n"
    "  pause QUEUE [--ordering-key KEY] [--reason TEXT]\n"
    "                                   relays stop claiming the queue (or only\n"
    "                                   that ordering key of it); producers go on\n"
    "  resume QUEUE [--ordering-key KEY]\n"
    "                                   undo a pause; paused keys of a resumed\n"
    "                                   queue stay paused\n"
    "  pause --database [--reason TEXT] / resume --database\n"
    "                                   relays of a list (outbox-relay --databases)\n"
    "                                   stop serving the whole database, or go on\n"
    "  paused                           list pauses: who, when and why\n"
    "  replay --queue Q (--since TIME [--until TIME] | --job ID [--job ID ...])\n"
    "         [--ordering-key KEY] [--dry-run]\n"
    "                                   publish succeeded jobs again, in their\n"
    "                                   order per key: those finished in the time\n"
    "                                   range (a timestamp, or a DURATION ago), or\n"
    "                                   the given ids; in batches of 1000\n"
    "                                   (in pause, resume and replay, --key is an old\n"
    "                                   spelling of --ordering-key)\n"
    "  inbox purge --older-than DURATION\n"
    "                                   delete inbox records accepted longer ago\n"
    "                                   than DURATION, in batches of 5000\n"
    "  identity show [--json]           the database's identity: message ids are\n"
    "                                   <database_id>:<message_uid>\n"
    "  identity set [--database-id ID] [--id-form uid|database|job]\n"
    "                                   give a copy of a database an id of its own,\n"
    "                                   or switch a database of an earlier release\n"
    "                                   to the form uid\n"
    "  serve [--listen HOST:PORT] [--auth-token-file FILE] [--allow-actions]\n"
    "                                   the operator's web console and its JSON API\n"
    "                                   (default " CONSOLE_DEFAULT_LISTEN "; read-only unless\n"
    "                                   --allow-actions; other than loopback only\n"
    "                                   with --auth-token-file); with --databases\n"
    "                                   FILE, one console over every database listed\n"
    "  stream enable QUEUE [--partitions N] [--lock-wait DURATION]\n"
    "                                   publish QUEUE as a stream: in commit order\n"
    "                                   per partition (1..256, default 1), no write\n"
    "                                   per row; a key stays in one partition\n"
    "  stream disable QUEUE [--lock-wait DURATION]\n"
    "                                   back to row-state claims: unpublished rows\n"
    "                                   become ready; both wait for open\n"
    "                                   transactions on outbox.job in short tries,\n"
    "                                   naming them, up to DURATION (default "
    TIMEOUT_TEXT(CTL_STREAM_LOCK_WAIT_DEFAULT_SECONDS) "s)\n"
    "  stream list                      stream partitions: lag (rows, seconds), owner\n"
    "\n"
    "options:\n"
    "  --database-url URL  libpq URI or conninfo (default: $OUTBOX_DATABASE_URL)\n"
    "  -h, --help          show this help\n"
    "  --version           print the version and exit\n"
    "\n"
    "exit status: 0 success, 1 runtime error, 2 usage error\n";

void
ctl_print_usage(void)
{
    fputs(usage_text, stdout);
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
        ctl_print_usage();
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
