/*
 * test_identity.c - the database identity (sql/015_identity.sql): chosen at
 * migrate time, kept by a database of an earlier release in the bare job id
 * form until an operator switches, set by outboxctl, shown by status; the
 * history epoch a relay's connection bumps; and the keyed inbox, which
 * takes every message id the relay sends (replays included).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "harness.h"
#include "outbox.h"
#include "relay_runner.h"
#include "store_identity.h"

/* A fresh database and a connection to it (fixtures.h). */
#define fixture fixture_database
#define setup fixture_database_setup
#define teardown fixture_database_teardown

/* The first column of the first row of sql, as text (malloc'd). */
static char *
query_text(PGconn *conn, const char *sql)
{
    PGresult *result = PQexec(conn, sql);
    char *text;

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) < 1)
        fail_msg("query failed: %s\n  %s", PQresultErrorMessage(result), sql);
    text = strdup(PQgetvalue(result, 0, 0));
    PQclear(result);
    return text;
}

#define UID "0b6f3c7e-2f1d-4a55-9b1e-6c0d2a8e4f10"

/* A database migrated on its own: a random id of 12 hex digits, the form uid, epoch 1. */
static void
test_fresh_database_takes_the_uid_form(void **state)
{
    struct fixture *f = *state;
    char *url = harness_database_new_empty();
    PGconn *conn = harness_connect(url);
    struct outbox_error err;
    int applied;
    char *id, *form, *first;

    (void)f;
    assert_int_equal(outbox_migrate(conn, &applied, &err), 0);
    id = query_text(conn, "SELECT database_id FROM outbox.identity");
    form = query_text(conn, "SELECT id_form || ':' || epoch FROM outbox.identity");
    assert_int_equal(strlen(id), 12);
    assert_int_equal(strspn(id, "0123456789abcdef"), 12);
    assert_string_equal(form, "uid:1");
    first = strdup(id);
    free(id);
    free(form);
    /* another database migrated alone gets another id */
    id = query_text(f->conn, "SELECT database_id FROM outbox.identity");
    assert_string_not_equal(id, first);
    free(id);
    free(first);
    PQfinish(conn);
    harness_database_drop(url);
}

/*
 * A database that handed out job ids before migration 015 keeps them as
 * message ids (its consumers deduplicate on them) until the operator
 * switches; the switch is one command, and the next connection of a relay
 * publishes the new form.
 */
static void
test_existing_database_keeps_job_ids_until_switched(void **state)
{
    char *url = harness_database_new_empty();
    PGconn *conn = harness_connect(url);
    struct store_identity identity;
    struct outbox_error err;
    char message_id[STORE_MESSAGE_ID_MAX], *form;
    int applied;

    (void)state;
    for (int version = 1; version <= 12; version++) {
        static const char *const names[] = {
            "001_outbox",           "002_queue_name_check", "003_insert_guard",
            "004_routing_and_trace", "005_flow_control",    "006_enqueue_batch",
            "007_autovacuum",       "008_guard_and_inbox_order", "009_stream",
            "010_stream_members",   "011_stream_place",     "012_stream_xid"};
        char path[64], record[160];
        char *sql;

        snprintf(path, sizeof(path), "sql/%s.sql", names[version - 1]);
        sql = fixture_read_source_file(path);
        if (version == 1)
            harness_exec(conn, "CREATE SCHEMA IF NOT EXISTS outbox;"
                               " CREATE TABLE IF NOT EXISTS outbox.schema_migrations ("
                               " version integer PRIMARY KEY, name text NOT NULL,"
                               " applied_at timestamptz NOT NULL DEFAULT now())");
        harness_exec(conn, sql);
        snprintf(record, sizeof(record),
                 "INSERT INTO outbox.schema_migrations (version, name) VALUES (%d, '%s.sql')",
                 version, names[version - 1]);
        harness_exec(conn, record);
        free(sql);
    }
    harness_query_ll(conn, "SELECT outbox.enqueue('orders', '{}')");
    assert_int_equal(outbox_migrate(conn, &applied, &err), 0);
    assert_true(applied >= 1);
    form = query_text(conn, "SELECT id_form FROM outbox.identity");
    assert_string_equal(form, "job");
    free(form);
    assert_int_equal(store_identity_observe(conn, &identity, &err), 0);
    store_message_id_format(&identity, 7, UID, 0, STORE_MESSAGE_ID, message_id);
    assert_string_equal(message_id, "7");
    store_message_id_format(&identity, 7, UID, 1, STORE_MESSAGE_ID, message_id);
    assert_string_equal(message_id, "7.r1");
    /* the broker's own dedup keys are unique at once */
    store_message_id_format(&identity, 7, UID, 1, STORE_DEDUP_ID, message_id);
    assert_string_equal(message_id + strlen(identity.database_id), ":" UID ".r1");

    harness_exec(conn, "SELECT outbox.identity_set(NULL, 'uid')");
    assert_int_equal(store_identity_observe(conn, &identity, &err), 0);
    store_message_id_format(&identity, 7, UID, 0, STORE_MESSAGE_ID, message_id);
    assert_string_equal(message_id + strlen(identity.database_id), ":" UID);
    PQfinish(conn);
    harness_database_drop(url);
}

/*
 * A relay's connection bumps the epoch when the recorded history is not the
 * server's: by the timeline's step within one cluster (two promotions in a
 * row, the second standby not having seen the first one's epoch, still get
 * two epochs), by one for another cluster; and only once however many
 * connections see it.
 */
static void
test_history_change_bumps_the_epoch(void **state)
{
    struct fixture *f = *state;
    struct store_identity identity;
    struct outbox_error err;
    long long base;

    assert_int_equal(store_identity_observe(f->conn, &identity, &err), 0);
    assert_int_equal(identity.epoch, 1);
    assert_int_equal(store_identity_observe(f->conn, &identity, &err), 0);
    assert_int_equal(identity.epoch, 1); /* same history: no bump */

    /*
     * The recorded timeline three behind the server's, as after three
     * promotions: epoch - timeline stays, so a standby promoted one step
     * earlier from the same record (timeline one lower) got epoch 3, not 4.
     */
    harness_exec(f->conn, "UPDATE outbox.identity SET timeline = timeline - 3");
    base = harness_query_ll(f->conn, "SELECT epoch - timeline FROM outbox.identity");
    assert_int_equal(store_identity_observe(f->conn, &identity, &err), 0);
    assert_int_equal(identity.epoch, 4);
    assert_int_equal(harness_query_ll(f->conn, "SELECT epoch - timeline FROM outbox.identity"), base);

    /* another cluster (a restore elsewhere): one more */
    harness_exec(f->conn, "UPDATE outbox.identity SET system_identifier = 42");
    assert_int_equal(store_identity_observe(f->conn, &identity, &err), 0);
    assert_int_equal(identity.epoch, 5);
    assert_string_equal(identity.history + strlen(identity.database_id), ":5");
}

/*
 * Two copies of one database moving on from the same recorded history (two
 * standbys promoted to the same timeline, a dump restored twice) compute
 * the same epoch, but each draws its own history token: the names the
 * brokers' order records go by differ. Staged on one database: its
 * identity row put back between the two moves. A database migrated before
 * 026 keeps its name "<database_id>:<epoch>" until its history moves.
 */
static void
test_two_copies_moving_on_get_two_names(void **state)
{
    struct fixture *f = *state;
    struct store_identity first, second;
    struct outbox_error err;
    char plain[64];

    assert_int_equal(store_identity_observe(f->conn, &first, &err), 0);
    snprintf(plain, sizeof(plain), "%s:1", first.database_id);
    assert_string_equal(first.history_name, plain);
    harness_exec(f->conn, "UPDATE outbox.identity SET timeline = timeline - 1");
    harness_exec(f->conn, "CREATE TEMP TABLE moved_from AS SELECT * FROM outbox.identity");
    assert_int_equal(store_identity_observe(f->conn, &first, &err), 0);
    assert_true(first.history_changed);
    harness_exec(f->conn, "DELETE FROM outbox.identity");
    harness_exec(f->conn, "INSERT INTO outbox.identity SELECT * FROM moved_from");
    assert_int_equal(store_identity_observe(f->conn, &second, &err), 0);
    assert_true(second.history_changed);
    assert_int_equal(first.epoch, 2);
    assert_int_equal(second.epoch, first.epoch);
    assert_string_equal(first.history, second.history); /* the form database's ids */
    assert_int_equal(strncmp(first.history_name, first.history, strlen(first.history)), 0);
    assert_int_equal(first.history_name[strlen(first.history)], '.');
    assert_int_equal(strlen(first.history_name), strlen(first.history) + 13);
    assert_string_not_equal(first.history_name, second.history_name);
    /* the same history seen again keeps its name */
    assert_int_equal(store_identity_observe(f->conn, &first, &err), 0);
    assert_false(first.history_changed);
    assert_string_equal(first.history_name, second.history_name);
}

/* outboxctl status and identity show print it; identity set refuses a bad id with exit 2. */
static void
test_outboxctl_shows_and_sets_the_identity(void **state)
{
    struct fixture *f = *state;
    char output[8192];
    const char *status[] = {"--database-url", f->url, "status", NULL};
    const char *set[] = {"--database-url", f->url, "identity", "set", "--database-id", "tenant-9",
                         NULL};
    const char *bad[] = {"--database-url", f->url, "identity", "set", "--database-id", "a:b", NULL};
    const char *json[] = {"--database-url", f->url, "status", "--json", NULL};

    assert_int_equal(fixture_run_program("outboxctl", set, output, sizeof(output), 30000), 0);
    assert_non_null(strstr(output, "tenant-9, message ids tenant-9:<message_uid>"));
    assert_int_equal(fixture_run_program("outboxctl", status, output, sizeof(output), 30000), 0);
    assert_non_null(strstr(output, "database identity"));
    assert_non_null(strstr(output, "tenant-9:<message_uid>"));
    assert_int_equal(fixture_run_program("outboxctl", json, output, sizeof(output), 30000), 0);
    assert_non_null(strstr(output, "\"identity\":{\"database_id\":\"tenant-9\",\"id_form\":\"uid\""));
    assert_int_equal(fixture_run_program("outboxctl", bad, output, sizeof(output), 30000), 2);
    assert_non_null(strstr(output, "must be 1-40 characters"));
}

/* Runs outbox.inbox_accept(consumer, id, key) and returns its answer. */
static bool
accept(PGconn *conn, const char *id, const char *key)
{
    const char *params[2] = {id, key};
    PGresult *result = PQexecParams(conn, "SELECT outbox.inbox_accept('billing', $1, $2)", 2,
                                    NULL, params, NULL, NULL, 0);
    bool yes;

    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("inbox_accept('%s', '%s'): %s", id, key ? key : "NULL",
                 PQresultErrorMessage(result));
    yes = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    return yes;
}

/*
 * The keyed inbox takes every id the relay sends: per database and key, in
 * (epoch, job id) order, so rows committed after a failover (a new epoch,
 * job ids again from below) are applied; a replay is applied once, by its
 * id, whatever the key's order; the bare job ids of the earlier form go on
 * working.
 */
static void
test_keyed_inbox_takes_every_message_id(void **state)
{
    struct fixture *f = *state;
    PGresult *bad;

    assert_true(accept(f->conn, "2", "cust-1"));
    assert_false(accept(f->conn, "2", "cust-1"));
    assert_true(accept(f->conn, "2.r1", "cust-1")); /* a replay is applied again */
    assert_false(accept(f->conn, "2.r1", "cust-1"));
    assert_true(accept(f->conn, "9223372036854775807", "cust-1")); /* 19 digits */

    assert_true(accept(f->conn, "db-a:1:1001", "cust-1"));
    assert_false(accept(f->conn, "db-a:1:1000", "cust-1")); /* older, same history */
    assert_true(accept(f->conn, "db-a:2:1001", "cust-1")); /* after a failover: reused job id */
    assert_false(accept(f->conn, "db-a:2:1001", "cust-1"));
    assert_true(accept(f->conn, "db-b:1:5", "cust-1"));   /* another database's order */
    assert_true(accept(f->conn, "db-a:2:5.r3", "cust-1")); /* a replay of an old row */
    assert_false(accept(f->conn, "db-a:2:5.r3", "cust-1"));
    assert_false(accept(f->conn, "db-a:2:5.r3", NULL)); /* a replay's record is the plain inbox's */

    /* the form uid: once by its id, a replay once more */
    assert_true(accept(f->conn, "db-a:" UID, "cust-1"));
    assert_false(accept(f->conn, "db-a:" UID, "cust-1"));
    assert_false(accept(f->conn, "db-a:" UID, NULL));
    assert_true(accept(f->conn, "db-a:" UID ".r1", "cust-1"));
    assert_false(accept(f->conn, "db-a:" UID ".r1", "cust-1"));

    bad = PQexec(f->conn, "SELECT outbox.inbox_accept('billing', 'db-a:x:1', 'cust-1')");
    assert_int_equal(PQresultStatus(bad), PGRES_FATAL_ERROR);
    assert_string_equal(PQresultErrorField(bad, PG_DIAG_SQLSTATE), "22023");
    PQclear(bad);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fresh_database_takes_the_uid_form, setup, teardown),
        cmocka_unit_test(test_existing_database_keeps_job_ids_until_switched),
        cmocka_unit_test_setup_teardown(test_history_change_bumps_the_epoch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_copies_moving_on_get_two_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outboxctl_shows_and_sets_the_identity, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_keyed_inbox_takes_every_message_id, setup, teardown),
    };

    return cmocka_run_group_tests_name("identity", tests, NULL, NULL);
}
