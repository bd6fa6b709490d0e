/*
 * actions.c - the action table: every outboxctl verb and every console API
 * endpoint, one row each (see actions.h).
 *
 * How to add one. A verb or an endpoint is a row here and its handler in the
 * module of its topic: ctl_status.c (queues, blocked keys, relays, streams,
 * chart), ctl_dead.c (dead rows), ctl_flow.c (pause and resume),
 * ctl_replay.c, ctl_identity.c, ctl_purge.c, ctl_enqueue.c,
 * console_databases_view.c (the databases of the list)... That module
 * calls the store (store_admin.h, store_dead.h, store_console.h) and holds
 * both faces of its topic: the command line's handler (a ctl_command_fn,
 * which parses its options with ctl_parse_options and prints a table or
 * --json) and the API's handler (an api_fn, which reads call->body or the
 * query string and answers with the api_* helpers of console_api.h;
 * declare it beside the others in actions.h). Fill in the row: the verb
 * and its handler for the command line, the method, the path under
 * /api/v1/ and its handler for the API, whether the API handler needs the
 * database (the request's: database=NAME, the first of the console's list
 * without one), whether the action changes rows (then the console serves
 * it only with --allow-actions, behind its CSRF check), and for a verb its
 * synopsis and help, from which `outboxctl --help` is written. Say it in
 * docs/console.md (the endpoint table) and docs/reference.md, and test it
 * in tests/integration/test_console.c or test_outboxctl.c. Nothing else changes: the dispatch, the routing and
 * the gate all read this table. GET /api/v1/identity was added so: its
 * row, api_identity in ctl_identity.c, a line of docs/console.md, a test.
 */
#include "actions.h"

#include <stdio.h>
#include <string.h>

#include "console.h"
#include "retention.h"
#include "stream.h"
#include "timeouts.h"

/* The command line's stream verb reads its own subcommands (stream.c). */
static int
ctl_command_stream(struct ctl *ctl, int argc, char **argv, int first)
{
    return outboxctl_stream(ctl->database_url, argc, argv, first);
}

/*
 * The rows of one command-line group ("dead list", "dead retry") stand
 * together, in the order the group's messages name them; the command
 * line's help lists the rows with a synopsis in table order. A row with a
 * synopsis and no verb is a form of the row above it that the help shows
 * on its own ("pause --database").
 */
const struct action action_table[] = {
    /* clang-format off */
    /* verb            command line handler        API method, path           API handler       db     changes
     *                 synopsis, help (wrapped to the help's column; \n breaks a line) */
    {"migrate",        ctl_command_migrate,        NULL,   NULL,              NULL,             false, true,
     "migrate", "apply the schema migrations not yet applied"},
    {"status",         ctl_command_status,         "GET",  "overview",        api_overview,     true,  false,
     "status [--json] [--retention DURATION]",
     "jobs per queue and state, oldest ready age, table size, vacuum and xmin horizon figures, "
     "succeeded jobs past the relays' retention (default $OUTBOX_RETENTION, else "
     OUTBOX_RETENTION_DEFAULT "), ordering keys blocked by a dead, retrying or stuck running head"},
    {NULL,             NULL,                       "GET",  "queues",          api_overview,     true,  false, NULL, NULL},
    {NULL,             NULL,                       "GET",  "blocked",         api_overview,     true,  false, NULL, NULL},
    {NULL,             NULL,                       "GET",  "relays",          api_overview,     true,  false, NULL, NULL},
    {NULL,             NULL,                       "GET",  "streams",         api_streams,      true,  false, NULL, NULL},
    {NULL,             NULL,                       "GET",  "chart",           api_chart,        true,  false, NULL, NULL},
    {NULL,             NULL,                       "GET",  "session",         api_session,      false, false, NULL, NULL},
    {NULL,             NULL,                       "GET",  "databases",       api_databases,    false, false, NULL, NULL},
    {"dead list",      ctl_command_dead_list,      "GET",  "dead",            api_dead,         true,  false,
     "dead list [--queue Q] [--limit N]", "dead jobs with their last error (limit 100)"},
    {"dead retry",     ctl_command_dead_retry,     "POST", "dead/retry",      api_dead_retry,   true,  true,
     "dead retry (--queue Q | --job ID | --all) [--extra-attempts N]",
     "make dead jobs ready again with N more attempts (default 1): of queue Q, job ID, or "
     "(--all) every queue"},
    {NULL,             NULL,                       "POST", "dead/delete",     api_dead_delete,  true,  true,  NULL, NULL},
    {"purge",          ctl_command_purge,          NULL,   NULL,              NULL,             false, true,
     "purge --older-than DURATION",
     "delete succeeded jobs finished longer ago than DURATION (90s, 15m, 24h, 7d, 1h30m; 0: all "
     "of them), in batches of 5000"},
    {"enqueue",        ctl_command_enqueue,        NULL,   NULL,              NULL,             false, true,
     "enqueue --queue Q (--payload JSON | --payload-file PATH) [--idempotency-key K]\n"
     "[--exchange X] [--routing-key R]",
     "add one job and print its id; a known key prints the existing job's id; the payload is "
     "read from PATH, or stdin for '-'; X and R route it (default: the relay's --exchange, Q)\n"
     "(--key is an old spelling of --idempotency-key)"},
    {"pause",          ctl_command_pause,          "POST", "pause",           api_pause,        true,  true,
     "pause QUEUE [--ordering-key KEY] [--reason TEXT]",
     "relays stop claiming the queue (or only that ordering key of it); producers go on"},
    {"resume",         ctl_command_resume,         "POST", "resume",          api_resume,       true,  true,
     "resume QUEUE [--ordering-key KEY]",
     "undo a pause; paused keys of a resumed queue stay paused"},
    {NULL,             NULL,                       NULL,   NULL,              NULL,             false, true,
     "pause --database [--reason TEXT] / resume --database",
     "relays of a list (outbox-relay --databases) stop serving the whole database, or go on"},
    {"paused",         ctl_command_paused,         "GET",  "paused",          api_overview,     true,  false,
     "paused", "list pauses: who, when and why"},
    {"replay",         ctl_command_replay,         "POST", "replay",          api_replay,       true,  true,
     "replay --queue Q (--since TIME [--until TIME] | --job ID [--job ID ...])\n"
     "[--ordering-key KEY] [--dry-run]",
     "publish succeeded jobs again, in their order per key: those finished in the time range, "
     "or the given ids; in batches of 1000. TIME is a timestamp ('2026-01-31 12:00+00') or a "
     "time ago: a DURATION (10m, 1h30m) or a PostgreSQL interval ('10 minutes', '1 day 2 "
     "hours')\n(in pause, resume and replay, --key is an old spelling of --ordering-key)"},
    {"inbox purge",    ctl_command_inbox_purge,    NULL,   NULL,              NULL,             false, true,
     "inbox purge --older-than DURATION",
     "delete inbox records accepted longer ago than DURATION, in batches of 5000"},
    {"identity show",  ctl_command_identity_show,  "GET",  "identity",        api_identity,     true,  false,
     "identity show [--json]",
     "the database's identity: message ids are <database_id>:<message_uid>"},
    {"identity set",   ctl_command_identity_set,   NULL,   NULL,              NULL,             false, true,
     "identity set [--database-id ID] [--id-form uid|database|job]",
     "give a copy of a database an id of its own, or switch a database of an earlier release "
     "to the form uid"},
    {"serve",          ctl_command_serve,          NULL,   NULL,              NULL,             false, false,
     "serve [--listen HOST:PORT] [--auth-token-file FILE] [--allow-actions]",
     "the operator's web console and its JSON API (default " CONSOLE_DEFAULT_LISTEN "; "
     "read-only unless --allow-actions; other than loopback only with --auth-token-file); with "
     "--databases FILE, one console over every database listed"},
    {"stream",         ctl_command_stream,         NULL,   NULL,              NULL,             false, true,
     "stream enable QUEUE [--partitions N] [--lock-wait DURATION]",
     "publish QUEUE as a stream: in commit order per partition (1..256, default 1), no write "
     "per row; a key stays in one partition"},
    {NULL,             NULL,                       NULL,   NULL,              NULL,             false, true,
     "stream disable QUEUE [--lock-wait DURATION]",
     "back to row-state claims: unpublished rows become ready; both wait for open transactions "
     "on outbox.job in short tries, naming them, up to DURATION (default "
     TIMEOUT_TEXT(CTL_STREAM_LOCK_WAIT_DEFAULT_SECONDS) "s)"},
    {NULL,             NULL,                       NULL,   NULL,              NULL,             false, false,
     "stream list", "stream partitions: lag (rows, seconds), owner"},
    /* clang-format on */
};

const size_t action_count = sizeof(action_table) / sizeof(action_table[0]);

const struct action *
action_for_api(const char *method, const char *path)
{
    const char *wanted = strcmp(method, "HEAD") == 0 ? "GET" : method;

    for (size_t i = 0; i < action_count; i++) {
        const struct action *action = &action_table[i];

        if (action->method != NULL && strcmp(action->method, wanted) == 0 &&
            strcmp(action->path, path) == 0)
            return action;
    }
    return NULL;
}

/* ---- the command line's help ---- */

#define HELP_COLUMN 35 /* where a row's help text starts */
#define HELP_WIDTH 44  /* its width: the help ends by column 79 */

/* Writes help wrapped to HELP_WIDTH at HELP_COLUMN; the first line goes on from column. */
static void
print_help(FILE *out, const char *help, size_t column)
{
    const char *p = help;

    while (*p != '\0') {
        size_t line = 0, fit = 0;

        if (column > HELP_COLUMN - 2) { /* the synopsis reached the help's column */
            fputc('\n', out);
            column = 0;
        }
        fprintf(out, "%*s", (int)(HELP_COLUMN - column), "");
        column = 0;
        while (p[line] != '\0' && p[line] != '\n' && line <= HELP_WIDTH) {
            if (p[line] == ' ')
                fit = line;
            line++;
        }
        if (p[line] == '\0' || p[line] == '\n' || fit == 0)
            fit = line;
        fprintf(out, "%.*s\n", (int)fit, p);
        p += fit;
        while (*p == ' ' || *p == '\n')
            p++;
    }
}

void
actions_print_usage(FILE *out)
{
    fputs("usage: outboxctl [--database-url URL] COMMAND [OPTIONS]\n"
          "       outboxctl --databases FILE COMMAND [OPTIONS]   (each database of a relay's "
          "list)\n\ncommands:\n",
          out);
    for (size_t i = 0; i < action_count; i++) {
        const char *synopsis = action_table[i].synopsis;
        const char *line_end;

        if (synopsis == NULL)
            continue;
        /* a synopsis of several lines: the next ones indented under its first word's end */
        while ((line_end = strchr(synopsis, '\n')) != NULL) {
            fprintf(out, "  %.*s\n        ", (int)(line_end - synopsis), synopsis);
            synopsis = line_end + 1;
        }
        fprintf(out, "  %s", synopsis);
        print_help(out, action_table[i].help,
                   2 + strlen(synopsis) + (synopsis != action_table[i].synopsis ? 8 : 0));
    }
    fputs("\noptions:\n"
          "  --database-url URL  libpq URI or conninfo (default: $OUTBOX_DATABASE_URL)\n"
          "  -h, --help          show this help\n"
          "  --version           print the version and exit\n"
          "\n"
          "exit status: 0 success, 1 runtime error, 2 usage error\n",
          out);
}
