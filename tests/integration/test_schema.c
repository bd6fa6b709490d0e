/*
 * test_schema.c - sql/ as producers and workers see it, through plain SQL.
 *
 * Each test runs on its own database cloned from outbox_template.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct schema_test {
    char *url;
    PGconn *conn;
};

static int
setup(void **state)
{
    struct schema_test *test = calloc(1, sizeof(*test));

    assert_non_null(test);
    test->url = harness_database_new();
    test->conn = harness_connect(test->url);
    harness_exec(test->conn, "SET client_min_messages = warning");
    *state = test;
    return 0;
}

static int
teardown(void **state)
{
    struct schema_test *test = *state;

    PQfinish(test->conn);
    harness_database_drop(test->url);
    free(test);
    return 0;
}

/*
 * Runs sql, which must fail with sqlstate and a message containing text; when
 * constraint is not NULL the error must name that constraint.
 */
static void
expect_sql_error(PGconn *conn, const char *sql, const char *sqlstate, const char *text,
                 const char *constraint)
{
    PGresult *result = PQexec(conn, sql);
    const char *state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    const char *message = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
    const char *name = PQresultErrorField(result, PG_DIAG_CONSTRAINT_NAME);

    if (PQresultStatus(result) != PGRES_FATAL_ERROR) {
        PQclear(result);
        fail_msg("expected an error, but this worked: %s", sql);
    }
    if (state == NULL || strcmp(state, sqlstate) != 0 || message == NULL ||
        strstr(message, text) == NULL ||
        (constraint != NULL && (name == NULL || strcmp(name, constraint) != 0))) {
        char got[512];

        snprintf(got, sizeof(got), "SQLSTATE %s, constraint %s: %s", state ? state : "none",
                 name ? name : "none", message ? message : "no message");
        PQclear(result);
        fail_msg("%s\n  expected SQLSTATE %s containing '%s', got %s", sql, sqlstate, text, got);
    }
    PQclear(result);
}

static long long
job_count(PGconn *conn)
{
    return harness_query_ll(conn, "SELECT count(*) FROM outbox.job");
}

static void
test_committed_enqueue_is_visible_rolled_back_is_not(void **state)
{
    struct schema_test *test = *state;
    PGconn *observer = harness_connect(test->url);
    long long committed, rolled_back;
    char sql[512];

    harness_exec(test->conn, "BEGIN");
    committed = harness_query_ll(test->conn,
                                 "SELECT outbox.enqueue('orders', '{\"order\": 1}')");
    assert_true(committed > 0);
    /* Not visible to others before the producer commits. */
    assert_int_equal(job_count(observer), 0);
    harness_exec(test->conn, "COMMIT");

    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM outbox.job WHERE job_id = %lld AND state = 'ready' "
             "AND queue = 'orders' AND payload = '{\"order\": 1}' AND headers = '{}' "
             "AND attempts = 0 AND max_attempts = 10",
             committed);
    assert_int_equal(harness_query_ll(observer, sql), 1);

    harness_exec(test->conn, "BEGIN");
    rolled_back = harness_query_ll(test->conn,
                                   "SELECT outbox.enqueue('orders', '{\"order\": 2}')");
    harness_exec(test->conn, "ROLLBACK");
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM outbox.job WHERE job_id = %lld",
             rolled_back);
    assert_int_equal(harness_query_ll(observer, sql), 0);
    assert_int_equal(job_count(observer), 1);
    PQfinish(observer);
}

static void
test_idempotency_key_returns_first_job(void **state)
{
    struct schema_test *test = *state;
    long long first, again, other_queue;

    first = harness_query_ll(test->conn, "SELECT outbox.enqueue('mail', '{\"n\": 1}', 'key-1')");
    again = harness_query_ll(test->conn, "SELECT outbox.enqueue('mail', '{\"n\": 2}', 'key-1')");
    assert_int_equal(again, first);
    assert_int_equal(harness_query_ll(test->conn, "SELECT count(*) FROM outbox.job "
                                                  "WHERE idempotency_key = 'key-1'"),
                     1);
    /* The first payload stays: a retried producer does not overwrite the message. */
    assert_int_equal(harness_query_ll(test->conn, "SELECT (payload->>'n')::int FROM outbox.job"),
                     1);

    other_queue =
        harness_query_ll(test->conn, "SELECT outbox.enqueue('sms', '{\"n\": 3}', 'key-1')");
    assert_true(other_queue != first);
    assert_int_equal(job_count(test->conn), 2);
}

static void
test_invalid_input_is_rejected(void **state)
{
    struct schema_test *test = *state;
    char sql[512];
    char long_name[202];

    expect_sql_error(test->conn, "SELECT outbox.enqueue('', '{}')", "22023",
                     "invalid outbox queue name", NULL);
    memset(long_name, 'q', 201);
    long_name[201] = '\0';
    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s', '{}')", long_name);
    expect_sql_error(test->conn, sql, "22023", "invalid outbox queue name", NULL);
    expect_sql_error(test->conn, "SELECT outbox.enqueue('two words', '{}')", "22023",
                     "invalid outbox queue name 'two words'", NULL);
    expect_sql_error(test->conn, "SELECT outbox.enqueue('q', '{}', headers => '[\"a\"]')", "22023",
                     "outbox headers must be a JSON object of string values", NULL);
    expect_sql_error(test->conn, "SELECT outbox.enqueue('q', '{}', headers => '{\"n\": 1}')",
                     "22023", "outbox headers must be a JSON object of string values", NULL);
    expect_sql_error(test->conn, "SELECT outbox.enqueue('q', '{}', max_attempts => 0)", "22023",
                     "outbox max_attempts must be positive, got 0", NULL);
    /* The table enforces the same rules for writers that bypass enqueue(). */
    expect_sql_error(test->conn, "INSERT INTO outbox.job (queue, payload) VALUES ('a b', '{}')",
                     "23514", "violates check constraint", "job_queue_name");
    assert_int_equal(job_count(test->conn), 0);
}

/* run_at and created_at are finite: an infinite time breaks every age figure. */
static void
test_infinite_times_are_rejected(void **state)
{
    struct schema_test *test = *state;

    expect_sql_error(test->conn, "SELECT outbox.enqueue('q', '{}', run_at => '-infinity')",
                     "22023", "outbox run_at must be a finite time", NULL);
    expect_sql_error(test->conn, "SELECT outbox.enqueue('q', '{}', run_at => 'infinity')",
                     "22023", "outbox run_at must be a finite time", NULL);
    expect_sql_error(test->conn, "SELECT outbox.enqueue('q', '{}', idempotency_key => 'k',"
                                 " run_at => '-infinity')",
                     "22023", "outbox run_at must be a finite time", NULL);
    /* writers that bypass enqueue(), the owner included */
    expect_sql_error(test->conn,
                     "INSERT INTO outbox.job (queue, payload, run_at) VALUES ('q', '{}', '-infinity')",
                     "22023", "outbox run_at must be a finite time", NULL);
    expect_sql_error(test->conn,
                     "INSERT INTO outbox.job (queue, payload, created_at) VALUES ('q', '{}', 'infinity')",
                     "22023", "outbox created_at must be a finite time", NULL);
    assert_int_equal(job_count(test->conn), 0);
    /* far but finite times are fine */
    harness_query_ll(test->conn, "SELECT outbox.enqueue('q', '{}', run_at => '4000-01-01')");
    harness_query_ll(test->conn, "SELECT outbox.enqueue('q', '{}', run_at => '1970-01-01')");
    assert_int_equal(job_count(test->conn), 2);
}

/* Header values are strings; an array (even an empty one) is not. */
static void
test_header_arrays_are_rejected(void **state)
{
    struct schema_test *test = *state;
    static const char *const refused[] = {"{\"a\": [\"x\"]}", "{\"a\": []}",
                                          "{\"a\": \"x\", \"b\": [\"y\", \"z\"]}",
                                          "{\"a\": {\"b\": \"c\"}}", "{\"a\": [[\"x\"]]}"};
    char sql[512];

    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('q', '{}', headers => '%s')",
                 refused[i]);
        expect_sql_error(test->conn, sql, "22023",
                         "outbox headers must be a JSON object of string values", NULL);
        snprintf(sql, sizeof(sql), "INSERT INTO outbox.job (queue, payload, headers)"
                                   " VALUES ('q', '{}', '%s')",
                 refused[i]);
        expect_sql_error(test->conn, sql, "23514", "violates check constraint",
                         "job_headers_strings");
    }
    assert_int_equal(job_count(test->conn), 0);
    harness_query_ll(test->conn,
                     "SELECT outbox.enqueue('q', '{}', headers => '{\"a\": \"[x]\", \"b\": \"\"}')");
    assert_int_equal(job_count(test->conn), 1);
}

static void
test_queue_name_of_200_characters_is_accepted(void **state)
{
    struct schema_test *test = *state;
    char sql[512];
    char name[201];

    memset(name, 'a', 200);
    name[0] = 'Z';
    name[1] = '.';
    name[2] = '_';
    name[3] = ':';
    name[4] = '-';
    name[5] = '9';
    name[200] = '\0';
    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s', '{}')", name);
    assert_true(harness_query_ll(test->conn, sql) > 0);
    assert_int_equal(
        harness_query_ll(test->conn, "SELECT length(queue) FROM outbox.job"), 200);
}

/* The table's own check, for writers that bypass enqueue(): the rule's edges. */
static void
test_queue_name_check_on_direct_writes(void **state)
{
    struct schema_test *test = *state;
    static const char *const refused[] = {"''",    "'a b'", "'caf\xc3\xa9'",   "E'q\\n'",
                                          "'q/x'", "'q;'",  "repeat('q', 201)"};
    char sql[512];

    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        snprintf(sql, sizeof(sql), "INSERT INTO outbox.job (queue, payload) VALUES (%s, '{}')",
                 refused[i]);
        expect_sql_error(test->conn, sql, "23514", "violates check constraint", "job_queue_name");
    }
    harness_query_ll(test->conn, "INSERT INTO outbox.job (queue, payload)"
                                 " VALUES ('Z._:-9' || repeat('a', 194), '{}'), ('q', '{}')"
                                 " RETURNING 0");
    assert_int_equal(harness_query_ll(test->conn, "SELECT count(*) FROM outbox.job"), 2);
    /* the check runs on updates too */
    expect_sql_error(test->conn, "UPDATE outbox.job SET queue = queue || ' '", "23514",
                     "violates check constraint", "job_queue_name");
}

static void
test_row_shape_constraints(void **state)
{
    struct schema_test *test = *state;

    harness_query_ll(test->conn,
                     "SELECT outbox.enqueue('q', '{}', headers => '{\"trace\": \"abc\"}')");

    /* running without an owner and a lease */
    expect_sql_error(test->conn, "UPDATE outbox.job SET state = 'running'", "23514",
                     "violates check constraint", "job_claim_shape");
    expect_sql_error(test->conn,
                     "UPDATE outbox.job SET state = 'running', worker_id = 'w1'", "23514",
                     "violates check constraint", "job_claim_shape");
    /* an owner on a row that is not running */
    expect_sql_error(test->conn,
                     "UPDATE outbox.job SET worker_id = 'w1', lease_until = now()", "23514",
                     "violates check constraint", "job_claim_shape");
    /* final without a finish time, and a finish time on a row that is not final */
    expect_sql_error(test->conn, "UPDATE outbox.job SET state = 'succeeded'", "23514",
                     "violates check constraint", "job_finish_shape");
    expect_sql_error(test->conn, "UPDATE outbox.job SET state = 'dead'", "23514",
                     "violates check constraint", "job_finish_shape");
    expect_sql_error(test->conn, "UPDATE outbox.job SET finished_at = now()", "23514",
                     "violates check constraint", "job_finish_shape");

    /* The shapes the lease protocol writes are accepted. */
    harness_exec(test->conn, "UPDATE outbox.job SET state = 'running', worker_id = 'w1', "
                             "lease_until = now() + interval '1 minute', attempts = attempts + 1");
    harness_exec(test->conn, "UPDATE outbox.job SET state = 'succeeded', worker_id = NULL, "
                             "lease_until = NULL, finished_at = now()");
    assert_int_equal(harness_query_ll(test->conn, "SELECT count(*) FROM outbox.job "
                                                  "WHERE state = 'succeeded' AND attempts = 1"),
                     1);
}

static void
test_claim_uses_ready_index(void **state)
{
    struct schema_test *test = *state;
    PGresult *result;
    int found = 0;

    harness_exec(test->conn,
                 "INSERT INTO outbox.job (queue, payload, run_at) "
                 "SELECT 'q' || (i % 10), jsonb_build_object('i', i), now() - interval '1 hour' "
                 "FROM generate_series(1, 20000) AS i");
    harness_exec(test->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at) "
                             "SELECT 'q' || (i % 10), jsonb_build_object('i', i), 'succeeded', 1, "
                             "now() FROM generate_series(1, 20000) AS i");
    harness_exec(test->conn, "ANALYZE outbox.job");

    result = PQexec(test->conn,
                    "EXPLAIN SELECT job_id FROM outbox.job WHERE state = 'ready' AND NOT held"
                    " AND run_at <= now() "
                    "ORDER BY priority DESC, run_at, job_id LIMIT 10 FOR UPDATE SKIP LOCKED");
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    for (int row = 0; row < PQntuples(result); row++) {
        if (strstr(PQgetvalue(result, row, 0), "job_ready_idx") != NULL)
            found = 1;
    }
    if (!found) {
        for (int row = 0; row < PQntuples(result); row++)
            fprintf(stderr, "  %s\n", PQgetvalue(result, row, 0));
    }
    PQclear(result);
    assert_true(found);
}

/*
 * Autovacuum of outbox.job starts after a fixed number of dead row
 * versions, whatever the table size (migration 007), and runs faster than
 * the server default.
 */
static void
test_autovacuum_follows_the_churn(void **state)
{
    struct schema_test *test = *state;

    assert_int_equal(
        harness_query_ll(test->conn,
                         "SELECT count(*) FROM pg_options_to_table("
                         "  (SELECT reloptions FROM pg_class WHERE oid = 'outbox.job'::regclass))"
                         " WHERE (option_name, option_value) IN ("
                         "   ('autovacuum_vacuum_scale_factor', '0'),"
                         "   ('autovacuum_vacuum_insert_scale_factor', '0'),"
                         "   ('autovacuum_analyze_scale_factor', '0'))"),
        3);
    assert_true(harness_query_ll(test->conn,
                                 "SELECT option_value::int FROM pg_options_to_table("
                                 "  (SELECT reloptions FROM pg_class"
                                 "    WHERE oid = 'outbox.job'::regclass))"
                                 " WHERE option_name = 'autovacuum_vacuum_cost_limit'") >
                harness_query_ll(test->conn, "SELECT setting::int FROM pg_settings"
                                             " WHERE name = 'vacuum_cost_limit'"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_committed_enqueue_is_visible_rolled_back_is_not,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency_key_returns_first_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_input_is_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_infinite_times_are_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_arrays_are_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_name_of_200_characters_is_accepted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_queue_name_check_on_direct_writes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_shape_constraints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_uses_ready_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_autovacuum_follows_the_churn, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
