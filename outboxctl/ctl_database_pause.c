/*
 * ctl_database_pause.c - outboxctl pause --database and resume --database:
 * the whole database paused for relays of a list (outbox-relay
 * --databases), in outbox.database_lease (sql/018_database_lease.sql).
 */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

static const char SQL_PAUSE[] = "SELECT outbox.database_pause($1)";
static const char SQL_RESUME[] = "SELECT outbox.database_resume()";

int
ctl_command_database_pause(struct ctl *ctl, int argc, char **argv, int first, enum ctl_flow flow)
{
    bool pause = flow == CTL_PAUSE;
    const char *reason = NULL;
    const struct ctl_option options[] = {{"--reason", &reason, NULL}};
    const char *values[1];
    struct outbox_error err;
    PGresult *result;
    bool changed;
    int taken;

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, pause ? 1 : 0)) != CTL_GO_ON)
        return taken;
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    values[0] = reason;
    result = PQexecParams(ctl->conn, pause ? SQL_PAUSE : SQL_RESUME, pause ? 1 : 0, NULL, values,
                          NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(&err, ctl->conn, result,
                             pause ? "unable to pause the database" : "unable to resume the database");
        PQclear(result);
        return ctl_runtime_error(ctl, &err);
    }
    changed = PQgetvalue(result, 0, 0)[0] == 't';
    PQclear(result);
    if (pause)
        printf("%s the database (relays of a list serve it no more)\n",
               changed ? "paused" : "already paused:");
    else
        printf("%s the database\n", changed ? "resumed" : "was not paused:");
    return 0;
}
