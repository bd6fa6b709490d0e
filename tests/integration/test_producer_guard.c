/*
 * test_producer_guard.c - a hostile producer against the schema's guards.
 *
 * A login in outbox_producer that owns a schema of its own (normal for an
 * application role) tries to get past the insert guard and the CHECK
 * constraints: functions of its own first in search_path, a job_id, a
 * created_at or a replay count of its choosing, in a row-state queue and in
 * a stream queue. Every attempt must fail with a clear error and leave no
 * row; the owner keeps writing any shape. The schema test at the end holds
 * every function of schema outbox, also those later migrations add, to a
 * pinned search_path.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"

struct fixture {
    char *url;
    PGconn *admin;
    PGconn *producer; /* a login in outbox_producer, owner of schema app */
    char user[64];
};

static int
setup(void **state)
{
    static int counter;
    struct fixture *f = calloc(1, sizeof(*f));
    char grants[256];
    char *url;

    assert_non_null(f);
    f->url = harness_database_new();
    f->admin = harness_connect(f->url);
    harness_exec(f->admin, "SET client_min_messages = warning");
    fixture_create_outbox_roles(f->admin);
    snprintf(f->user, sizeof(f->user), "guard_producer_%d_%d", (int)getpid(), counter++);
    snprintf(grants, sizeof(grants), "GRANT outbox_producer TO %s; CREATE SCHEMA app AUTHORIZATION %s",
             f->user, f->user);
    fixture_create_login_role(f->admin, f->user, grants);
    url = fixture_url_as(f->url, f->user);
    f->producer = harness_connect(url);
    free(url);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    PQfinish(f->producer);
    fixture_drop_role(f->admin, f->user);
    PQfinish(f->admin);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/*
 * Runs sql on conn, which must fail with sqlstate (NULL: any) and a primary
 * message containing text (NULL: any); the transaction is rolled back after.
 */
static void
expect_refused(PGconn *conn, const char *sql, const char *sqlstate, const char *text)
{
    PGresult *result;
    const char *state, *message;

    harness_exec(conn, "BEGIN");
    result = PQexec(conn, sql);
    state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    message = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
    if (PQresultStatus(result) != PGRES_FATAL_ERROR)
        fail_msg("went in, should have been refused: %s", sql);
    if (sqlstate != NULL && (state == NULL || strcmp(state, sqlstate) != 0))
        fail_msg("%s\nfailed with %s (%s), expected %s", sql, state != NULL ? state : "none",
                 message != NULL ? message : "", sqlstate);
    if (text != NULL && (message == NULL || strstr(message, text) == NULL))
        fail_msg("%s\nfailed with \"%s\", expected it to say \"%s\"", sql,
                 message != NULL ? message : "", text);
    PQclear(result);
    harness_exec(conn, "ROLLBACK");
}

/* The producer's own functions, first in its search_path, each saying "allowed". */
static void
shadow_the_catalog(PGconn *producer)
{
    harness_exec(producer,
                 "CREATE FUNCTION app.has_table_privilege(oid, text) RETURNS boolean"
                 "  LANGUAGE sql AS 'SELECT true';"
                 "CREATE FUNCTION app.pg_has_role(name, oid, text) RETURNS boolean"
                 "  LANGUAGE sql AS 'SELECT true';"
                 "CREATE FUNCTION app.isfinite(timestamptz) RETURNS boolean"
                 "  LANGUAGE sql AS 'SELECT true';"
                 "CREATE FUNCTION app.jsonb_path_exists(jsonb, jsonpath, jsonb DEFAULT '{}',"
                 "                                      boolean DEFAULT false) RETURNS boolean"
                 "  LANGUAGE sql AS 'SELECT false';"
                 "CREATE FUNCTION app.jsonb_typeof(jsonb) RETURNS text"
                 "  LANGUAGE sql AS 'SELECT ''object''::text';"
                 "CREATE FUNCTION app.currval(regclass) RETURNS bigint"
                 "  LANGUAGE sql AS 'SELECT -5::bigint';"
                 "SET search_path = app, pg_catalog");
}

/*
 * With its own has_table_privilege, isfinite and jsonb_path_exists first in
 * search_path, a producer inserted succeeded, dead and running rows, an
 * infinite lease and run_at, and headers that are no object of strings. Each
 * is refused now, nothing goes in, and the key a forged running row would
 * have blocked takes another producer's row at once.
 */
static void
test_own_functions_first_in_search_path_pass_nothing(void **state)
{
    struct fixture *f = *state;

    shadow_the_catalog(f->producer);
    expect_refused(f->producer,
                   "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                   " VALUES ('q', '{}', 'succeeded', now())",
                   "42501", "producers may insert only ready rows");
    expect_refused(f->producer,
                   "INSERT INTO outbox.job (queue, payload, state, finished_at, last_error)"
                   " VALUES ('q', '{}', 'dead', now(), 'forged')",
                   "42501", "producers may insert only ready rows");
    expect_refused(f->producer,
                   "INSERT INTO outbox.job (queue, payload, ordering_key, state, worker_id,"
                   "                        lease_until, attempts)"
                   " VALUES ('q', '{}', 'customer:7', 'running', 'w', 'infinity', 1)",
                   NULL, NULL);
    expect_refused(f->producer,
                   "INSERT INTO outbox.job (queue, payload, run_at) VALUES ('q', '{}', 'infinity')",
                   "22023", "run_at must be a finite time");
    expect_refused(f->producer,
                   "INSERT INTO outbox.job (queue, payload, headers) VALUES ('q', '{}', '{\"a\": 1}')",
                   "23514", NULL);
    expect_refused(f->producer,
                   "INSERT INTO outbox.job (queue, payload, headers) VALUES ('q', '{}', '[\"a\"]')",
                   "23514", NULL);
    expect_refused(f->producer, "SELECT outbox.enqueue('q', '{}', headers => '{\"a\": [\"x\"]}')",
                   "22023", "headers must be a JSON object of string values");
    expect_refused(f->producer,
                   "SELECT outbox.enqueue('q', '{}', run_at => 'infinity')", "22023", NULL);
    harness_exec(f->producer, "SELECT outbox.enqueue('q', '{}')");
    expect_refused(f->producer,
                   "INSERT INTO outbox.job (job_id, queue, payload) OVERRIDING SYSTEM VALUE"
                   " VALUES (-5, 'q', '{}')",
                   "42501", "may not choose job_id");

    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"), 1);
    /* customer:7 has no forged head: another producer's row is ready at once */
    harness_exec(f->admin, "SELECT outbox.enqueue('q', '{}', ordering_key => 'customer:7')");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE ordering_key = 'customer:7' AND NOT held"
                                                "   AND state = 'ready'"),
                     1);
}

/*
 * Every function of schema outbox runs with search_path pinned to
 * pg_catalog, pg_temp, whoever calls it and whatever path the caller set:
 * also the functions a later migration adds, which this test finds itself.
 */
static void
test_every_outbox_function_pins_search_path(void **state)
{
    struct fixture *f = *state;
    PGresult *result;
    long long functions;

    functions = harness_query_ll(f->admin, "SELECT count(*) FROM pg_proc"
                                           " WHERE pronamespace = 'outbox'::regnamespace");
    assert_true(functions >= 20);
    result = PQexec(f->admin,
                    "SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1)"
                    "  FROM pg_proc AS p"
                    " WHERE p.pronamespace = 'outbox'::regnamespace"
                    "   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig),"
                    "                    false)");
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    if (!PQgetisnull(result, 0, 0))
        fail_msg("functions of schema outbox without SET search_path = pg_catalog, pg_temp: %s",
                 PQgetvalue(result, 0, 0));
    PQclear(result);
}

/* The refusals of a producer's own job_id, created_at and replays, in queue queue. */
static void
expect_own_columns_refused(struct fixture *f, const char *queue)
{
    char sql[512];
    long long next;

    /* a session that has drawn no job id yet: refused too */
    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (job_id, queue, payload) OVERRIDING SYSTEM VALUE"
             " VALUES (-5, '%s', '{}')",
             queue);
    expect_refused(f->producer, sql, NULL, NULL);
    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s', '{}')", queue);
    harness_exec(f->producer, sql);
    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (job_id, queue, payload) OVERRIDING SYSTEM VALUE"
             " VALUES (-5, '%s', '{}')",
             queue);
    expect_refused(f->producer, sql, "42501", "may not choose job_id");
    /* a future id would make another producer's next enqueue fail on the key */
    next = harness_query_ll(f->admin, "SELECT last_value + 2 FROM outbox.job_job_id_seq");
    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (job_id, queue, payload) OVERRIDING SYSTEM VALUE"
             " VALUES (%lld, '%s', '{}')",
             next, queue);
    expect_refused(f->producer, sql, "42501", "may not choose job_id");
    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (queue, payload, created_at)"
             " VALUES ('%s', '{}', now() + interval '100 years')",
             queue);
    expect_refused(f->producer, sql, "42501", "may not choose created_at");
    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (queue, payload, created_at)"
             " VALUES ('%s', '{}', now() - interval '1 day')",
             queue);
    expect_refused(f->producer, sql, "42501", "may not choose created_at");
    snprintf(sql, sizeof(sql), "INSERT INTO outbox.job (queue, payload, replays) VALUES ('%s', '{}', 3)",
             queue);
    expect_refused(f->producer, sql, "42501", "may not set replays");
    /* a uid of its own (another row's) would make a broker drop that row as a repeat */
    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (queue, payload, message_uid)"
             " VALUES ('%s', '{}', '0b6f3c7e-2f1d-4a55-9b1e-6c0d2a8e4f10')",
             queue);
    expect_refused(f->producer, sql, "42501", "permission denied for table job");
    /* naming the values the table would give is no choice */
    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (queue, payload, created_at, replays) VALUES ('%s', '{}', now(), 0)",
             queue);
    harness_exec(f->producer, sql);
    /* the other producer's enqueue and batch go on */
    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue_batch('%s', ARRAY['{}', '{}']::jsonb[])",
             queue);
    harness_exec(f->admin, sql);
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM outbox.job WHERE queue = '%s'", queue);
    assert_int_equal(harness_query_ll(f->admin, sql), 4);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM outbox.job WHERE queue = '%s'"
             " AND (job_id <= 0 OR replays <> 0 OR created_at > now())",
             queue);
    assert_int_equal(harness_query_ll(f->admin, sql), 0);
    /* each row drew a uid of its own */
    snprintf(sql, sizeof(sql), "SELECT count(DISTINCT message_uid) FROM outbox.job WHERE queue = '%s'",
             queue);
    assert_int_equal(harness_query_ll(f->admin, sql), 4);
}

/* Row-state queue: job_id, created_at, replays and message_uid are the table's, not the producer's. */
static void
test_producer_chooses_no_id_time_or_replays(void **state)
{
    expect_own_columns_refused(*state, "orders");
}

/*
 * Stream queue: a row with job_id -5 would sit in partition -1, never
 * published, counted or cleaned; a century-ahead created_at would stop the
 * cleanup of its partition. Both refused like in a row-state queue.
 */
static void
test_stream_producer_chooses_no_id_time_or_replays(void **state)
{
    struct fixture *f = *state;

    harness_exec(f->admin, "SELECT outbox.stream_enable('ev', 2)");
    expect_own_columns_refused(f, "ev");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE queue = 'ev' AND state = 'stream'"
                                                "   AND stream_partition IN (0, 1)"),
                     4);
    /* every row in the partition of its key (or job id), as stream_partition_of() says */
    harness_exec(f->producer, "SELECT outbox.enqueue_batch('ev', array_fill('{}'::jsonb, ARRAY[20]),"
                              " ordering_keys => ARRAY(SELECT 'k' || n FROM generate_series(1, 20) AS n))");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE queue = 'ev' AND stream_partition"
                                                "  = outbox.stream_partition_of(ordering_key, job_id, 2)"),
                     24);
}

/*
 * The owner (migrations, repairs, a restore of data) still writes any shape
 * the CHECK constraints allow: its own job_id in a fresh session, an old
 * created_at, a replay count.
 */
static void
test_owner_writes_its_own_ids_and_times(void **state)
{
    struct fixture *f = *state;
    PGconn *owner = harness_connect(f->url);

    harness_exec(owner, "INSERT INTO outbox.job (job_id, queue, payload, created_at, replays)"
                        " OVERRIDING SYSTEM VALUE"
                        " VALUES (1000, 'q', '{}', now() - interval '1 day', 2)");
    PQfinish(owner);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE job_id = 1000 AND replays = 2"
                                                "   AND created_at < now() - interval '23 hours'"),
                     1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_own_functions_first_in_search_path_pass_nothing,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_outbox_function_pins_search_path, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_producer_chooses_no_id_time_or_replays, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stream_producer_chooses_no_id_time_or_replays, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_owner_writes_its_own_ids_and_times, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
