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
 * without one), and whether the action changes rows (then the console serves
 * it only with --allow-actions, behind its CSRF check). Say it in
 * docs/console.md (the endpoint table) or in the command line's help
 * (ctl_common.c), and test it in tests/integration/test_console.c or
 * test_outboxctl.c. Nothing else changes: the dispatch, the routing and
 * the gate all read this table. GET /api/v1/identity was added so: its
 * row, api_identity in ctl_identity.c, a line of docs/console.md, a test.
 */
#include "actions.h"

#include <string.h>

#include "stream.h"

/* The command line's stream verb reads its own subcommands (stream.c). */
static int
ctl_command_stream(struct ctl *ctl, int argc, char **argv, int first)
{
    return outboxctl_stream(ctl->database_url, argc, argv, first);
}

/*
 * The rows of one command-line group ("dead list", "dead retry") stand
 * together, in the order the group's messages name them.
 */
const struct action action_table[] = {
    /* clang-format off */
    /* verb            command line handler        API method, path           API handler       db     changes */
    {"migrate",        ctl_command_migrate,        NULL,   NULL,              NULL,             false, true},
    {"status",         ctl_command_status,         "GET",  "overview",        api_overview,     true,  false},
    {NULL,             NULL,                       "GET",  "queues",          api_overview,     true,  false},
    {NULL,             NULL,                       "GET",  "blocked",         api_overview,     true,  false},
    {NULL,             NULL,                       "GET",  "relays",          api_overview,     true,  false},
    {NULL,             NULL,                       "GET",  "streams",         api_streams,      true,  false},
    {NULL,             NULL,                       "GET",  "chart",           api_chart,        true,  false},
    {NULL,             NULL,                       "GET",  "session",         api_session,      false, false},
    {NULL,             NULL,                       "GET",  "databases",       api_databases,    false, false},
    {"purge",          ctl_command_purge,          NULL,   NULL,              NULL,             false, true},
    {"enqueue",        ctl_command_enqueue,        NULL,   NULL,              NULL,             false, true},
    {"pause",          ctl_command_pause,          "POST", "pause",           api_pause,        true,  true},
    {"resume",         ctl_command_resume,         "POST", "resume",          api_resume,       true,  true},
    {"paused",         ctl_command_paused,         "GET",  "paused",          api_overview,     true,  false},
    {"replay",         ctl_command_replay,         "POST", "replay",          api_replay,       true,  true},
    {"serve",          ctl_command_serve,          NULL,   NULL,              NULL,             false, false},
    {"stream",         ctl_command_stream,         NULL,   NULL,              NULL,             false, true},
    {"inbox purge",    ctl_command_inbox_purge,    NULL,   NULL,              NULL,             false, true},
    {"identity show",  ctl_command_identity_show,  "GET",  "identity",        api_identity,     true,  false},
    {"identity set",   ctl_command_identity_set,   NULL,   NULL,              NULL,             false, true},
    {"dead list",      ctl_command_dead_list,      "GET",  "dead",            api_dead,         true,  false},
    {"dead retry",     ctl_command_dead_retry,     "POST", "dead/retry",      api_dead_retry,   true,  true},
    {NULL,             NULL,                       "POST", "dead/delete",     api_dead_delete,  true,  true},
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
