/*
 * outboxctl migrate: applies the schema migrations not yet applied and says
 * which version the schema is at. The only command that runs on an old
 * schema.
 */
#include <stdio.h>

#include "ctl.h"
#include "migrate.h"

int
ctl_command_migrate(struct ctl *ctl, int argc, char **argv, int first)
{
    struct outbox_error err;
    int applied = 0, version = 0, taken;

    if ((taken = ctl_parse_options(ctl, argc, argv, first, NULL, 0)) != CTL_GO_ON)
        return taken;
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (outbox_migrate(ctl->conn, &applied, &err) < 0 ||
        outbox_schema_version(ctl->conn, &version, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    if (applied == 0)
        printf("schema up to date at version %d\n", version);
    else
        printf("applied %d migration%s, schema version %d\n", applied, applied == 1 ? "" : "s",
               version);
    return 0;
}
