/*
 * What the files of outboxctl share: one run of the command line (struct
 * ctl), the option parsing every subcommand uses, the error reporting that
 * fixes the exit codes, the output helpers (JSON strings, padded tables)
 * and one entry point per subcommand, ctl_command_<name>(), which
 * outboxctl.c's dispatch table names.
 *
 * Rules: a subcommand parses its options with ctl_parse_options() (so
 * --help and --database-url work everywhere), reports usage errors through
 * ctl_usage_error() (exit 2, one line) and runtime errors through
 * ctl_runtime_error() (exit 1, password scrubbed), and returns the exit
 * status; only main() flushes and exits.
 */
#ifndef OUTBOXCTL_CTL_H
#define OUTBOXCTL_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <libpq-fe.h>

#include "error.h"
#include "exit_status.h"
#include "store_admin.h"
#include "store_dead.h"

/* What ctl_parse_options() returns when the subcommand should run. */
#define CTL_GO_ON (-1)

/* Rows per transaction of the batched deletes (purge, inbox purge). */
#define PURGE_BATCH_SIZE 5000

/* One run of the command line. */
struct ctl {
    const char *database_url;
    const char *databases_file; /* --databases FILE: the command runs on each database listed */
    const char *command; /* e.g. "dead list", for messages */
    bool help;           /* --help seen: print usage, do nothing else */
    /* writes the help from the action table; set by main, which stands above the table */
    void (*print_usage)(FILE *out);
    PGconn *conn;
};

/* A subcommand: runs argv[first..] as its options; returns the exit status. */
typedef int ctl_command_fn(struct ctl *ctl, int argc, char **argv, int first);

/* One option of a command: "--name VALUE" into *value, or a "--name" flag into *flag. */
struct ctl_option {
    const char *name;
    const char **value;
    bool *flag;
};

/*
 * --databases: runs dispatch(ctl, argc, argv, i) on each database of
 * ctl->databases_file in turn, under "== database NAME", then a totals
 * line; the worst exit status (ctl_databases.c).
 */
int ctl_run_over_databases(struct ctl *ctl, int argc, char **argv, int i,
                           ctl_command_fn *dispatch);

/* What a pause command does to its queue, key or database. */
enum ctl_flow { CTL_PAUSE, CTL_RESUME };

/*
 * pause --database / resume --database (argv[first..] the options after
 * --database): the whole database for relays of a list
 * (ctl_database_pause.c).
 */
int ctl_command_database_pause(struct ctl *ctl, int argc, char **argv, int first,
                               enum ctl_flow flow);

/* ---- errors (outboxctl.c) ---- */

/* Prints "outboxctl: <message>" as one line on stderr and returns EXIT_USAGE. */
int ctl_usage_error(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* Prints a runtime error, scrubbed of passwords, and returns 1. */
int ctl_runtime_error(const struct ctl *ctl, const struct outbox_error *err);

/* Prints "out of memory" and returns 1. */
int ctl_out_of_memory(void);

/* Prints the --help text on stdout (ctl->print_usage: the action table's, actions.c). */
void ctl_print_usage(const struct ctl *ctl);

/* ---- options (outboxctl.c) ---- */

/*
 * When argv[*index] is option name, as "NAME VALUE" or "NAME=VALUE", stores
 * the value, moves *index to the last argument used and returns 1. Returns 0
 * for any other argument, and EXIT_USAGE (after the message) when the value
 * is missing.
 */
int ctl_take_value(const struct ctl *ctl, int argc, char **argv, int *index, const char *name,
                   const char **value);

/*
 * Options every command accepts: --database-url and --help. Returns 1 when
 * argv[*index] was one, 0 when not, EXIT_USAGE on a missing value.
 */
int ctl_common_option(struct ctl *ctl, int argc, char **argv, int *index);

/* The usage error for an argument no option took: EXIT_USAGE. */
int ctl_unexpected_argument(const struct ctl *ctl, const char *arg);

/*
 * Reads argv[first..] as the common options plus the command's own. Returns
 * CTL_GO_ON when the command should run, or the exit status to return
 * now: EXIT_USAGE after a usage message, 0 after printing --help.
 */
int ctl_parse_options(struct ctl *ctl, int argc, char **argv, int first,
                      const struct ctl_option *options, size_t count);

/* Parses a numeric option value, reporting a usage error naming the option. */
int ctl_number_option(const char *name, const char *text, int64_t min, int64_t max, int64_t *value);

/* A usage error (exit 2) for a bad queue name or ordering key; 0 when both are fine. */
int ctl_check_queue_and_key(const char *queue, const char *key);

/*
 * Connects ctl->conn to ctl->database_url and, except for migrate, checks
 * the schema version; returns 0 or an exit code, after the message.
 */
int ctl_connect(struct ctl *ctl);

/* ---- batched subcommands (outboxctl.c): purge, inbox purge, replay ---- */

/* The rows a batched subcommand has done, kept up to date by the store's progress calls. */
struct ctl_batch {
    struct store_progress progress; /* hand &progress to the store */
    int64_t rows;
    const char *verb; /* "purged" */
    const char *what; /* "succeeded jobs" */
};

void ctl_batch_init(struct ctl_batch *batch, const char *verb, const char *what);

/*
 * Reports a runtime error that stopped a batched subcommand, after the line
 * "outboxctl: <verb> <rows> <what> before the error" when rows were done;
 * returns 1.
 */
int ctl_batch_error(const struct ctl *ctl, const struct ctl_batch *batch,
                    const struct outbox_error *err);

/* ---- output (ctl_output.c) ---- */

/* Writes text as a JSON string: quoted, with " \ and control characters escaped. */
void ctl_json_string(FILE *out, const char *text);

/* A grid of malloc'd cells, printed with columns padded to their widest cell. */
struct ctl_table {
    size_t columns; /* at most 16 */
    size_t rows;
    size_t capacity; /* rows */
    char **cells;
    const bool *right_aligned; /* per column */
};

/* Appends a row of cells, one const char * per column (NULL: empty); false when out of memory. */
bool ctl_table_add_row(struct ctl_table *table, ...);
void ctl_table_print(const struct ctl_table *table, FILE *out);
void ctl_table_clear(struct ctl_table *table);

/* Formats a byte count as pg_size_pretty does, into buf. */
const char *ctl_format_bytes(char *buf, size_t size, int64_t bytes);

/* Copies text into buf with control characters (e.g. newlines) as spaces. */
const char *ctl_one_line(char *buf, size_t size, const char *text);

/* ---- pauses (ctl_flow.c), also shown by status ---- */

/* Writes the pauses as a JSON array. */
void ctl_print_pauses_json(const struct store_pause_list *list);

/* Adds the header and one row per pause to table (5 columns). */
bool ctl_pauses_table(struct ctl_table *table, const struct store_pause_list *list);

/* ---- the subcommands, one file each by job ---- */

ctl_command_fn ctl_command_migrate;     /* ctl_migrate.c */
ctl_command_fn ctl_command_status;      /* ctl_status.c */
ctl_command_fn ctl_command_dead_list;   /* ctl_dead.c */
ctl_command_fn ctl_command_dead_retry;  /* ctl_dead.c */
ctl_command_fn ctl_command_purge;       /* ctl_purge.c */
ctl_command_fn ctl_command_enqueue;     /* ctl_enqueue.c */
ctl_command_fn ctl_command_pause;       /* ctl_flow.c */
ctl_command_fn ctl_command_resume;      /* ctl_flow.c */
ctl_command_fn ctl_command_paused;      /* ctl_flow.c */
ctl_command_fn ctl_command_replay;      /* ctl_replay.c */
ctl_command_fn ctl_command_inbox_purge; /* ctl_purge.c */
ctl_command_fn ctl_command_serve;       /* outboxctl.c: the console */
ctl_command_fn ctl_command_identity_show; /* ctl_identity.c */
ctl_command_fn ctl_command_identity_set;  /* ctl_identity.c */

/* The identity as status says it: one line of text, or a JSON value (null when none). */
void ctl_identity_text(char *line, size_t size, const struct store_identity_row *identity);
void ctl_identity_json(FILE *out, const struct store_identity_row *identity);

#endif
