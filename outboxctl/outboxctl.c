/*
 * outboxctl - the operators' command line for the outbox: migrate the
 * schema, show status, list and retry dead jobs, purge old succeeded jobs,
 * enqueue a job by hand, pause and resume queues, replay published jobs,
 * purge the consumers' inbox.
 *
 * Exit codes: 0 success, 1 runtime error (connection, database, missing
 * schema), 2 usage error, reported in one line naming the bad option. A
 * password from the database URL (or PGPASSWORD) never reaches the output:
 * every error message is scrubbed of it before printing.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "console.h"
#include "error.h"
#include "migrate.h"
#include "names.h"
#include "outbox.h"
#include "parse.h"
#include "redact.h"
#include "retention.h"
#include "store_admin.h"
#include "url_check.h"
#include "stream.h"

#define EXIT_USAGE 2

/* Defaults and bounds of the numeric options. */
#define DEAD_LIST_LIMIT_DEFAULT 100
#define DEAD_LIST_LIMIT_MAX 1000000
#define EXTRA_ATTEMPTS_MAX 1000000
#define PURGE_BATCH_SIZE 5000
#define REPLAY_BATCH_SIZE 1000
#define REPLAY_JOBS_MAX 100000
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

/* One run of the command line. */
struct ctl {
    const char *database_url;
    const char *command; /* e.g. "dead list", for messages */
    bool help;           /* --help seen: print usage, do nothing else */
    PGconn *conn;
};

/* Prints "outboxctl: <message>" as one line on stderr and returns EXIT_USAGE. */
static int usage_error(const char *format, ...) __attribute__((format(printf, 1, 2)));

static int
usage_error(const char *format, ...)
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
static int
runtime_error(const struct ctl *ctl, const struct outbox_error *err)
{
    char message[OUTBOX_ERROR_MESSAGE_MAX];

    url_redact_message(err->message, ctl->database_url, NULL, message, sizeof(message));
    fprintf(stderr, "outboxctl: %s\n", message);
    return 1;
}

static int
out_of_memory(void)
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
static int
take_value(const struct ctl *ctl, int argc, char **argv, int *index, const char *name,
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
        return usage_error("option '%s' of '%s' needs a value", name, ctl->command);
    *index += 1;
    *value = argv[*index];
    return 1;
}

/*
 * Options every command accepts: --database-url and --help. Returns 1 when
 * argv[*index] was one, 0 when not, EXIT_USAGE on a missing value.
 */
static int
common_option(struct ctl *ctl, int argc, char **argv, int *index)
{
    int taken;

    if (strcmp(argv[*index], "--help") == 0 || strcmp(argv[*index], "-h") == 0) {
        ctl->help = true;
        return 1;
    }
    taken = take_value(ctl, argc, argv, index, "--database-url", &ctl->database_url);
    return taken;
}

static int
unexpected_argument(const struct ctl *ctl, const char *arg)
{
    if (arg[0] == '-')
        return usage_error("unknown option '%s' for '%s'", arg, ctl->command);
    return usage_error("unexpected argument '%s' for '%s'", arg, ctl->command);
}

/* One option of a command: "--name VALUE" into *value, or a "--name" flag into *flag. */
struct command_option {
    const char *name;
    const char **value;
    bool *flag;
};

#define PARSE_GO_ON (-1)

/*
 * Reads argv[first..] as the common options plus the command's own. Returns
 * PARSE_GO_ON when the command should run, or the exit status to return
 * now: EXIT_USAGE after a usage message, 0 after printing --help.
 */
static int
parse_command_options(struct ctl *ctl, int argc, char **argv, int first,
                      const struct command_option *options, size_t count)
{
    for (int i = first; i < argc; i++) {
        int taken = common_option(ctl, argc, argv, &i);

        for (size_t o = 0; o < count && taken == 0; o++) {
            if (options[o].flag != NULL) {
                if (strcmp(argv[i], options[o].name) == 0) {
                    *options[o].flag = true;
                    taken = 1;
                }
            } else {
                taken = take_value(ctl, argc, argv, &i, options[o].name, options[o].value);
            }
        }
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
        if (taken == 0)
            return unexpected_argument(ctl, argv[i]);
    }
    if (ctl->help) {
        fputs(usage_text, stdout);
        return 0;
    }
    return PARSE_GO_ON;
}

/* Parses a numeric option value, reporting a usage error naming the option. */
static int
number_option(const char *name, const char *text, int64_t min, int64_t max, int64_t *value)
{
    struct outbox_error err;

    if (parse_integer(text, min, max, value, &err) < 0)
        return usage_error("%s: %s", name, err.message);
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
static int
connect_database(struct ctl *ctl)
{
    static const char *const keywords[] = {"connect_timeout", "fallback_application_name",
                                           "client_encoding", "dbname", NULL};
    const char *values[] = {CONNECT_TIMEOUT_SECONDS, "outboxctl", "UTF8", ctl->database_url, NULL};
    struct outbox_error err;

    if (ctl->database_url == NULL || ctl->database_url[0] == '\0')
        return usage_error("missing database URL: give --database-url or set "
                           "OUTBOX_DATABASE_URL");
    if (url_check_database(ctl->database_url, &err) != 0)
        return usage_error("--database-url: %s", err.message);

    /* dbname last: what the URL says wins over the defaults before it */
    ctl->conn = PQconnectdbParams(keywords, values, 1);
    if (ctl->conn == NULL)
        return out_of_memory();
    if (PQstatus(ctl->conn) != CONNECTION_OK) {
        outbox_error_from_connect(&err, ctl->conn, ctl->database_url,
                                  "unable to connect to the database");
        return runtime_error(ctl, &err);
    }
    PQsetNoticeProcessor(ctl->conn, ignore_notice, NULL);
    /* an old schema named as such, not by the first column a command misses */
    if (strcmp(ctl->command, "migrate") != 0 && outbox_schema_check(ctl->conn, &err) != 0)
        return runtime_error(ctl, &err);
    return 0;
}

/* ---- output helpers ---------------------------------------------------- */

/* Writes text as a JSON string: quoted, with " \ and control characters escaped. */
static void
json_string(FILE *out, const char *text)
{
    if (text == NULL) {
        fputs("null", out);
        return;
    }
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", out);
            break;
        case '\\':
            fputs("\\\\", out);
            break;
        case '\n':
            fputs("\\n", out);
            break;
        case '\r':
            fputs("\\r", out);
            break;
        case '\t':
            fputs("\\t", out);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

/* A grid of malloc'd cells, printed with columns padded to their widest cell. */
struct table {
    size_t columns;
    size_t rows;
    size_t capacity; /* rows */
    char **cells;
    const bool *right_aligned; /* per column */
};

/* Appends a row of printf-formatted cells, one format per column. */
static bool
table_add_row(struct table *table, ...)
{
    va_list ap;

    if (table->rows == table->capacity) {
        size_t capacity = table->capacity ? table->capacity * 2 : 16;
        char **cells = realloc(table->cells, capacity * table->columns * sizeof(*cells));

        if (cells == NULL)
            return false;
        table->cells = cells;
        table->capacity = capacity;
    }
    va_start(ap, table);
    for (size_t column = 0; column < table->columns; column++) {
        char **cell = &table->cells[table->rows * table->columns + column];
        const char *text = va_arg(ap, const char *);

        *cell = strdup(text != NULL ? text : "");
        if (*cell == NULL) {
            for (size_t done = 0; done < column; done++)
                free(table->cells[table->rows * table->columns + done]);
            va_end(ap);
            return false;
        }
    }
    va_end(ap);
    table->rows++;
    return true;
}

static void
table_print(const struct table *table, FILE *out)
{
    size_t widths[16] = {0};

    for (size_t i = 0; i < table->rows * table->columns; i++) {
        size_t len = strlen(table->cells[i]);

        if (len > widths[i % table->columns])
            widths[i % table->columns] = len;
    }
    for (size_t row = 0; row < table->rows; row++) {
        for (size_t column = 0; column < table->columns; column++) {
            const char *cell = table->cells[row * table->columns + column];
            bool last = column + 1 == table->columns;
            int width = (int)widths[column];

            if (table->right_aligned != NULL && table->right_aligned[column])
                fprintf(out, "%*s", width, cell);
            else if (last)
                fputs(cell, out);
            else
                fprintf(out, "%-*s", width, cell);
            fputs(last ? "\n" : "  ", out);
        }
    }
}

static void
table_clear(struct table *table)
{
    for (size_t i = 0; i < table->rows * table->columns; i++)
        free(table->cells[i]);
    free(table->cells);
    table->cells = NULL;
    table->rows = table->capacity = 0;
}

/* Formats a byte count as pg_size_pretty does, into buf. */
static const char *
format_bytes(char *buf, size_t size, int64_t bytes)
{
    static const char *const units[] = {"bytes", "kB", "MB", "GB", "TB"};
    double value = (double)bytes;
    size_t unit = 0;

    while (value >= 10240.0 && unit + 1 < sizeof(units) / sizeof(units[0])) {
        value /= 1024.0;
        unit++;
    }
    snprintf(buf, size, "%.0f %s", value, units[unit]);
    return buf;
}

/* Copies text into buf with control characters (e.g. newlines) as spaces. */
static const char *
one_line(char *buf, size_t size, const char *text)
{
    size_t n = 0;

    for (const char *p = text != NULL ? text : ""; *p != '\0' && n + 1 < size; p++)
        buf[n++] = (unsigned char)*p < 0x20 ? ' ' : *p;
    buf[n] = '\0';
    return buf;
}

/* ---- commands ---------------------------------------------------------- */

static int
command_migrate(struct ctl *ctl, int argc, char **argv, int first)
{
    struct outbox_error err;
    int applied = 0, version = 0, taken;

    if ((taken = parse_command_options(ctl, argc, argv, first, NULL, 0)) != PARSE_GO_ON)
        return taken;
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (outbox_migrate(ctl->conn, &applied, &err) < 0 ||
        outbox_schema_version(ctl->conn, &version, &err) < 0)
        return runtime_error(ctl, &err);
    if (applied == 0)
        printf("schema up to date at version %d\n", version);
    else
        printf("applied %d migration%s, schema version %d\n", applied, applied == 1 ? "" : "s",
               version);
    return 0;
}

/* Writes the pauses as a JSON array. */
static void
print_pauses_json(const struct store_pause_list *list)
{
    fputc('[', stdout);
    for (size_t i = 0; i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];

        fputs(i > 0 ? ",{\"queue\":" : "{\"queue\":", stdout);
        json_string(stdout, pause->queue);
        fputs(",\"ordering_key\":", stdout);
        json_string(stdout, pause->ordering_key);
        fputs(",\"reason\":", stdout);
        json_string(stdout, pause->reason);
        fputs(",\"paused_by\":", stdout);
        json_string(stdout, pause->paused_by);
        fputs(",\"paused_at\":", stdout);
        json_string(stdout, pause->paused_at);
        fputc('}', stdout);
    }
    fputc(']', stdout);
}

/* Adds the header and one row per pause to table (5 columns). */
static bool
pauses_table(struct table *table, const struct store_pause_list *list)
{
    bool ok = table_add_row(table, "QUEUE", "ORDERING KEY", "PAUSED AT", "BY", "REASON");

    for (size_t i = 0; ok && i < list->count; i++) {
        const struct store_pause *pause = &list->pauses[i];
        char key[256], reason[256];

        ok = table_add_row(table, pause->queue,
                           pause->ordering_key ? one_line(key, sizeof(key), pause->ordering_key)
                                               : "(whole queue)",
                           pause->paused_at, pause->paused_by,
                           pause->reason ? one_line(reason, sizeof(reason), pause->reason) : "-");
    }
    return ok;
}

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
        json_string(stdout, queue->queue);
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
            json_string(stdout, key->ordering_key);
            printf(",\"head_job_id\":%lld,\"head_state\":", (long long)key->head_job_id);
            json_string(stdout, key->head_state);
            printf(",\"attempts\":%d,\"max_attempts\":%d,\"retry_in_seconds\":", (int)key->attempts,
                   (int)key->max_attempts);
            if (key->retry_in_seconds < 0)
                fputs("null", stdout); /* never */
            else
                printf("%.3f", key->retry_in_seconds);
            printf(",\"waiting\":%lld,\"last_error\":", (long long)key->waiting);
            json_string(stdout, key->last_error);
            fputs("}", stdout);
        }
        fputs("]}", stdout);
    }
    fputs("],\"paused\":", stdout);
    print_pauses_json(&status->paused);
    printf(",\"table\":{\"table_bytes\":%lld,\"index_bytes\":%lld,\"live_tuples\":%lld,"
           "\"dead_tuples\":%lld,\"last_autovacuum\":",
           (long long)status->table_bytes, (long long)status->index_bytes,
           (long long)status->live_tuples, (long long)status->dead_tuples);
    json_string(stdout, status->last_autovacuum);
    fputs(",\"last_autoanalyze\":", stdout);
    json_string(stdout, status->last_autoanalyze);
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
        json_string(stdout, oldest->application_name);
        fputs(",\"state\":", stdout);
        json_string(stdout, oldest->state);
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
    struct table summary = {.columns = 2};
    static const bool blocked_numbers[] = {false, false, true, false, true, true, false};
    struct table queues = {.columns = 7, .right_aligned = numbers};
    struct table blocked = {.columns = 7, .right_aligned = blocked_numbers};
    struct table paused = {.columns = 5};
    char a[64], b[64], c[64], d[64], e[64], line[256];
    bool ok = true;

    snprintf(a, sizeof(a), "%d", status->schema_version);
    ok = ok && table_add_row(&summary, "schema version", a);
    snprintf(line, sizeof(line), "%s table, %s indexes",
             format_bytes(a, sizeof(a), status->table_bytes),
             format_bytes(b, sizeof(b), status->index_bytes));
    ok = ok && table_add_row(&summary, "outbox.job size", line);
    snprintf(line, sizeof(line), "%lld live, %lld dead (not yet vacuumed)",
             (long long)status->live_tuples, (long long)status->dead_tuples);
    ok = ok && table_add_row(&summary, "row versions", line);
    ok = ok && table_add_row(&summary, "last autovacuum",
                             status->last_autovacuum ? status->last_autovacuum : "never");
    ok = ok && table_add_row(&summary, "last autoanalyze",
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
    ok = ok && table_add_row(&summary, "succeeded rows", line);
    if (oldest->present)
        snprintf(line, sizeof(line), "pid %d (%s, %s), open %.1fs, xmin %lld transactions old",
                 oldest->pid,
                 oldest->application_name[0] ? oldest->application_name : "no application name",
                 oldest->state[0] ? oldest->state : "unknown state", oldest->age_seconds,
                 (long long)oldest->xid_age);
    else
        snprintf(line, sizeof(line), "none");
    ok = ok && table_add_row(&summary, "oldest transaction", line);

    ok = ok &&
         table_add_row(&queues, "QUEUE", "READY", "RUNNING", "SUCCEEDED", "DEAD", "OLDEST READY",
                       "BLOCKED KEYS");
    for (size_t i = 0; ok && i < status->queue_count; i++) {
        const struct store_queue_status *queue = &status->queues[i];

        snprintf(a, sizeof(a), "%lld", (long long)queue->ready);
        snprintf(b, sizeof(b), "%lld", (long long)queue->running);
        snprintf(c, sizeof(c), "%lld", (long long)queue->succeeded);
        snprintf(d, sizeof(d), "%lld", (long long)queue->dead);
        snprintf(e, sizeof(e), "%.1fs", queue->oldest_ready_seconds);
        snprintf(line, sizeof(line), "%lld", (long long)queue->blocked_keys);
        ok = table_add_row(&queues, queue->queue, a, b, c, d, e, line);
    }
    if (ok && status->blocked_count > 0) {
        ok = table_add_row(&blocked, "QUEUE", "ORDERING KEY", "HEAD JOB", "HEAD STATE",
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
            one_line(error, BLOCKED_ERROR_WIDTH + 1, key->last_error ? key->last_error : "-");
            if (key->last_error != NULL && strlen(key->last_error) > BLOCKED_ERROR_WIDTH)
                strcat(error, "...");
            ok = table_add_row(&blocked, key->queue, one_line(line, sizeof(line), key->ordering_key),
                               a, b, c, d, error);
        }
    }
    if (ok && status->paused.count > 0)
        ok = pauses_table(&paused, &status->paused);
    if (ok) {
        table_print(&summary, stdout);
        fputc('\n', stdout);
        if (status->queue_count == 0)
            fputs("no jobs\n", stdout);
        else
            table_print(&queues, stdout);
        if (status->blocked_count > 0) {
            printf("\nblocked ordering keys (head dead, retrying or stuck running;"
                   " oldest %d per queue):\n",
                   STORE_BLOCKED_KEYS_PER_QUEUE);
            table_print(&blocked, stdout);
        }
        if (status->paused.count > 0) {
            fputs("\npaused (relays claim nothing of these):\n", stdout);
            table_print(&paused, stdout);
        }
    }
    table_clear(&paused);
    table_clear(&summary);
    table_clear(&queues);
    table_clear(&blocked);
    return ok ? 0 : out_of_memory();
}

static int
command_status(struct ctl *ctl, int argc, char **argv, int first)
{
    struct store_status status;
    struct outbox_error err;
    bool json = false;
    const char *retention = getenv("OUTBOX_RETENTION");
    int64_t retention_seconds = 0;
    int taken, rc;

    const struct command_option options[] = {{"--json", NULL, &json},
                                             {"--retention", &retention, NULL}};

    if ((taken = parse_command_options(ctl, argc, argv, first, options, 2)) != PARSE_GO_ON)
        return taken;
    if (retention == NULL || retention[0] == '\0')
        retention = OUTBOX_RETENTION_DEFAULT;
    if (parse_duration(retention, &retention_seconds, &err) < 0)
        return usage_error("--retention: %s", err.message);
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_status(ctl->conn, (double)retention_seconds, &status, &err) < 0)
        return runtime_error(ctl, &err);
    rc = 0;
    if (json)
        print_status_json(&status);
    else
        rc = print_status_text(&status);
    store_status_clear(&status);
    return rc;
}

static int
command_dead_list(struct ctl *ctl, int argc, char **argv, int first)
{
    static const bool numbers[] = {true, false, true, false, false};
    const char *queue = NULL, *limit_text = NULL;
    int64_t limit = DEAD_LIST_LIMIT_DEFAULT;
    struct store_dead_list list;
    struct table table = {.columns = 5, .right_aligned = numbers};
    struct outbox_error err;
    bool ok;
    int taken;

    const struct command_option options[] = {{"--queue", &queue, NULL},
                                             {"--limit", &limit_text, NULL}};

    if ((taken = parse_command_options(ctl, argc, argv, first, options, 2)) != PARSE_GO_ON)
        return taken;
    if (limit_text != NULL &&
        number_option("--limit", limit_text, 1, DEAD_LIST_LIMIT_MAX, &limit) != 0)
        return EXIT_USAGE;
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_dead_list(ctl->conn, queue, limit, &list, &err) < 0)
        return runtime_error(ctl, &err);
    if (list.count == 0) {
        puts("no dead jobs");
        return 0;
    }
    ok = table_add_row(&table, "JOB_ID", "QUEUE", "ATTEMPTS", "FINISHED_AT", "LAST_ERROR");
    for (size_t i = 0; ok && i < list.count; i++) {
        const struct store_dead_job *job = &list.jobs[i];
        char id[24], attempts[32], error[1024];

        snprintf(id, sizeof(id), "%lld", (long long)job->job_id);
        snprintf(attempts, sizeof(attempts), "%d/%d", (int)job->attempts, (int)job->max_attempts);
        ok = table_add_row(&table, id, job->queue, attempts, job->finished_at,
                           job->last_error ? one_line(error, sizeof(error), job->last_error) : "-");
    }
    if (ok)
        table_print(&table, stdout);
    table_clear(&table);
    store_dead_list_clear(&list);
    return ok ? 0 : out_of_memory();
}

static int
command_dead_retry(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *job_text = NULL, *extra_text = NULL;
    int64_t job_id = 0, extra = 1, count = 0;
    struct outbox_error err;
    int taken;

    const struct command_option options[] = {{"--queue", &queue, NULL},
                                             {"--job", &job_text, NULL},
                                             {"--extra-attempts", &extra_text, NULL}};

    if ((taken = parse_command_options(ctl, argc, argv, first, options, 3)) != PARSE_GO_ON)
        return taken;
    if (job_text != NULL && number_option("--job", job_text, 1, INT64_MAX, &job_id) != 0)
        return EXIT_USAGE;
    if (extra_text != NULL &&
        number_option("--extra-attempts", extra_text, 1, EXTRA_ATTEMPTS_MAX, &extra) != 0)
        return EXIT_USAGE;
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_dead_retry(ctl->conn, queue, job_id, (int32_t)extra, &count, &err) < 0)
        return runtime_error(ctl, &err);
    printf("retried %lld dead job%s\n", (long long)count, count == 1 ? "" : "s");
    return 0;
}

static int
command_purge(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *older_than = NULL;
    int64_t seconds = 0, count = 0;
    struct outbox_error err;
    int taken;

    const struct command_option options[] = {{"--older-than", &older_than, NULL}};

    if ((taken = parse_command_options(ctl, argc, argv, first, options, 1)) != PARSE_GO_ON)
        return taken;
    if (older_than == NULL)
        return usage_error("'purge' needs --older-than DURATION");
    if (parse_duration(older_than, &seconds, &err) < 0)
        return usage_error("--older-than: %s", err.message);
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_purge(ctl->conn, seconds, PURGE_BATCH_SIZE, &count, &err) < 0) {
        if (count > 0)
            fprintf(stderr, "outboxctl: purged %lld succeeded jobs before the error\n",
                    (long long)count);
        return runtime_error(ctl, &err);
    }
    printf("purged %lld succeeded job%s finished more than %s ago\n", (long long)count,
           count == 1 ? "" : "s", older_than);
    return 0;
}

/* The largest payload file read: PostgreSQL's jsonb stops at 255 MiB. */
#define PAYLOAD_FILE_MAX ((size_t)256 * 1024 * 1024)

/*
 * Reads the payload from path ("-" for stdin) into *payload (malloc'd).
 * Returns 0, or an exit code after the message.
 */
static int
read_payload_file(const char *path, char **payload)
{
    bool from_stdin = strcmp(path, "-") == 0;
    FILE *file = from_stdin ? stdin : fopen(path, "rb");
    size_t len = 0, capacity = 64 * 1024;
    char *text;

    if (file == NULL)
        return usage_error("--payload-file: unable to read '%s': %s", path, strerror(errno));
    text = malloc(capacity + 1);
    while (text != NULL) {
        size_t got = fread(text + len, 1, capacity - len, file);

        len += got;
        if (len < capacity) {
            if (ferror(file)) {
                int saved_errno = errno;

                free(text);
                if (!from_stdin)
                    fclose(file);
                return usage_error("--payload-file: unable to read '%s': %s", path,
                                   strerror(saved_errno));
            }
            break; /* end of file */
        }
        if (capacity >= PAYLOAD_FILE_MAX) {
            free(text);
            if (!from_stdin)
                fclose(file);
            return usage_error("--payload-file: '%s' is larger than 256 MiB", path);
        }
        {
            char *bigger = realloc(text, capacity * 2 + 1);

            if (bigger == NULL) {
                free(text);
                text = NULL;
                break;
            }
            text = bigger;
            capacity *= 2;
        }
    }
    if (!from_stdin)
        fclose(file);
    if (text == NULL)
        return out_of_memory();
    text[len] = '\0';
    if (memchr(text, '\0', len) != NULL) {
        free(text);
        return usage_error("--payload-file: '%s' holds a NUL byte, not JSON text", path);
    }
    *payload = text;
    return 0;
}

/* A usage error (exit 2) for a bad queue name or ordering key; 0 when both are fine. */
static int
check_queue_and_key(const char *queue, const char *key)
{
    char message[NAMES_MESSAGE_MAX];

    return names_check(queue, key, message, sizeof(message)) ? 0 : usage_error("%s", message);
}

static int
command_enqueue(struct ctl *ctl, int argc, char **argv, int first)
{
    struct outbox_message message = {0};
    const char *payload_file = NULL;
    char *file_payload = NULL;
    int64_t job_id = 0;
    struct outbox_error err;
    int taken;

    const struct command_option options[] = {{"--queue", &message.queue, NULL},
                                             {"--payload", &message.payload_json, NULL},
                                             {"--payload-file", &payload_file, NULL},
                                             {"--idempotency-key", &message.idempotency_key, NULL},
                                             {"--key", &message.idempotency_key, NULL},
                                             {"--exchange", &message.exchange, NULL},
                                             {"--routing-key", &message.routing_key, NULL}};

    if ((taken = parse_command_options(ctl, argc, argv, first, options, 7)) != PARSE_GO_ON)
        return taken;
    if (message.queue == NULL)
        return usage_error("'enqueue' needs --queue Q");
    if ((taken = check_queue_and_key(message.queue, NULL)) != 0)
        return taken;
    if (message.payload_json != NULL && payload_file != NULL)
        return usage_error("'enqueue' takes --payload or --payload-file, not both");
    if (message.payload_json == NULL && payload_file == NULL)
        return usage_error("'enqueue' needs --payload JSON or --payload-file PATH");
    if (payload_file != NULL) {
        if ((taken = read_payload_file(payload_file, &file_payload)) != 0)
            return taken;
        message.payload_json = file_payload;
    }
    if ((taken = connect_database(ctl)) != 0)
        goto done;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_enqueue(ctl->conn, &message, &job_id, &err) < 0) {
        taken = runtime_error(ctl, &err);
        goto done;
    }
    printf("%lld\n", (long long)job_id);
    taken = 0;
done:
    free(file_payload);
    return taken;
}

/*
 * Takes argv[*first] as the command's positional QUEUE argument when it is
 * not an option. Returns 0 with *queue set, or EXIT_USAGE.
 */
static int
queue_argument(const struct ctl *ctl, int argc, char **argv, int *first, const char **queue)
{
    if (*first < argc && argv[*first][0] != '-') {
        *queue = argv[*first];
        *first += 1;
        return 0;
    }
    for (int i = *first; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 0; /* --help prints the usage, wanted or not */
    return usage_error("'%s' needs a QUEUE", ctl->command);
}

static int
command_pause(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *key = NULL, *reason = NULL;
    char key_text[256];
    struct outbox_error err;
    bool changed = false;
    int taken;

    const struct command_option options[] = {{"--ordering-key", &key, NULL},
                                             {"--key", &key, NULL},
                                             {"--reason", &reason, NULL}};

    if ((taken = queue_argument(ctl, argc, argv, &first, &queue)) != 0)
        return taken;
    if ((taken = parse_command_options(ctl, argc, argv, first, options, 3)) != PARSE_GO_ON)
        return taken;
    if ((taken = check_queue_and_key(queue, key)) != 0)
        return taken;
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_pause(ctl->conn, queue, key, reason, &changed, &err) < 0)
        return runtime_error(ctl, &err);
    if (key != NULL)
        printf("%s ordering key '%s' of queue '%s'\n", changed ? "paused" : "already paused:",
               one_line(key_text, sizeof(key_text), key), queue);
    else
        printf("%s queue '%s'\n", changed ? "paused" : "already paused:", queue);
    return 0;
}

static int
command_resume(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *key = NULL;
    char key_text[256];
    struct outbox_error err;
    bool changed = false;
    int64_t keys = 0;
    int taken;

    const struct command_option options[] = {{"--ordering-key", &key, NULL},
                                             {"--key", &key, NULL}};

    if ((taken = queue_argument(ctl, argc, argv, &first, &queue)) != 0)
        return taken;
    if ((taken = parse_command_options(ctl, argc, argv, first, options, 2)) != PARSE_GO_ON)
        return taken;
    if ((taken = check_queue_and_key(queue, key)) != 0)
        return taken;
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_resume(ctl->conn, queue, key, &changed, &keys, &err) < 0)
        return runtime_error(ctl, &err);
    if (key != NULL)
        printf("%s ordering key '%s' of queue '%s'\n", changed ? "resumed" : "was not paused:",
               one_line(key_text, sizeof(key_text), key), queue);
    else
        printf("%s queue '%s'\n", changed ? "resumed" : "was not paused:", queue);
    if (key == NULL && keys > 0)
        printf("%lld ordering key%s of queue '%s' stay%s paused"
               " (resume them with --ordering-key)\n",
               (long long)keys, keys == 1 ? "" : "s", queue, keys == 1 ? "s" : "");
    return 0;
}

static int
command_paused(struct ctl *ctl, int argc, char **argv, int first)
{
    struct store_pause_list list;
    struct table table = {.columns = 5};
    struct outbox_error err;
    bool ok;
    int taken;

    if ((taken = parse_command_options(ctl, argc, argv, first, NULL, 0)) != PARSE_GO_ON)
        return taken;
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_paused(ctl->conn, &list, &err) < 0)
        return runtime_error(ctl, &err);
    if (list.count == 0) {
        puts("nothing is paused");
        return 0;
    }
    ok = pauses_table(&table, &list);
    if (ok)
        table_print(&table, stdout);
    table_clear(&table);
    store_pause_list_clear(&list);
    return ok ? 0 : out_of_memory();
}

/*
 * The value of --since or --until: a timestamp PostgreSQL reads, or a
 * DURATION meaning that long ago. Durations become "now - N seconds" texts
 * in buf. Returns 0, or an exit code after the message.
 */
static int
replay_time(struct ctl *ctl, const char *name, const char *text, char *buf, size_t size,
            const char **out)
{
    struct outbox_error err;
    int64_t seconds;

    if (parse_duration(text, &seconds, &err) == 0) {
        if (store_admin_time_ago(ctl->conn, seconds, buf, size, &err) < 0)
            return runtime_error(ctl, &err);
        *out = buf;
        return 0;
    }
    if (store_admin_check_time(ctl->conn, text, &err) < 0) {
        if (err.code == OUTBOX_ERR_INVALID)
            return usage_error("%s: '%.60s' is neither a timestamp nor a duration", name, text);
        return runtime_error(ctl, &err);
    }
    *out = text;
    return 0;
}

static int
command_replay(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *queue = NULL, *since = NULL, *until = NULL, *key = NULL;
    char since_buf[64], until_buf[64];
    struct store_replay_request request = {.batch_size = REPLAY_BATCH_SIZE};
    struct store_replay_result result;
    struct outbox_error err;
    int64_t *ids = NULL;
    size_t id_count = 0;
    int taken, rc;

    const struct command_option options[] = {{"--queue", &queue, NULL},
                                             {"--since", &since, NULL},
                                             {"--until", &until, NULL},
                                             {"--ordering-key", &key, NULL},
                                             {"--key", &key, NULL},
                                             {"--dry-run", NULL, &request.dry_run}};

    /* --job repeats, so replay reads its options itself; the rest as everywhere */
    ids = calloc((size_t)argc, sizeof(*ids));
    if (ids == NULL)
        return out_of_memory();
    taken = 0;
    for (int i = first; i < argc && taken != EXIT_USAGE; i++) {
        const char *job = NULL;
        int64_t id;

        taken = common_option(ctl, argc, argv, &i);
        if (taken == 0 && (taken = take_value(ctl, argc, argv, &i, "--job", &job)) == 1) {
            if (number_option("--job", job, 1, INT64_MAX, &id) != 0)
                taken = EXIT_USAGE;
            else if (id_count == REPLAY_JOBS_MAX)
                taken = usage_error("at most %d --job ids at a time", REPLAY_JOBS_MAX);
            else
                ids[id_count++] = id;
        }
        for (size_t o = 0; o < sizeof(options) / sizeof(options[0]) && taken == 0; o++) {
            if (options[o].flag != NULL && strcmp(argv[i], options[o].name) == 0) {
                *options[o].flag = true;
                taken = 1;
            } else if (options[o].flag == NULL) {
                taken = take_value(ctl, argc, argv, &i, options[o].name, options[o].value);
            }
        }
        if (taken == 0)
            taken = unexpected_argument(ctl, argv[i]);
    }
    if (taken == EXIT_USAGE || ctl->help) {
        free(ids);
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
        fputs(usage_text, stdout);
        return 0;
    }
    rc = 0;
    if (queue == NULL)
        rc = usage_error("'replay' needs --queue Q");
    else if (id_count == 0 && since == NULL)
        rc = usage_error("'replay' needs --since TIME or --job ID");
    else if (id_count > 0 && (since != NULL || until != NULL))
        rc = usage_error("'replay' takes either --since/--until or --job, not both");
    else
        rc = check_queue_and_key(queue, key);
    if (rc != 0) {
        free(ids);
        return rc;
    }
    if ((taken = connect_database(ctl)) != 0 ||
        (since != NULL &&
         (taken = replay_time(ctl, "--since", since, since_buf, sizeof(since_buf), &since)) != 0) ||
        (until != NULL &&
         (taken = replay_time(ctl, "--until", until, until_buf, sizeof(until_buf), &until)) != 0)) {
        free(ids);
        return taken;
    }
    request.queue = queue;
    request.since = since;
    request.until = until;
    request.job_ids = ids;
    request.job_count = id_count;
    request.ordering_key = key;
    rc = store_admin_check_schema(ctl->conn, &err) < 0 ||
         store_admin_replay(ctl->conn, &request, &result, &err) < 0;
    free(ids);
    if (rc != 0) {
        if (result.replayed > 0)
            fprintf(stderr, "outboxctl: replayed %lld jobs before the error\n",
                    (long long)result.replayed);
        return runtime_error(ctl, &err);
    }
    printf("%s %lld succeeded job%s of queue '%s'\n",
           request.dry_run ? "would replay" : "replayed", (long long)result.replayed,
           result.replayed == 1 ? "" : "s", queue);
    if (result.ready + result.running + result.dead > 0)
        printf("refused %lld job%s not in state succeeded: %lld ready, %lld running, %lld dead\n",
               (long long)(result.ready + result.running + result.dead),
               result.ready + result.running + result.dead == 1 ? "" : "s",
               (long long)result.ready, (long long)result.running, (long long)result.dead);
    if (result.missing > 0)
        printf("not found in queue '%s'%s: %lld job id%s\n", queue,
               key != NULL ? " with that ordering key" : "", (long long)result.missing,
               result.missing == 1 ? "" : "s");
    return 0;
}

static int
command_inbox_purge(struct ctl *ctl, int argc, char **argv, int first)
{
    const char *older_than = NULL;
    int64_t seconds = 0, count = 0;
    struct outbox_error err;
    int taken;

    const struct command_option options[] = {{"--older-than", &older_than, NULL}};

    if ((taken = parse_command_options(ctl, argc, argv, first, options, 1)) != PARSE_GO_ON)
        return taken;
    if (older_than == NULL)
        return usage_error("'inbox purge' needs --older-than DURATION");
    if (parse_duration(older_than, &seconds, &err) < 0)
        return usage_error("--older-than: %s", err.message);
    if ((taken = connect_database(ctl)) != 0)
        return taken;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_inbox_purge(ctl->conn, seconds, PURGE_BATCH_SIZE, &count, &err) < 0) {
        if (count > 0)
            fprintf(stderr, "outboxctl: purged %lld inbox records before the error\n",
                    (long long)count);
        return runtime_error(ctl, &err);
    }
    printf("purged %lld inbox record%s accepted more than %s ago\n", (long long)count,
           count == 1 ? "" : "s", older_than);
    return 0;
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
        if ((taken = common_option(ctl, argc, argv, &i)) == 0)
            return usage_error("unknown option '%s'", argv[i]);
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
    }
    if (i >= argc) {
        if (ctl->help) {
            fputs(usage_text, stdout);
            return 0;
        }
        return usage_error("missing command");
    }
    ctl->command = argv[i];
    if (strcmp(argv[i], "migrate") == 0)
        return command_migrate(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "status") == 0)
        return command_status(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "purge") == 0)
        return command_purge(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "enqueue") == 0)
        return command_enqueue(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "pause") == 0)
        return command_pause(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "resume") == 0)
        return command_resume(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "paused") == 0)
        return command_paused(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "replay") == 0)
        return command_replay(ctl, argc, argv, i + 1);
    if (strcmp(argv[i], "serve") == 0)
        return console_serve(ctl->database_url, argc - i - 1, argv + i + 1);
    if (strcmp(argv[i], "stream") == 0)
        return outboxctl_stream(ctl->database_url, argc, argv, i + 1);
    if (strcmp(argv[i], "inbox") == 0) {
        if (i + 1 < argc && strcmp(argv[i + 1], "purge") == 0) {
            ctl->command = "inbox purge";
            return command_inbox_purge(ctl, argc, argv, i + 2);
        }
        if (i + 1 < argc &&
            (strcmp(argv[i + 1], "--help") == 0 || strcmp(argv[i + 1], "-h") == 0)) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (i + 1 >= argc)
            return usage_error("'inbox' needs a subcommand: purge");
        return usage_error("unknown subcommand '%s' for 'inbox': use purge", argv[i + 1]);
    }
    if (strcmp(argv[i], "dead") == 0) {
        if (i + 1 < argc && strcmp(argv[i + 1], "list") == 0) {
            ctl->command = "dead list";
            return command_dead_list(ctl, argc, argv, i + 2);
        }
        if (i + 1 < argc && strcmp(argv[i + 1], "retry") == 0) {
            ctl->command = "dead retry";
            return command_dead_retry(ctl, argc, argv, i + 2);
        }
        if (i + 1 < argc &&
            (strcmp(argv[i + 1], "--help") == 0 || strcmp(argv[i + 1], "-h") == 0)) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (i + 1 >= argc)
            return usage_error("'dead' needs a subcommand: list or retry");
        return usage_error("unknown subcommand '%s' for 'dead': use list or retry", argv[i + 1]);
    }
    return usage_error("unknown command '%s'", argv[i]);
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
