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

#include "amqp_consumer.h"
#include "fixtures.h"
#include "harness.h"
#include "outbox.h"
#include "redis_consumer.h"
#include "relay_runner.h"

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

static void
test_batch_carries_destination_and_trace(void **state)
{
    struct fixture *f = *state;

    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SET LOCAL outbox.traceparent = '" TRACEPARENT "'");
    harness_exec(f->conn, "SET LOCAL outbox.tracestate = '" TRACESTATE "'");
    harness_query_ll(f->conn, "SELECT cardinality(outbox.enqueue_batch('q', '{1,2}',"
                              " headers => '{\"a\": \"b\"}', exchange => 'events',"
                              " routing_key => 'order.created.eu'))");
    harness_query_ll(f->conn, "SELECT cardinality(outbox.enqueue_batch('q', '{3}', '{k}',"
                              " headers => '{\"traceparent\": \"from-the-caller\"}'))");
    harness_exec(f->conn, "COMMIT");
    harness_query_ll(f->conn, "SELECT cardinality(outbox.enqueue_batch('q', '{4}'))");

    assert_query_text(f->conn,
                      "SELECT string_agg(payload::text || ' ' || headers::text || ' '"
                      " || coalesce(exchange, '-') || ' ' || coalesce(routing_key, '-'), ' | '"
                      " ORDER BY job_id) FROM outbox.job",
                      "1 {\"a\": \"b\", \"tracestate\": \"" TRACESTATE "\", \"traceparent\": \""
                      TRACEPARENT "\"} events order.created.eu | "
                      "2 {\"a\": \"b\", \"tracestate\": \"" TRACESTATE "\", \"traceparent\": \""
                      TRACEPARENT "\"} events order.created.eu | "
                      "3 {\"traceparent\": \"from-the-caller\"} - - | 4 {} - -");

    expect_sql_error(f->conn, "SELECT outbox.enqueue_batch('q', '{1}', exchange => E'ex\\x01')",
                     "22023", "invalid outbox exchange");
    expect_sql_error(f->conn,
                     "SELECT outbox.enqueue_batch('q', '{1}', routing_key => repeat('r', 256))",
                     "22023", "invalid outbox routing key");
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SET LOCAL outbox.traceparent = 'not a traceparent'");
    expect_sql_error(f->conn, "SELECT outbox.enqueue_batch('q', '{1}')", "22023",
                     "invalid traceparent");
    harness_exec(f->conn, "ROLLBACK");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 4);
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

/* ---- outboxctl --------------------------------------------------------------- */

static void
test_outboxctl_enqueue_routes(void **state)
{
    struct fixture *f = *state;
    const char *routed[] = {"--database-url", f->url, "enqueue", "--queue", "orders",
                            "--payload", "{}", "--exchange", "events", "--routing-key",
                            "order.created.eu", NULL};
    const char *bad[] = {"--database-url", f->url, "enqueue", "--queue", "orders",
                         "--payload", "{}", "--routing-key", "order\ncreated", NULL};
    char output[4096];

    assert_int_equal(fixture_run_outboxctl(routed, output, sizeof(output)), 0);
    assert_query_text(f->conn, "SELECT exchange || ' ' || routing_key FROM outbox.job",
                      "events order.created.eu");
    /* bad input: one clear line, exit 1, nothing written */
    assert_int_equal(fixture_run_outboxctl(bad, output, sizeof(output)), 1);
    if (strstr(output, "invalid outbox routing key \"order\\ncreated\"") == NULL ||
        strchr(output, '\n') != strrchr(output, '\n')) {
        fprintf(stderr, "%s", output);
        fail_msg("expected one line naming the invalid routing key");
    }
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 1);
}

/* ---- RabbitMQ ------------------------------------------------------------- */

/* One message an AMQP queue received. */
struct received_message {
    long long job_id;
    char routing_key[64];
    char exchange[96];
    char traceparent[64];
};

/* What one AMQP queue received, in arrival order. */
struct received {
    struct received_message messages[64];
    size_t count;
};

/* Drains queue (auto-ack) into *got; fails the test past 64 messages. */
static void
drain_queue(queue_consumer *mq, const char *queue, struct received *got)
{
    struct queue_consumer_message messages[16];
    size_t fetched;

    memset(got, 0, sizeof(*got));
    do {
        assert_int_equal(queue_consumer_fetch(mq, queue, messages, 16, 1000, &fetched), 0);
        for (size_t i = 0; i < fetched; i++) {
            const struct queue_consumer_header *trace =
                queue_consumer_message_header(&messages[i], "traceparent");
            struct received_message *m;

            assert_true(got->count < 64);
            m = &got->messages[got->count];
            m->job_id = messages[i].job_id;
            snprintf(m->routing_key, sizeof(m->routing_key), "%s",
                     messages[i].routing_key ? messages[i].routing_key : "");
            snprintf(m->exchange, sizeof(m->exchange), "%s",
                     messages[i].exchange ? messages[i].exchange : "");
            snprintf(m->traceparent, sizeof(m->traceparent), "%s",
                     trace != NULL && trace->text != NULL ? trace->text : "");
            got->count++;
            queue_consumer_message_clear(&messages[i]);
        }
    } while (fetched > 0);
}

static int
compare_received(const void *a, const void *b)
{
    const struct received_message *x = a, *y = b;

    return (x->job_id > y->job_id) - (x->job_id < y->job_id);
}

/*
 * Puts what a queue received in job id order: rows without a common
 * ordering key may arrive in any order (two pipelines publish at once).
 */
static void
sort_received(struct received *got)
{
    qsort(got->messages, got->count, sizeof(got->messages[0]), compare_received);
}

/* The job ids got holds, as "1 3 4" in arrival order. */
static const char *
received_ids(const struct received *got, char *text, size_t size)
{
    size_t used = 0;

    text[0] = '\0';
    for (size_t i = 0; i < got->count && used < size; i++)
        used += (size_t)snprintf(text + used, size - used, i ? " %lld" : "%lld",
                                 got->messages[i].job_id);
    return text;
}

/* Enqueues one committed row with the given SQL arguments after queue and payload. */
static long long
enqueue_sql(struct fixture *f, const char *queue, const char *more)
{
    char sql[512];

    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s', '{}'%s%s)", queue, more[0] ? ", " : "",
             more);
    return harness_query_ll(f->conn, sql);
}

static void
test_topic_exchange_routes_each_row_by_its_key(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_AMQP_URL");
    queue_consumer *mq = queue_consumer_connect(broker);
    char topic[96], direct[96], eu[96], created[96], plain[96], more[256], want[128], text[512];
    const char *extra[] = {"--exchange", direct, NULL};
    long long created_eu, paid_eu, created_us, by_queue;
    struct received got;

    assert_non_null(mq);
    snprintf(topic, sizeof(topic), "%s.events", f->name);
    snprintf(direct, sizeof(direct), "%s.direct", f->name);
    snprintf(eu, sizeof(eu), "%s.eu", f->name);
    snprintf(created, sizeof(created), "%s.created", f->name);
    snprintf(plain, sizeof(plain), "%s.plain", f->name);
    assert_int_equal(queue_consumer_declare_exchange(mq, topic, "topic"), 0);
    assert_int_equal(queue_consumer_declare_exchange(mq, direct, "direct"), 0);
    assert_int_equal(queue_consumer_declare_queue(mq, eu), 0);
    assert_int_equal(queue_consumer_declare_queue(mq, created), 0);
    assert_int_equal(queue_consumer_declare_queue(mq, plain), 0);
    assert_int_equal(queue_consumer_bind(mq, eu, topic, "order.*.eu"), 0);
    assert_int_equal(queue_consumer_bind(mq, created, topic, "order.created.*"), 0);
    assert_int_equal(queue_consumer_bind(mq, plain, direct, plain), 0);

    /* one relay with --exchange direct: rows naming the topic exchange go there instead */
    snprintf(more, sizeof(more), "exchange => '%s', routing_key => 'order.created.eu'", topic);
    created_eu = enqueue_sql(f, "orders", more);
    snprintf(more, sizeof(more), "exchange => '%s', routing_key => 'order.paid.eu'", topic);
    paid_eu = enqueue_sql(f, "orders", more);
    snprintf(more, sizeof(more), "exchange => '%s', routing_key => 'order.created.us'", topic);
    created_us = enqueue_sql(f, "orders", more);
    by_queue = enqueue_sql(f, plain, "");
    assert_int_equal(relay_run_once(f->url, broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 1"),
                     4);

    drain_queue(mq, eu, &got);
    sort_received(&got);
    snprintf(want, sizeof(want), "%lld %lld", created_eu, paid_eu);
    assert_string_equal(received_ids(&got, text, sizeof(text)), want);
    assert_string_equal(got.messages[0].exchange, topic);
    assert_string_equal(got.messages[0].routing_key, "order.created.eu");
    assert_string_equal(got.messages[1].routing_key, "order.paid.eu");
    drain_queue(mq, created, &got);
    sort_received(&got);
    snprintf(want, sizeof(want), "%lld %lld", created_eu, created_us);
    assert_string_equal(received_ids(&got, text, sizeof(text)), want);
    assert_string_equal(got.messages[1].routing_key, "order.created.us");
    /* a row without a routing key still goes by its queue name, to --exchange */
    drain_queue(mq, plain, &got);
    snprintf(want, sizeof(want), "%lld", by_queue);
    assert_string_equal(received_ids(&got, text, sizeof(text)), want);
    assert_string_equal(got.messages[0].exchange, direct);
    assert_string_equal(got.messages[0].routing_key, plain);

    queue_consumer_delete_queue(mq, eu);
    queue_consumer_delete_queue(mq, created);
    queue_consumer_delete_queue(mq, plain);
    queue_consumer_delete_exchange(mq, topic);
    queue_consumer_delete_exchange(mq, direct);
    queue_consumer_free(mq);
}

static void
test_missing_exchange_fails_only_its_row(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_AMQP_URL");
    queue_consumer *mq = queue_consumer_connect(broker);
    const char *argv[] = {"--database-url", f->url, "--broker", broker, "--once",
                          "--metrics-addr", "off", NULL};
    char queue[96], more[256], want[128], text[512], log[8192];
    long long ids[4], missing;
    struct received got;

    assert_non_null(mq);
    snprintf(queue, sizeof(queue), "%s.q", f->name);
    assert_int_equal(queue_consumer_declare_queue(mq, queue), 0);
    snprintf(more, sizeof(more), "exchange => '%s.nowhere', max_attempts => 1", f->name);
    /* one batch: the bad row sits between good ones; it carries a trace */
    ids[0] = enqueue_sql(f, queue, "");
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SET LOCAL outbox.traceparent = '" TRACEPARENT "'");
    missing = enqueue_sql(f, queue, more);
    harness_exec(f->conn, "COMMIT");
    ids[1] = enqueue_sql(f, queue, "");
    ids[2] = enqueue_sql(f, queue, "");
    assert_int_equal(relay_run_capture(argv, log, sizeof(log)), 0);
    /* the relay's line about the row names its trace */
    snprintf(text, sizeof(text), "job_id=%lld trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"",
             missing);
    if (strstr(log, "row is dead") == NULL || strstr(log, text) == NULL) {
        fprintf(stderr, "%s", log);
        fail_msg("no 'row is dead' line with '%s'", text);
    }

    snprintf(text, sizeof(text),
             "SELECT count(*) FROM outbox.job WHERE job_id = %lld AND state = 'dead'"
             " AND last_error LIKE '%%404 NOT_FOUND - no exchange ''%s.nowhere''%%'",
             missing, f->name);
    assert_int_equal(harness_query_ll(f->conn, text), 1);
    /* the others were published in the same run, on their first attempt */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 1"),
                     3);
    drain_queue(mq, queue, &got);
    sort_received(&got);
    snprintf(want, sizeof(want), "%lld %lld %lld", ids[0], ids[1], ids[2]);
    assert_string_equal(received_ids(&got, text, sizeof(text)), want);
    queue_consumer_delete_queue(mq, queue);
    queue_consumer_free(mq);
}

/*
 * Runs the README's example (a row to a named topic exchange, then one to
 * the default exchange, or the other way round) with one pipeline, so both
 * rows are one batch: every row reaches its queue on its first attempt.
 * The default exchange is addressed as NULL (the relay's --exchange, ""),
 * as '' explicitly, or both, so a batch mixes all three.
 */
static void
run_named_and_default_exchange(struct fixture *f, bool default_first)
{
    const char *broker = harness_env("OUTBOX_TEST_AMQP_URL");
    queue_consumer *mq = queue_consumer_connect(broker);
    const char *extra[] = {"--concurrency", "1", NULL};
    char events[96], eu[96], billing[96], refunds[96], more[256], want[128], text[512];
    long long created = 0, invoice = 0, refund = 0;
    struct received got;

    assert_non_null(mq);
    snprintf(events, sizeof(events), "%s.events", f->name);
    snprintf(eu, sizeof(eu), "%s.eu-orders", f->name);
    snprintf(billing, sizeof(billing), "%s.billing", f->name);
    snprintf(refunds, sizeof(refunds), "%s.refunds", f->name);
    assert_int_equal(queue_consumer_declare_exchange(mq, events, "topic"), 0);
    assert_int_equal(queue_consumer_declare_queue(mq, eu), 0);
    assert_int_equal(queue_consumer_declare_queue(mq, billing), 0);
    assert_int_equal(queue_consumer_declare_queue(mq, refunds), 0);
    assert_int_equal(queue_consumer_bind(mq, eu, events, "order.*.eu"), 0);

    snprintf(more, sizeof(more),
             "exchange => '%s', routing_key => 'order.created.eu', max_attempts => 1", events);
    if (default_first) {
        invoice = enqueue_sql(f, billing, "max_attempts => 1");
        refund = enqueue_sql(f, refunds, "exchange => '', max_attempts => 1");
    }
    created = enqueue_sql(f, "orders", more);
    if (!default_first) {
        invoice = enqueue_sql(f, billing, "max_attempts => 1");
        refund = enqueue_sql(f, refunds, "exchange => '', max_attempts => 1");
    }
    assert_int_equal(relay_run_once(f->url, broker, extra), 0);
    if (harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                  " WHERE state = 'succeeded' AND attempts = 1") != 3) {
        PGresult *rows = PQexec(f->conn, "SELECT job_id, state, last_error FROM outbox.job");

        for (int i = 0; i < PQntuples(rows); i++)
            fprintf(stderr, "job %s %s: %s\n", PQgetvalue(rows, i, 0), PQgetvalue(rows, i, 1),
                    PQgetvalue(rows, i, 2));
        PQclear(rows);
        fail_msg("a row to the default exchange did not succeed on its first attempt");
    }

    drain_queue(mq, eu, &got);
    snprintf(want, sizeof(want), "%lld", created);
    assert_string_equal(received_ids(&got, text, sizeof(text)), want);
    assert_string_equal(got.messages[0].exchange, events);
    drain_queue(mq, billing, &got);
    snprintf(want, sizeof(want), "%lld", invoice);
    assert_string_equal(received_ids(&got, text, sizeof(text)), want);
    assert_string_equal(got.messages[0].exchange, "");
    drain_queue(mq, refunds, &got);
    snprintf(want, sizeof(want), "%lld", refund);
    assert_string_equal(received_ids(&got, text, sizeof(text)), want);
    assert_string_equal(got.messages[0].exchange, "");

    queue_consumer_delete_queue(mq, eu);
    queue_consumer_delete_queue(mq, billing);
    queue_consumer_delete_queue(mq, refunds);
    queue_consumer_delete_exchange(mq, events);
    queue_consumer_free(mq);
}

static void
test_default_exchange_after_a_named_one(void **state)
{
    run_named_and_default_exchange(*state, false);
}

static void
test_default_exchange_before_a_named_one(void **state)
{
    run_named_and_default_exchange(*state, true);
}

static void
test_ordering_key_holds_across_routing_keys(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_AMQP_URL");
    queue_consumer *mq = queue_consumer_connect(broker);
    const char *extra[] = {"--batch-size", "3", "--concurrency", "2", NULL};
    char topic[96], queue[96], more[256];
    struct received got;
    long long last_of_key[2] = {0, 0};

    assert_non_null(mq);
    snprintf(topic, sizeof(topic), "%s.events", f->name);
    snprintf(queue, sizeof(queue), "%s.all", f->name);
    assert_int_equal(queue_consumer_declare_exchange(mq, topic, "topic"), 0);
    assert_int_equal(queue_consumer_declare_queue(mq, queue), 0);
    assert_int_equal(queue_consumer_bind(mq, queue, topic, "order.#"), 0);
    /* two keys, each row of a key with another routing key than the one before */
    for (int i = 0; i < 24; i++) {
        snprintf(more, sizeof(more),
                 "ordering_key => 'k%d', exchange => '%s', routing_key => 'order.%s.%d'", i % 2,
                 topic, i % 4 < 2 ? "created" : "paid", i);
        enqueue_sql(f, "orders", more);
    }
    assert_int_equal(relay_run_once(f->url, broker, extra), 0);
    drain_queue(mq, queue, &got);
    assert_int_equal(got.count, 24);
    for (size_t i = 0; i < got.count; i++) {
        char sql[128];
        int key;

        snprintf(sql, sizeof(sql),
                 "SELECT right(ordering_key, 1)::int FROM outbox.job WHERE job_id = %lld",
                 got.messages[i].job_id);
        key = (int)harness_query_ll(f->conn, sql);
        if (got.messages[i].job_id < last_of_key[key])
            fail_msg("job %lld of key k%d arrived after job %lld", got.messages[i].job_id, key,
                     last_of_key[key]);
        last_of_key[key] = got.messages[i].job_id;
    }
    queue_consumer_delete_queue(mq, queue);
    queue_consumer_delete_exchange(mq, topic);
    queue_consumer_free(mq);
}

/* ---- Redis ------------------------------------------------------------------ */

static void
test_redis_stream_per_routing_key_with_dedup(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    redisContext *redis = stream_consumer_connect(broker);
    char prefix[96], stream[160], more[64];
    const char *extra[] = {"--stream-prefix", prefix, NULL};
    struct stream_consumer_stream entries;

    assert_non_null(redis);
    snprintf(prefix, sizeof(prefix), "%s:", f->name);
    snprintf(more, sizeof(more), "routing_key => 'order.created.eu'");
    enqueue_sql(f, "orders", more);
    enqueue_sql(f, "orders", more);
    enqueue_sql(f, "orders", "routing_key => 'order.paid.eu'");
    enqueue_sql(f, "orders", "");
    assert_int_equal(relay_run_once(f->url, broker, extra), 0);

    snprintf(stream, sizeof(stream), "%sorder.created.eu", prefix);
    assert_int_equal(stream_consumer_read_stream(redis, stream, &entries), 0);
    assert_int_equal(entries.count, 2);
    assert_string_equal(entries.entries[0].queue, "orders");
    stream_consumer_stream_clear(&entries);
    snprintf(stream, sizeof(stream), "%sorder.paid.eu", prefix);
    assert_int_equal(stream_consumer_stream_length(redis, stream), 1);
    /* without a routing key: prefix + queue, as before */
    snprintf(stream, sizeof(stream), "%sorders", prefix);
    assert_int_equal(stream_consumer_stream_length(redis, stream), 1);

    /* a row published again (say its relay died before marking it) is not appended twice */
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', finished_at = NULL");
    assert_int_equal(relay_run_once(f->url, broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 2"),
                     4);
    snprintf(stream, sizeof(stream), "%sorder.created.eu", prefix);
    assert_int_equal(stream_consumer_stream_length(redis, stream), 2);
    snprintf(stream, sizeof(stream), "%sorder.paid.eu", prefix);
    assert_int_equal(stream_consumer_stream_length(redis, stream), 1);
    assert_true(stream_consumer_delete_prefix(redis, prefix) > 0);
    redisFree(redis);
}

/* ---- trace context at the brokers ------------------------------------------ */

static void
test_trace_context_reaches_both_brokers(void **state)
{
    struct fixture *f = *state;
    const char *amqp = harness_env("OUTBOX_TEST_AMQP_URL");
    const char *redis_url = harness_env("OUTBOX_TEST_REDIS_URL");
    queue_consumer *mq = queue_consumer_connect(amqp);
    redisContext *redis = stream_consumer_connect(redis_url);
    char queue[96], prefix[96], stream[256], sql[256];
    const char *extra[] = {"--stream-prefix", prefix, NULL};
    struct queue_consumer_message message;
    const struct queue_consumer_header *header;
    struct stream_consumer_stream entries;
    size_t fetched;

    assert_non_null(mq);
    assert_non_null(redis);
    snprintf(queue, sizeof(queue), "%s.traced", f->name);
    snprintf(prefix, sizeof(prefix), "%s:", f->name);
    assert_int_equal(queue_consumer_declare_queue(mq, queue), 0);

    /* the business transaction links its trace with one SET LOCAL */
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SET LOCAL outbox.traceparent = '" TRACEPARENT "'");
    harness_exec(f->conn, "SET LOCAL outbox.tracestate = '" TRACESTATE "'");
    enqueue_sql(f, queue, "");
    harness_exec(f->conn, "COMMIT");
    assert_int_equal(relay_run_once(f->url, amqp, NULL), 0);
    assert_int_equal(queue_consumer_fetch(mq, queue, &message, 1, 2000, &fetched), 0);
    assert_int_equal(fetched, 1);
    header = queue_consumer_message_header(&message, "traceparent");
    assert_non_null(header);
    assert_string_equal(header->text, TRACEPARENT);
    header = queue_consumer_message_header(&message, "tracestate");
    assert_non_null(header);
    assert_string_equal(header->text, TRACESTATE);
    queue_consumer_message_clear(&message);

    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SET LOCAL outbox.traceparent = '" TRACEPARENT "'");
    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s.stream', '{}')", f->name);
    harness_query_ll(f->conn, sql);
    harness_exec(f->conn, "COMMIT");
    assert_int_equal(relay_run_once(f->url, redis_url, extra), 0);
    snprintf(stream, sizeof(stream), "%s%s.stream", prefix, f->name);
    assert_int_equal(stream_consumer_read_stream(redis, stream, &entries), 0);
    assert_int_equal(entries.count, 1);
    assert_string_equal(entries.entries[0].headers, "{\"traceparent\": \"" TRACEPARENT "\"}");
    stream_consumer_stream_clear(&entries);

    stream_consumer_delete_prefix(redis, prefix);
    redisFree(redis);
    queue_consumer_delete_queue(mq, queue);
    queue_consumer_free(mq);
}

static void
test_library_enqueue_many_carries_destination_and_trace(void **state)
{
    struct fixture *f = *state;
    struct outbox_message messages[4] = {
        {.queue = "q", .payload_json = "1", .exchange = "events", .routing_key = "a",
         .traceparent = TRACEPARENT, .tracestate = TRACESTATE},
        {.queue = "q", .payload_json = "2", .exchange = "events", .routing_key = "a",
         .traceparent = TRACEPARENT, .tracestate = TRACESTATE},
        {.queue = "q", .payload_json = "3", .routing_key = "b"},
        {.queue = "q", .payload_json = "4"},
    };
    struct outbox_message bad = {.queue = "q", .payload_json = "{}", .traceparent = "00-zz"};
    struct outbox_error err;
    int64_t ids[4];

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue_many(f->conn, messages, 4, ids, &err), 0);
    harness_exec(f->conn, "COMMIT");
    assert_true(ids[0] < ids[1] && ids[1] < ids[2] && ids[2] < ids[3]);
    assert_query_text(f->conn,
                      "SELECT string_agg(payload::text || ' ' || headers::text || ' '"
                      " || coalesce(exchange, '-') || ' ' || coalesce(routing_key, '-'), ' | '"
                      " ORDER BY job_id) FROM outbox.job",
                      "1 {\"tracestate\": \"" TRACESTATE "\", \"traceparent\": \"" TRACEPARENT
                      "\"} events a | 2 {\"tracestate\": \"" TRACESTATE "\", \"traceparent\": \""
                      TRACEPARENT "\"} events a | 3 {} - b | 4 {} - -");

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue_many(f->conn, &bad, 1, ids, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_string_equal(err.sqlstate, "22023");
    assert_non_null(strstr(err.message, "invalid traceparent"));
    harness_exec(f->conn, "ROLLBACK");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_destination_is_stored_and_validated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_context_from_the_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_trace_context_is_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_carries_destination_and_trace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_library_enqueue_and_claim_carry_destination_and_trace,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_outboxctl_enqueue_routes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_topic_exchange_routes_each_row_by_its_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_missing_exchange_fails_only_its_row, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_exchange_after_a_named_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_exchange_before_a_named_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordering_key_holds_across_routing_keys, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_redis_stream_per_routing_key_with_dedup, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_trace_context_reaches_both_brokers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_library_enqueue_many_carries_destination_and_trace,
                                        setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
