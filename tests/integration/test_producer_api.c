/*
 * test_producer_api.c - liboutbox's producer and consumer calls given odd
 * arguments and connections in odd states, as an application may.
 *
 * A NULL out-parameter is either allowed (the job id nobody wants) or a
 * clear OUTBOX_ERR_INVALID, never a crash; a connection in pipeline mode or
 * with the caller's own query in flight is an OUTBOX_ERR_STATE that says so
 * and that outbox_error_is_transient() does not call worth retrying; the
 * caller's queue name never puts a control character in a message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "harness.h"
#include "outbox.h"

/* A fresh database and a connection to it (fixtures.h). */
#define fixture fixture_database
#define setup fixture_database_setup
#define teardown fixture_database_teardown

/* Fails unless text is one line of printable characters. */
static void
assert_one_clean_line(const char *text)
{
    for (const char *c = text; *c != '\0'; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            fail_msg("control character 0x%02x at %zu in: %s", (unsigned char)*c,
                     (size_t)(c - text), text);
}

/* The job id nobody asked for is not stored; the row goes in all the same. */
static void
test_enqueue_without_a_place_for_the_id(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "q", .payload_json = "{}"};
    struct outbox_message many[3] = {message, message, message};
    struct outbox_error err;

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue(f->conn, &message, NULL, &err), 0);
    assert_int_equal(outbox_enqueue_many(f->conn, many, 3, NULL, &err), 0);
    harness_exec(f->conn, "COMMIT");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 4);
    /* no error struct either: the call still fails cleanly */
    assert_int_equal(outbox_enqueue(f->conn, &message, NULL, NULL), -1);
    assert_false(outbox_error_is_transient(NULL));
}

/* An inbox accept with nowhere to put its answer is refused, not a crash. */
static void
test_inbox_accept_without_a_place_for_the_answer(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_inbox_accept(f->conn, "x", "1", NULL, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_non_null(strstr(err.message, "accepted is NULL"));
    assert_int_equal(outbox_inbox_accept_in_order(f->conn, "x", "1", "k", NULL, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    harness_exec(f->conn, "COMMIT");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.inbox"), 0);
}

/*
 * In pipeline mode the synchronous call cannot run: a state error naming
 * pipeline mode, not a transient "connection" error a caller would retry
 * for ever.
 */
static void
test_pipeline_mode_is_the_callers_state(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "q", .payload_json = "{}"};
    struct outbox_error err;
    bool accepted;
    int64_t id;

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(PQenterPipelineMode(f->conn), 1);
    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_STATE);
    assert_false(outbox_error_is_transient(&err));
    assert_non_null(strstr(err.message, "pipeline mode"));
    assert_int_equal(outbox_enqueue_many(f->conn, &message, 1, &id, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_STATE);
    assert_int_equal(outbox_inbox_accept(f->conn, "x", "1", &accepted, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_STATE);
    assert_int_equal(PQexitPipelineMode(f->conn), 1);
    harness_exec(f->conn, "ROLLBACK");
}

/*
 * With the caller's own asynchronous query in flight inside BEGIN, the
 * message says a command is in progress, not that no transaction is open.
 */
static void
test_query_in_flight_is_named(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "q", .payload_json = "{}"};
    struct outbox_error err;
    PGresult *result;
    int64_t id;

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(PQsendQuery(f->conn, "SELECT pg_sleep(0.2)"), 1);
    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_STATE);
    if (strstr(err.message, "in progress") == NULL || strstr(err.message, "no open transaction"))
        fail_msg("the message does not say a command is in progress: %s", err.message);
    while ((result = PQgetResult(f->conn)) != NULL)
        PQclear(result);
    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), 0);
    harness_exec(f->conn, "COMMIT");
}

/* A queue name with a newline, a carriage return and an escape sequence gives one clean line. */
static void
test_queue_name_cannot_break_the_message(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "bad\nqueue\r\x1b[31m", .payload_json = "{}"};
    struct outbox_error err;
    int64_t id;

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    print_message("%s\n", err.message);
    assert_one_clean_line(err.message);
    assert_non_null(strstr(err.message, "'bad?queue??[31m'"));
    harness_exec(f->conn, "ROLLBACK");
    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue_many(f->conn, &message, 1, &id, &err), -1);
    assert_one_clean_line(err.message);
    harness_exec(f->conn, "ROLLBACK");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_enqueue_without_a_place_for_the_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inbox_accept_without_a_place_for_the_answer, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_mode_is_the_callers_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_query_in_flight_is_named, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_name_cannot_break_the_message, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
