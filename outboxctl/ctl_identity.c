/*
 * outboxctl identity show|set: the database's identity, what the message ids
 * of its rows are made of (sql/015_identity.sql). `set` gives a copy of a
 * database an id of its own, or switches a database of an earlier release
 * to the message ids of the form uid (sql/021_message_uid.sql). The console's GET identity
 * answers what `identity show --json` prints.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "actions.h"
#include "ctl.h"
#include "json.h"

void
ctl_identity_text(char *line, size_t size, const struct store_identity_row *identity)
{
    if (identity->database_id[0] == '\0')
        snprintf(line, size, "none (run outboxctl migrate)");
    else if (strcmp(identity->id_form, "job") == 0)
        snprintf(line, size,
                 "%s, message ids are bare job ids (an earlier form: switch with"
                 " outboxctl identity set --id-form uid)",
                 identity->database_id);
    else if (strcmp(identity->id_form, "database") == 0)
        snprintf(line, size,
                 "%s, message ids %s:%d:<job_id> (an earlier form: switch with outboxctl identity"
                 " set --id-form uid; history epoch %d, timeline %lld)",
                 identity->database_id, identity->database_id, identity->epoch, identity->epoch,
                 identity->timeline);
    else
        snprintf(line, size, "%s, message ids %s:<message_uid> (history epoch %d, timeline %lld)",
                 identity->database_id, identity->database_id, identity->epoch,
                 identity->timeline);
}

/* The identity as a JSON value into out: an object, or null when there is none. */
static void
identity_json(struct buffer *out, const struct store_identity_row *identity, unsigned flags)
{
    if (identity->database_id[0] == '\0') {
        buffer_puts(out, "null");
        return;
    }
    buffer_puts(out, "{\"database_id\":");
    json_put_text(out, identity->database_id, flags);
    buffer_puts(out, ",\"id_form\":");
    json_put_text(out, identity->id_form, flags);
    buffer_printf(out, ",\"epoch\":%d,\"timeline\":%lld}", identity->epoch, identity->timeline);
}

void
ctl_identity_json(FILE *out, const struct store_identity_row *identity)
{
    struct buffer json = {0};

    identity_json(&json, identity, 0);
    if (json.data != NULL)
        fwrite(json.data, 1, json.len, out);
    buffer_clear(&json);
}

static void
print_identity(const struct store_identity_row *identity, bool json)
{
    char line[256];

    if (json) {
        ctl_identity_json(stdout, identity);
        fputc('\n', stdout);
        return;
    }
    ctl_identity_text(line, sizeof(line), identity);
    printf("database identity: %s\n", line);
}

int
ctl_command_identity_show(struct ctl *ctl, int argc, char **argv, int first)
{
    struct store_identity_row identity;
    struct outbox_error err;
    bool json = false, present;
    int taken;
    const struct ctl_option options[] = {{"--json", NULL, &json}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 1)) != CTL_GO_ON)
        return taken;
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_identity(ctl->conn, &identity, &present, &err) < 0)
        return ctl_runtime_error(ctl, &err);
    print_identity(&identity, json);
    return 0;
}

int
ctl_command_identity_set(struct ctl *ctl, int argc, char **argv, int first)
{
    struct store_identity_row identity;
    struct outbox_error err;
    const char *database_id = NULL, *id_form = NULL;
    bool json = false;
    int taken;
    const struct ctl_option options[] = {{"--database-id", &database_id, NULL},
                                         {"--id-form", &id_form, NULL},
                                         {"--json", NULL, &json}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 3)) != CTL_GO_ON)
        return taken;
    if (database_id == NULL && id_form == NULL)
        return ctl_usage_error(
            "identity set needs --database-id ID and/or --id-form uid|database|job");
    if (id_form != NULL && strcmp(id_form, "uid") != 0 && strcmp(id_form, "database") != 0 &&
        strcmp(id_form, "job") != 0)
        return ctl_usage_error("--id-form: expected uid, database or job, got '%s'", id_form);
    if ((taken = ctl_connect(ctl)) != 0)
        return taken;
    if (store_admin_identity_set(ctl->conn, database_id, id_form, &identity, &err) < 0) {
        if (err.code == OUTBOX_ERR_INVALID)
            return ctl_usage_error("--database-id: %s", err.message);
        return ctl_runtime_error(ctl, &err);
    }
    print_identity(&identity, json);
    return 0;
}

/* ---- the console API ---- */

/* GET identity: the database's identity, as identity show --json prints it. */
void
api_identity(struct api_call *call)
{
    struct store_identity_row identity;
    struct outbox_error err;
    bool present;

    if (store_admin_identity(call->conn, &identity, &present, &err) < 0)
        return api_respond_store_error(call->response, &err);
    identity_json(&call->response->body, &identity, JSON_HTML_SAFE);
    api_respond_json(call->response, 200);
}
