/*
 * outboxctl - the operators' command line for the outbox: migrate the
 * schema, show status, list and retry dead jobs, purge old succeeded jobs,
 * enqueue a job by hand, pause and resume queues, replay published jobs,
 * purge the consumers' inbox, serve the web console. This file holds main,
 * the --help text, the options and errors every subcommand shares, and the
 * dispatch table; each subcommand lives in a ctl_<job>.c file (see ctl.h).
 * A new subcommand is one row in command_table and one line in the help.
 *
 * Exit codes: 0 success, 1 runtime error (connection, database, missing
 * schema), 2 usage error, reported in one line naming the bad option. A
 * password from the database URL (or PGPASSWORD) never reaches the output:
 * every error message is scrubbed of it before printing.
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
#include "url_check.h"
#include "stream.h"

#define CONNECT_TIMEOUT_SECONDS "10"

#ifndef OUTBOX_VERSION
#define OUTBOX_VERSION "unknown"
#endif

static const char usage_text[] =
    "usage: outboxctl [--database-url URL] COMMAND [OPTIONS]\n"
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
    "  serve [--listen HOST:PORT] [--auth-token-file FILE] [--allow-actions]\n"
    "                                   the operator's web console and its JSON API\n"
    "                                   (default " CONSOLE_DEFAULT_LISTEN "; read-only unless\n"
    "                                   --allow-actions; other than loopback only\n"
    "                                   with --auth-token-file)\n"
    "  stream enable QUEUE [--partitions N]\n"
    "                                   publish QUEUE as a stream: in commit order\n"
    "                                   per partition (1..256, default 1), no write\n"
    "                                   per row; a key stays in one partition\n"
    "  stream disable QUEUE             back to row-state claims: unpublished rows\n"
    "                                   become ready\n"
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
    const char *values[] = {CONNECT_TIMEOUT_SECONDS, "outboxctl", "UTF8", ctl->database_url, NULL};
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

/* ---- dispatch ---------------------------------------------------------- */

int
ctl_command_serve(struct ctl *ctl, int argc, char **argv, int first)
{
    return console_serve(ctl->database_url, argc - first, argv + first);
}

/* stream enable|disable|list: stream.c reads its own subcommand. */
static int
ctl_command_stream(struct ctl *ctl, int argc, char **argv, int first)
{
    return outboxctl_stream(ctl->database_url, argc, argv, first);
}

/*
 * Every subcommand, one row each: a name of one word ("status"), or of a
 * group word and a subcommand word ("dead list"); the rows of one group are
 * listed together, in the order the group's messages name them.
 */
static const struct ctl_command_row {
    const char *name;
    ctl_command_fn *run;
} command_table[] = {
    /* clang-format off */
    {"migrate", ctl_command_migrate},
    {"status", ctl_command_status},
    {"purge", ctl_command_purge},
    {"enqueue", ctl_command_enqueue},
    {"pause", ctl_command_pause},
    {"resume", ctl_command_resume},
    {"paused", ctl_command_paused},
    {"replay", ctl_command_replay},
    {"serve", ctl_command_serve},
    {"stream", ctl_command_stream},
    {"inbox purge", ctl_command_inbox_purge},
    {"dead list", ctl_command_dead_list},
    {"dead retry", ctl_command_dead_retry},
    /* clang-format on */
};

#define COMMAND_COUNT (sizeof(command_table) / sizeof(command_table[0]))

/* The length of the group word of name, or 0 for a one-word name. */
static size_t
group_length(const char *name)
{
    const char *space = strchr(name, ' ');

    return space != NULL ? (size_t)(space - name) : 0;
}

/* True when row is a subcommand of the group word. */
static bool
in_group(const struct ctl_command_row *row, const char *word)
{
    size_t len = group_length(row->name);

    return len > 0 && strlen(word) == len && strncmp(row->name, word, len) == 0;
}

/* Writes the subcommands of group into buf as "a", "a or b", "a, b or c". */
static const char *
group_choices(const char *group, char *buf, size_t size)
{
    size_t total = 0, seen = 0, used = 0;

    for (size_t r = 0; r < COMMAND_COUNT; r++)
        total += in_group(&command_table[r], group);
    buf[0] = '\0';
    for (size_t r = 0; r < COMMAND_COUNT && used < size; r++) {
        const struct ctl_command_row *row = &command_table[r];
        const char *separator;

        if (!in_group(row, group))
            continue;
        seen++;
        separator = seen == 1 ? "" : seen == total ? " or " : ", ";
        used += (size_t)snprintf(buf + used, size - used, "%s%s", separator,
                                 row->name + group_length(row->name) + 1);
    }
    return buf;
}

/* Runs the subcommand of group named by argv[i + 1]; returns the exit code. */
static int
run_group(struct ctl *ctl, int argc, char **argv, int i)
{
    const char *group = argv[i];
    char choices[256];

    for (size_t r = 0; r < COMMAND_COUNT && i + 1 < argc; r++) {
        const struct ctl_command_row *row = &command_table[r];

        if (in_group(row, group) && strcmp(row->name + strlen(group) + 1, argv[i + 1]) == 0) {
            ctl->command = row->name;
            return row->run(ctl, argc, argv, i + 2);
        }
    }
    if (i + 1 < argc && (strcmp(argv[i + 1], "--help") == 0 || strcmp(argv[i + 1], "-h") == 0)) {
        ctl_print_usage();
        return 0;
    }
    group_choices(group, choices, sizeof(choices));
    if (i + 1 >= argc)
        return ctl_usage_error("'%s' needs a subcommand: %s", group, choices);
    return ctl_usage_error("unknown subcommand '%s' for '%s': use %s", argv[i + 1], group, choices);
}

/* Runs the command argv[i] names; returns the exit code. */
static int
dispatch(struct ctl *ctl, int argc, char **argv, int i)
{
    ctl->command = argv[i];
    for (size_t r = 0; r < COMMAND_COUNT; r++) {
        const struct ctl_command_row *row = &command_table[r];

        if (in_group(row, argv[i]))
            return run_group(ctl, argc, argv, i);
        if (strcmp(row->name, argv[i]) == 0)
            return row->run(ctl, argc, argv, i + 1);
    }
    return ctl_usage_error("unknown command '%s'", argv[i]);
}

/* Parses options before the command, then runs it; returns the exit code. */
static int
run(struct ctl *ctl, int argc, char **argv)
{
    int i, taken;

    ctl->command = "outboxctl";
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("outboxctl %s\n", OUTBOX_VERSION);
        return 0;
    }
    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        if ((taken = ctl_common_option(ctl, argc, argv, &i)) == 0)
            return ctl_usage_error("unknown option '%s'", argv[i]);
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
    }
    if (i >= argc) {
        if (ctl->help) {
            ctl_print_usage();
            return 0;
        }
        return ctl_usage_error("missing command");
    }
    return dispatch(ctl, argc, argv, i);
}

int
main(int argc, char **argv)
{
    struct ctl ctl = {.database_url = getenv("OUTBOX_DATABASE_URL")};
    int rc = run(&ctl, argc, argv);

    PQfinish(ctl.conn);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fputs("outboxctl: unable to write the output\n", stderr);
        if (rc == 0)
            rc = 1;
    }
    return rc;
}
