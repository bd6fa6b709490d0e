/*
 * test_relay_amqp.c - outbox-relay publishing to a real RabbitMQ.
 *
 * Each test has its own database and its own queue names, so tests never
 * see each other's messages. What every broker must do (rollback, a bad
 * row, a broker restart or outage, kill -9, SIGTERM) runs from
 * test_relay_brokers.c; here is what only AMQP does: message properties,
 * unroutable messages and missing exchanges, the broker's own size limit,
 * a row that breaks the connection, endpoint lists, --check.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amqp_consumer.h"
#include "harness.h"
#include "relay_runner.h"

struct fixture {
    char *url;
    PGconn *conn;
    queue_consumer *mq;
    const char *broker;
    char queue[64]; /* this test's queue: the rows' queue and the AMQP queue */
};

static int test_counter;

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->broker = harness_env("OUTBOX_TEST_AMQP_URL");
    f->mq = queue_consumer_connect(f->broker);
    assert_non_null(f->mq);
    snprintf(f->queue, sizeof(f->queue), "relay-test-%d-%d", (int)getpid(), test_counter++);
    assert_int_equal(queue_consumer_declare_queue(f->mq, f->queue), 0);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    queue_consumer_delete_queue(f->mq, f->queue);
    queue_consumer_free(f->mq);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

static int
compare_id(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;

    return (x > y) - (x < y);
}

/*
 * Drains the queue and checks that every row of the test's queue arrived
 * at least once and nothing else did. Returns the number of duplicates.
 */
static size_t
assert_every_row_delivered(struct fixture *f, long long expected)
{
    struct queue_consumer_message messages[500];
    long long *ids = NULL;
    size_t count = 0, capacity = 0, fetched, unique = 0;
    char sql[256];
    PGresult *rows;

    do {
        assert_int_equal(queue_consumer_fetch(f->mq, f->queue, messages, 500, 1000, &fetched), 0);
        for (size_t i = 0; i < fetched; i++) {
            if (count == capacity) {
                capacity = capacity ? capacity * 2 : 1024;
                ids = realloc(ids, capacity * sizeof(*ids));
            }
            assert_non_null(messages[i].message_id);
            ids[count++] = messages[i].job_id;
            queue_consumer_message_clear(&messages[i]);
        }
    } while (fetched > 0);

    snprintf(sql, sizeof(sql), "SELECT job_id FROM outbox.job WHERE queue = '%s' ORDER BY 1",
             f->queue);
    rows = PQexec(f->conn, sql);
    assert_int_equal(PQntuples(rows), expected);
    qsort(ids, count, sizeof(*ids), compare_id);
    for (size_t i = 0; i < count; i++) {
        if (i > 0 && ids[i] == ids[i - 1])
            continue;
        if ((long long)unique >= expected ||
            ids[i] != strtoll(PQgetvalue(rows, (int)unique, 0), NULL, 10))
            fail_msg("message %lld is not a committed row, or a row is missing", ids[i]);
        unique++;
    }
    assert_int_equal((long long)unique, expected);
    PQclear(rows);
    free(ids);
    return count - unique;
}

/* Enqueues count committed rows into the test's queue. */
static void
enqueue(struct fixture *f, int count)
{
    enqueue_rows(f->conn, f->queue, count);
}

static long long
count_where(struct fixture *f, const char *condition)
{
    char sql[512];

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM outbox.job WHERE %s", condition);
    return harness_query_ll(f->conn, sql);
}

static void
test_properties(void **state)
{
    struct fixture *f = *state;
    struct queue_consumer_message message;
    const struct queue_consumer_header *header;
    char sql[512];
    size_t fetched;
    long long id, created;

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue('%s', '{\"order\": 1842}', NULL, '{\"trace\": \"t-1\"}')",
             f->queue);
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, sql);
    harness_exec(f->conn, "COMMIT");
    id = harness_query_ll(f->conn, "SELECT job_id FROM outbox.job");
    created = harness_query_ll(f->conn, "SELECT extract(epoch FROM created_at)::bigint"
                                        " FROM outbox.job");

    assert_int_equal(relay_run_once(f->url, f->broker, NULL), 0);

    assert_int_equal(queue_consumer_fetch(f->mq, f->queue, &message, 1, 2000, &fetched), 0);
    assert_int_equal(fetched, 1);
    assert_int_equal(message.job_id, id);
    {
        /* the id consumers deduplicate on: unique across databases and their histories */
        char expected[96];

        harness_message_id(f->conn, id, 0, expected, sizeof(expected));
        assert_non_null(strchr(expected, ':')); /* a new database takes the new form */
        assert_string_equal(message.message_id, expected);
    }
    assert_string_equal(message.routing_key, f->queue);
    assert_string_equal(message.content_type, "application/json");
    assert_string_equal(message.type, f->queue);
    assert_int_equal(message.delivery_mode, 2);
    assert_true(message.has_timestamp);
    assert_true((long long)message.timestamp == created ||
                (long long)message.timestamp == created - 1);
    assert_int_equal(message.body_len, strlen("{\"order\": 1842}"));
    assert_memory_equal(message.body, "{\"order\": 1842}", message.body_len);
    header = queue_consumer_message_header(&message, "trace");
    assert_non_null(header);
    assert_string_equal(header->text, "t-1");
    header = queue_consumer_message_header(&message, "x-outbox-attempt");
    assert_non_null(header);
    assert_true(header->is_int);
    assert_int_equal(header->int_value, 1);
    queue_consumer_message_clear(&message);
    assert_int_equal(count_where(f, "state = 'succeeded'"), 1);
}

static void
test_unroutable_ends_dead_with_reason(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--retry-base", "0s", "--retry-max", "0s", NULL};

    harness_exec(f->conn, "SELECT outbox.enqueue('nowhere.bound', '{}', max_attempts => 3)");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(count_where(f, "state = 'dead' AND attempts = 3"
                                    " AND last_error LIKE 'unroutable%NO_ROUTE%'"),
                     1);
}

static void
test_missing_exchange_does_not_stop_the_relay(void **state)
{
    struct fixture *f = *state;
    char exchange[96], sql[256];
    const char *extra[] = {"--exchange", exchange, "--retry-base", "0s", "--retry-max", "1s",
                           "--poll-interval", "20ms", NULL};
    struct relay_process relay;

    snprintf(exchange, sizeof(exchange), "%s.events", f->queue);
    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', '{}', max_attempts => 1000))"
             " FROM generate_series(1, 5)",
             f->queue);
    harness_query_ll(f->conn, sql);
    relay_start_process(&relay, f->url, f->broker, extra);
    assert_true(wait_for_value(f->conn,
                               "SELECT (count(*) > 0)::int FROM outbox.job"
                               " WHERE last_error LIKE '%404%NOT_FOUND%'",
                               1, 20000) == 1);
    assert_int_equal(kill(relay.pid, 0), 0); /* still running */

    assert_int_equal(queue_consumer_declare_exchange(f->mq, exchange, "direct"), 0);
    assert_int_equal(queue_consumer_bind(f->mq, f->queue, exchange, f->queue), 0);
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'",
                                    5, 30000),
                     5);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
    assert_int_equal(assert_every_row_delivered(f, 5), 0);
    queue_consumer_delete_exchange(f->mq, exchange);
}

static void
test_two_relays_share_the_work(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--batch-size", "100", NULL};
    struct relay_process first, second;

    enqueue(f, 20000);
    relay_start_process(&first, f->url, f->broker, extra);
    relay_start_process(&second, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'",
                                    0, 60000),
                     0);
    relay_signal(&first, SIGTERM);
    relay_signal(&second, SIGTERM);
    assert_int_equal(relay_wait(&first, 15000), 0);
    assert_int_equal(relay_wait(&second, 15000), 0);
    unlink(first.log_path);
    unlink(second.log_path);
    /* every row claimed once: no relay ever took or marked another's row */
    assert_int_equal(count_where(f, "attempts <> 1"), 0);
    assert_int_equal(assert_every_row_delivered(f, 20000), 0);
}

/*
 * The broker's own size limit (max_message_size 1 MiB on the suite's
 * RabbitMQ), which the relay is not told about: a 2 MiB row makes RabbitMQ
 * close the channel. Only that row pays for it, dead with the broker's text;
 * its 200 batch-mates, with a single attempt each, are all published.
 */
static void
test_broker_size_limit_kills_only_the_big_row(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--batch-size", "500", NULL};
    char sql[512];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g), max_attempts => 1))"
             " FROM generate_series(1, 100) AS g",
             f->queue);
    harness_query_ll(f->conn, sql);
    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue('%s', jsonb_build_object('pad', repeat('x', 2 * 1024 * 1024)),"
             " max_attempts => 1)",
             f->queue);
    harness_exec(f->conn, sql);
    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g), max_attempts => 1))"
             " FROM generate_series(101, 200) AS g",
             f->queue);
    harness_query_ll(f->conn, sql);

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(count_where(f, "state = 'succeeded' AND attempts = 1"), 200);
    assert_int_equal(count_where(f, "state = 'dead' AND attempts = 1 AND last_error LIKE"
                                    " '%PRECONDITION_FAILED%larger than configured max size%'"),
                     1);
    harness_exec(f->conn, "DELETE FROM outbox.job WHERE state = 'dead'");
    assert_every_row_delivered(f, 200);
}

/*
 * A message that breaks the whole connection, not only the channel: an
 * unroutable one with an empty header name. RabbitMQ returns it
 * (basic.return with its header table) and the client library cannot decode
 * the table it gets back, so the connection is lost (RabbitMQ 3.10 answers
 * the header tables tried on publish, such as a CC header that is not an
 * array, by closing the channel only). Every row of the batch is deferred at
 * no cost each time; after two such batches the relay publishes in halves
 * until the row is alone, and only that row pays: dead after its single
 * attempt, its 199 batch-mates published.
 */
static void
test_connection_breaking_row_dies_alone(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--batch-size", "100", "--concurrency", "1", NULL};
    char sql[512];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g), max_attempts => 1,"
             " headers => CASE WHEN g = 37 THEN '{\"\": \"x\"}'::jsonb ELSE '{}' END,"
             " routing_key => CASE WHEN g = 37 THEN 'no-such-queue' END))"
             " FROM generate_series(1, 200) AS g",
             f->queue);
    harness_query_ll(f->conn, sql);
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(count_where(f, "state = 'dead' AND attempts = 1 AND last_error LIKE"
                                    " '%connection broke on this message alone%'"
                                    " AND headers ? ''"),
                     1);
    assert_int_equal(count_where(f, "state = 'succeeded' AND attempts = 1"), 199);
    harness_exec(f->conn, "DELETE FROM outbox.job WHERE state = 'dead'");
    assert_every_row_delivered(f, 199);
}

static void
test_check(void **state)
{
    struct fixture *f = *state;
    char output[4096], bad[512];
    const char *argv[] = {"--database-url", f->url, "--broker", f->broker, "--check", NULL};
    const char *at = strchr(f->broker, '@');

    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    assert_non_null(strstr(output, "configuration OK"));

    snprintf(bad, sizeof(bad), "amqp://guest:wrong-hunter2%s", at);
    argv[3] = bad;
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "ACCESS_REFUSED"));
    assert_null(strstr(output, "hunter2"));

    argv[3] = "amqp://guest:guest@127.0.0.1:1/";
    argv[4] = "--check";
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);

    argv[3] = "amqp://guest:guest@127.0.0.1:99999/";
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 2);
    assert_non_null(strstr(output, "--broker"));
}

/*
 * A broker URL listing two closed ports around the real node: --check names
 * the endpoints it skipped and still says configuration OK; the relay finds
 * the node that answers whichever endpoint it starts from, and says which.
 */
static void
test_endpoint_list_skips_dead_endpoints(void **state)
{
    struct fixture *f = *state;
    char output[8192], list[512], dead[512], expected[128];
    const char *port = harness_env("OUTBOX_TEST_AMQP_PORT");
    int closed1 = harness_closed_port(), closed2 = harness_closed_port();
    const char *argv[] = {"--database-url", f->url, "--broker", list, "--check", NULL};

    snprintf(list, sizeof(list), "amqp://guest:guest@127.0.0.1:%d,127.0.0.1:%s,127.0.0.1:%d/",
             closed1, port, closed2);
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    assert_non_null(strstr(output, "configuration OK"));
    snprintf(expected, sizeof(expected), "broker endpoint 127.0.0.1:%s: reachable", port);
    assert_non_null(strstr(output, expected));
    snprintf(expected, sizeof(expected), "broker endpoint 127.0.0.1:%d: skipped", closed1);
    assert_non_null(strstr(output, expected));
    snprintf(expected, sizeof(expected), "broker endpoint 127.0.0.1:%d: skipped", closed2);
    assert_non_null(strstr(output, expected));

    /* the start is random: a few runs start on each endpoint and all deliver */
    for (int run = 0; run < 4; run++) {
        const char *once[] = {"--database-url", f->url, "--broker", list, "--once",
                              "--metrics-addr", "off", NULL};

        enqueue(f, 20);
        assert_int_equal(relay_run_capture(once, output, sizeof(output)), 0);
        snprintf(expected, sizeof(expected), "endpoint=127.0.0.1:%s", port);
        if (strstr(output, "broker connected") == NULL || strstr(output, expected) == NULL)
            fail_msg("the relay did not log the endpoint it connected to:\n%s", output);
        assert_int_equal(count_where(f, "state <> 'succeeded'"), 0);
    }
    assert_int_equal(assert_every_row_delivered(f, 80), 0);

    /* none answers: exit 1, and the message says how many were tried without the password */
    snprintf(dead, sizeof(dead), "amqp://guest:hunter2@127.0.0.1:%d,127.0.0.1:%d/", closed1,
             closed2);
    argv[3] = dead;
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "(2 tried)"));
    assert_null(strstr(output, "hunter2"));

    /* a login refused by the node that answers is a configuration error, not a skip */
    snprintf(dead, sizeof(dead), "amqp://guest:hunter2@127.0.0.1:%d,127.0.0.1:%s/", closed1,
             port);
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "ACCESS_REFUSED"));
    assert_null(strstr(output, "configuration OK"));
    assert_null(strstr(output, "hunter2"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_properties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unroutable_ends_dead_with_reason, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_exchange_does_not_stop_the_relay, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_two_relays_share_the_work, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broker_size_limit_kills_only_the_big_row, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_connection_breaking_row_dies_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_list_skips_dead_endpoints, setup, teardown),
    };

    return cmocka_run_group_tests_name("relay_amqp", tests, NULL, NULL);
}
