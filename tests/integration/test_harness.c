/*
 * test_harness.c - the integration helpers themselves: other tests rely on them to
 * report a child's exit, to stop a hung one, and to restart a server.
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

/* Returns the malloc'd contents of path (empty when it does not exist). */
static char *
read_file(const char *path)
{
    FILE *file = fopen(path, "r");
    char *text = calloc(1, 4096);
    size_t length;

    assert_non_null(text);
    if (file == NULL)
        return text;
    length = fread(text, 1, 4095, file);
    text[length] = '\0';
    fclose(file);
    return text;
}

static void
test_spawn_reports_exit_status_and_logs_output(void **state)
{
    const char *const argv[] = {"/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3",
                                NULL};
    char *log = harness_log_path("test_harness_spawn");
    char *text;

    (void)state;
    remove(log);
    assert_int_equal(harness_wait_exit(harness_spawn(argv, log), 30000), 3);
    text = read_file(log);
    assert_non_null(strstr(text, "to-stdout"));
    assert_non_null(strstr(text, "to-stderr"));
    free(text);
    free(log);
}

static void
test_wait_exit_kills_a_hung_child(void **state)
{
    const char *const argv[] = {"/bin/sleep", "60", NULL};
    char *log = harness_log_path("test_harness_hung");

    (void)state;
    assert_int_equal(harness_wait_exit(harness_spawn(argv, log), 200), -1);
    free(log);
}

static void
test_template_has_schema_and_empty_database_has_none(void **state)
{
    char *url = harness_database_new();
    char *empty_url = harness_database_new_empty();
    PGconn *conn = harness_connect(url);
    PGconn *empty = harness_connect(empty_url);

    (void)state;
    assert_true(harness_query_ll(conn, "SELECT count(*) FROM outbox.schema_migrations") >= 1);
    assert_int_equal(harness_query_ll(conn, "SELECT min(version) FROM outbox.schema_migrations"),
                     1);
    assert_int_equal(harness_query_ll(empty, "SELECT count(*) FROM pg_namespace "
                                             "WHERE nspname = 'outbox'"),
                     0);
    /* A session still open does not keep its database from being dropped. */
    harness_database_drop(url);
    harness_database_drop(empty_url);
    PQfinish(conn);
    PQfinish(empty);
}

static void
test_stack_restarts_postgres(void **state)
{
    char *url = harness_database_new();
    PGconn *conn = harness_connect(url);
    PGresult *result;

    (void)state;
    assert_int_equal(harness_stack("restart-service", "postgres"), 0);
    /* The old session is gone; a new one works on the same port and data. */
    result = PQexec(conn, "SELECT 1");
    assert_int_not_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    PQclear(result);
    PQfinish(conn);
    conn = harness_connect(url);
    assert_int_equal(harness_query_ll(conn, "SELECT count(*) FROM outbox.job"), 0);
    PQfinish(conn);
    harness_database_drop(url);
    assert_int_not_equal(harness_stack("restart-service", "no-such-server"), 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spawn_reports_exit_status_and_logs_output),
        cmocka_unit_test(test_wait_exit_kills_a_hung_child),
        cmocka_unit_test(test_template_has_schema_and_empty_database_has_none),
        cmocka_unit_test(test_stack_restarts_postgres),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
