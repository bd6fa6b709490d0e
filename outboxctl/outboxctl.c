/*
 * outboxctl - the operators' command line for the outbox: migrate the
 * schema, show status, list and retry dead jobs, purge old succeeded jobs,
 * enqueue a job by hand, pause and resume queues, replay published jobs,
 * purge the consumers' inbox, serve the web console. This file holds main
 * and the dispatch from the action table (actions.c); each subcommand lives
 * in a ctl_<topic>.c file, and what they all share (help, options, errors,
 * connecting) in ctl_common.c. A new subcommand is one row in the action
 * table and one line in the help.
 *
 * Exit codes: 0 success, 1 runtime error (connection, database, missing
 * schema), 2 usage error, reported in one line naming the bad option. A
 * password from the database URL (or PGPASSWORD) never reaches the output:
 * every error message is scrubbed of it before printing.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "actions.h"
#include "console.h"
#include "ctl.h"
#include "error.h"


#ifndef OUTBOX_VERSION
#define OUTBOX_VERSION "unknown"
#endif

/* ---- dispatch ---------------------------------------------------------- */

int
ctl_command_serve(struct ctl *ctl, int argc, char **argv, int first)
{
    return console_serve(ctl->database_url, ctl->databases_file, argc - first, argv + first);
}

/* The length of the group word of name, or 0 for a one-word name. */
static size_t
group_length(const char *name)
{
    const char *space = strchr(name, ' ');

    return space != NULL ? (size_t)(space - name) : 0;
}

/* True when row is a command-line subcommand of the group word. */
static bool
in_group(const struct action *row, const char *word)
{
    size_t len = row->verb != NULL ? group_length(row->verb) : 0;

    return len > 0 && strlen(word) == len && strncmp(row->verb, word, len) == 0;
}

/* Writes the subcommands of group into buf as "a", "a or b", "a, b or c". */
static const char *
group_choices(const char *group, char *buf, size_t size)
{
    size_t total = 0, seen = 0, used = 0;

    for (size_t r = 0; r < action_count; r++)
        total += in_group(&action_table[r], group);
    buf[0] = '\0';
    for (size_t r = 0; r < action_count && used < size; r++) {
        const struct action *row = &action_table[r];
        const char *separator;

        if (!in_group(row, group))
            continue;
        seen++;
        separator = seen == 1 ? "" : seen == total ? " or " : ", ";
        used += (size_t)snprintf(buf + used, size - used, "%s%s", separator,
                                 row->verb + group_length(row->verb) + 1);
    }
    return buf;
}

/* Runs the subcommand of group named by argv[i + 1]; returns the exit code. */
static int
run_group(struct ctl *ctl, int argc, char **argv, int i)
{
    const char *group = argv[i];
    char choices[256];

    for (size_t r = 0; r < action_count && i + 1 < argc; r++) {
        const struct action *row = &action_table[r];

        if (in_group(row, group) && strcmp(row->verb + strlen(group) + 1, argv[i + 1]) == 0) {
            ctl->command = row->verb;
            return row->run(ctl, argc, argv, i + 2);
        }
    }
    if (i + 1 < argc && (strcmp(argv[i + 1], "--help") == 0 || strcmp(argv[i + 1], "-h") == 0)) {
        ctl_print_usage(ctl);
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
    for (size_t r = 0; r < action_count; r++) {
        const struct action *row = &action_table[r];

        if (in_group(row, argv[i]))
            return run_group(ctl, argc, argv, i);
        if (row->verb != NULL && strcmp(row->verb, argv[i]) == 0)
            return row->run(ctl, argc, argv, i + 1);
    }
    return ctl_usage_error("unknown command '%s'", argv[i]);
}

/* Parses options before the command, then runs it; returns the exit code. */
static int
run_command_line(struct ctl *ctl, int argc, char **argv)
{
    int i, taken;

    ctl->command = "outboxctl";
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("outboxctl %s\n", OUTBOX_VERSION);
        return 0;
    }
    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        if ((taken = ctl_take_value(ctl, argc, argv, &i, "--databases", &ctl->databases_file)) ==
            0)
            taken = ctl_common_option(ctl, argc, argv, &i);
        if (taken == 0)
            return ctl_usage_error("unknown option '%s'", argv[i]);
        if (taken == EXIT_USAGE)
            return EXIT_USAGE;
    }
    if (i >= argc) {
        if (ctl->help) {
            ctl_print_usage(ctl);
            return 0;
        }
        return ctl_usage_error("missing command");
    }
    if (ctl->databases_file != NULL && strcmp(argv[i], "serve") != 0) /* serve: one console */
        return ctl_run_over_databases(ctl, argc, argv, i, dispatch);
    return dispatch(ctl, argc, argv, i);
}

int
main(int argc, char **argv)
{
    struct ctl ctl = {.database_url = getenv("OUTBOX_DATABASE_URL"),
                      .print_usage = actions_print_usage};
    int rc = run_command_line(&ctl, argc, argv);

    PQfinish(ctl.conn);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fputs("outboxctl: unable to write the output\n", stderr);
        if (rc == 0)
            rc = 1;
    }
    return rc;
}
