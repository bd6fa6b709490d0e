/*
 * actions.h - outboxctl's one action table: each row a thing an operator
 * can do, by the command line's verb, by the console's JSON API, or both.
 *
 * The command line dispatches from it (outboxctl.c), the console routes its
 * API from it and gates it (console.c, console_api.c): a row that changes
 * rows is served only by a console started with --allow-actions. How to add
 * a verb or an endpoint is written at the top of actions.c.
 */
#ifndef OUTBOX_ACTIONS_H
#define OUTBOX_ACTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "console_api.h"
#include "ctl.h"

struct action {
    const char *verb;     /* the command line's words ("status", "dead list"); NULL: API only */
    ctl_command_fn *run;  /* the command line's handler */
    const char *method;   /* the API's method, "GET" or "POST"; NULL: command line only */
    const char *path;     /* the API's path under /api/v1/ */
    api_fn *answer;       /* the API's handler */
    bool database;        /* the handler reads the request's database (the worker's connection) */
    bool changes;         /* changes rows: what --allow-actions gates in the console */
    const char *synopsis; /* the command line's help: its words and options; NULL: not shown */
    const char *help;     /* ...and what it does, wrapped by the help ("\n" breaks a line) */
};

/* The API's handlers, each in its topic's module. */
api_fn api_overview;    /* ctl_status.c: overview, queues, blocked, relays, paused */
api_fn api_streams;     /* ctl_status.c */
api_fn api_chart;       /* ctl_status.c */
api_fn api_session;     /* console_api.c: about the console's own session */
api_fn api_pause;       /* ctl_flow.c */
api_fn api_resume;      /* ctl_flow.c */
api_fn api_replay;      /* ctl_replay.c */
api_fn api_dead;        /* ctl_dead.c */
api_fn api_dead_retry;  /* ctl_dead.c */
api_fn api_dead_delete; /* ctl_dead.c */
api_fn api_identity;    /* ctl_identity.c */
api_fn api_databases;   /* console_databases_view.c: every database of the list */

extern const struct action action_table[];
extern const size_t action_count;

/* Writes the command line's help, every row with a synopsis in table order, to out. */
void actions_print_usage(FILE *out);

/* The API row for method ("GET", "HEAD" as GET, "POST") and path; NULL when none. */
const struct action *action_for_api(const char *method, const char *path);

#endif
