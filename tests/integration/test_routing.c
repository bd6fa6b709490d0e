/*
 * test_routing.c - a destination per row (exchange, routing key) and the W3C
 * trace context, from the producer's SQL and C calls to what RabbitMQ and
 * Redis consumers receive.
 *
 * Each test has its own database (cloned from the migrated template) and
 * its own exchange, queue and stream names, removed on the way out.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "outbox.h"

#define TRACEPARENT "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#define TRACESTATE "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"

struct fixture {
    char *url;
    PGconn *conn;
    char name[64]; /* unique per test: prefix of its queues, exchanges and streams */
};

static int test_counter;

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    harness_exec(f->conn, "SET client_min_messages = warning");
    snprintf(f->name, sizeof(f->name), "routing-%d-%d", (int)getpid(), test_counter++);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* Runs sql, which must fail with sqlstate and a primary message containing text. */
static void
expect_sql_error(PGconn *conn, const char *sql, const char *sqlstate, const char *text)
{
    PGresult *result = PQexec(conn, sql);
    const char *state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    const char *message = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);

    if (PQresultStatus(result) != PGRES_FATAL_ERROR) {
        PQclear(result);
        fail_msg("expected an error, but this worked: %s", sql);
    }
    if (state == NULL || strcmp(state, sqlstate) != 0 || message == NULL ||
        strstr(message, text) == NULL) {
        fprintf(stderr, "%s\n  got SQLSTATE %s: %s\n", sql, state ? state : "none",
                message ? message : "no message");
        PQclear(result);
        fail_msg("expected SQLSTATE %s containing '%s'", sqlstate, text);
    }
    PQclear(result);
}

/* The first column of the first row of sql as a malloc'd string ("NULL" for NULL). */
static char *
query_text(PGconn *conn, const char *sql)
{
    PGresult *result = PQexec(conn, sql);
    char *text;

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) < 1) {
        fprintf(stderr, "%s: %s\n", sql, PQerrorMessage(conn));
        PQclear(result);
        fail_msg("query failed");
    }
    text = strdup(PQgetisnull(result, 0, 0) ? "NULL" : PQgetvalue(result, 0, 0));
    PQclear(result);
    return text;
}

static void
assert_query_text(PGconn *conn, const char *sql, const char *expected)
{
    char *text = query_text(conn, sql);

    if (strcmp(text, expected) != 0) {
        fprintf(stderr, "%s\n  expected: %s\n  got:      %s\n", sql, expected, text);
        free(text);
        fail_msg("unexpected value");
    }
    free(text);
}

/* ---- the schema ------------------------------------------------------------ */

static void
test_destination_is_stored_and_validated(void **state)
{
    struct fixture *f = *state;
    char sql[1024];

    /* calls written before the new parameters keep working, positionally too */
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q', '{}', NULL, '{}', 0, now(), 10, 'k')");
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q', '{}', exchange => 'events',"
                              " routing_key => 'order.created.eu')");
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q', '{}', NULL, '{}', 0, now(), 10, NULL,"
                              " '', 'order.paid.eu')");
    assert_query_text(f->conn,
                      "SELECT string_agg(coalesce(exchange, '-') || '/' || coalesce(routing_key, '-'),"
                      " ' ' ORDER BY job_id) FROM outbox.job",
                      "-/- events/order.created.eu /order.paid.eu");

    /* 255 bytes is the limit (an AMQP short string), in bytes, not characters */
    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('q', '{}', exchange => repeat('e', 255),"
                               " routing_key => repeat('r', 255))");
    harness_query_ll(f->conn, sql);
    expect_sql_error(f->conn, "SELECT outbox.enqueue('q', '{}', exchange => repeat('e', 256))",
                     "22023", "invalid outbox exchange");
    expect_sql_error(f->conn,
                     "SELECT outbox.enqueue('q', '{}', routing_key => repeat('\xc3\xa9', 128))",
                     "22023", "invalid outbox routing key");
    expect_sql_error(f->conn, "SELECT outbox.enqueue('q', '{}', exchange => E'ev\\nents')", "22023",
                     "invalid outbox exchange");
    expect_sql_error(f->conn, "SELECT outbox.enqueue('q', '{}', routing_key => E'a\\tb')", "22023",
                     "invalid outbox routing key");
    expect_sql_error(f->conn, "SELECT outbox.enqueue('q', '{}', routing_key => E'a\\x7fb')",
                     "22023", "invalid outbox routing key");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 4);

    /* writers that bypass enqueue() meet the table's check, on insert and on update */
    expect_sql_error(f->conn,
                     "INSERT INTO outbox.job (queue, payload, exchange) VALUES ('q', '{}', E'x\\ry')",
                     "23514", "job_destination_valid");
    expect_sql_error(f->conn,
                     "INSERT INTO outbox.job (queue, payload, routing_key)"
                     " VALUES ('q', '{}', repeat('r', 256))",
                     "23514", "job_destination_valid");
    expect_sql_error(f->conn, "UPDATE outbox.job SET routing_key = E'\\x01'", "23514",
                     "job_destination_valid");
}

static void
test_trace_context_from_the_session(void **state)
{
    struct fixture *f = *state;

    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SET LOCAL outbox.traceparent = '" TRACEPARENT "'");
    harness_exec(f->conn, "SET LOCAL outbox.tracestate = '" TRACESTATE "'");
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q', '{}', headers => '{\"a\": \"b\"}')");
    /* the caller's own traceparent wins, and the session's tracestate does not join it */
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q', '{}',"
                              " headers => '{\"traceparent\": \"from-the-caller\"}')");
    harness_exec(f->conn, "COMMIT");
    /* SET LOCAL ended with the transaction */
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q', '{}')");
    /* set_config(..., true) is the same as SET LOCAL */
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SELECT set_config('outbox.traceparent', '" TRACEPARENT "', true)");
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q', '{}')");
    harness_exec(f->conn, "COMMIT");

    assert_query_text(f->conn, "SELECT string_agg(headers::text, ' | ' ORDER BY job_id) FROM outbox.job",
                      "{\"a\": \"b\", \"tracestate\": \"" TRACESTATE "\", \"traceparent\": \""
                      TRACEPARENT "\"} | {\"traceparent\": \"from-the-caller\"} | {} | "
                      "{\"traceparent\": \"" TRACEPARENT "\"}");
}

static void
test_invalid_trace_context_is_rejected(void **state)
{
    struct fixture *f = *state;
    static const char *const refused[] = {
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", /* uppercase */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", /* trace id all zero */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", /* parent id all zero */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* another version */
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  /* short trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", /* flags not hex */
        "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", /* separator */
        "not a traceparent",
    };
    char sql[256];

    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        harness_exec(f->conn, "BEGIN");
        snprintf(sql, sizeof(sql), "SET LOCAL outbox.traceparent = '%s'", refused[i]);
        harness_exec(f->conn, sql);
        expect_sql_error(f->conn, "SELECT outbox.enqueue('q', '{}')", "22023",
                         "invalid traceparent");
        harness_exec(f->conn, "ROLLBACK");
    }
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SET LOCAL outbox.traceparent = '" TRACEPARENT "'");
    harness_exec(f->conn, "SET LOCAL outbox.tracestate = 'Upper=1'");
    expect_sql_error(f->conn, "SELECT outbox.enqueue('q', '{}')", "22023", "invalid tracestate");
    harness_exec(f->conn, "ROLLBACK");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 0);
}

/* ---- the C library ------------------------------------------------------- */

static void
test_library_enqueue_and_claim_carry_destination_and_trace(void **state)
{
    struct fixture *f = *state;
    struct outbox_message routed = {
        .queue = "q", .payload_json = "{}", .exchange = "events",
        .routing_key = "order.created.eu", .traceparent = TRACEPARENT, .tracestate = TRACESTATE};
    struct outbox_message explicit_header = {
        .queue = "q", .payload_json = "{}", .headers_json = "{\"traceparent\": \"mine\"}",
        .traceparent = TRACEPARENT};
    struct outbox_message plain = {.queue = "q", .payload_json = "{}"};
    struct outbox_message bad = {.queue = "q", .payload_json = "{}", .traceparent = "00-zz"};
    struct outbox_error err;
    struct outbox_batch batch;
    outbox_store *store;
    int64_t id;

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue(f->conn, &routed, &id, &err), 0);
    assert_int_equal(outbox_enqueue(f->conn, &explicit_header, &id, &err), 0);
    assert_int_equal(outbox_enqueue(f->conn, &plain, &id, &err), 0);
    harness_exec(f->conn, "COMMIT");

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue(f->conn, &bad, &id, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_string_equal(err.sqlstate, "22023");
    assert_non_null(strstr(err.message, "invalid traceparent"));
    harness_exec(f->conn, "ROLLBACK");

    store = outbox_store_connect(f->url, "worker-routing", &err);
    assert_non_null(store);
    assert_int_equal(outbox_claim(store, NULL, 0, 10, 30, &batch, &err), 0);
    assert_int_equal(batch.count, 3);
    assert_string_equal(batch.jobs[0].exchange, "events");
    assert_string_equal(batch.jobs[0].routing_key, "order.created.eu");
    assert_string_equal(batch.jobs[0].headers, "{\"tracestate\": \"" TRACESTATE
                                               "\", \"traceparent\": \"" TRACEPARENT "\"}");
    assert_null(batch.jobs[1].exchange);
    assert_string_equal(batch.jobs[1].headers, "{\"traceparent\": \"mine\"}");
    assert_null(batch.jobs[2].exchange);
    assert_null(batch.jobs[2].routing_key);
    assert_string_equal(batch.jobs[2].headers, "{}");
    outbox_batch_release_memory(&batch);
    outbox_store_free(store);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_destination_is_stored_and_validated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_context_from_the_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_trace_context_is_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_library_enqueue_and_claim_carry_destination_and_trace,
                                        setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
