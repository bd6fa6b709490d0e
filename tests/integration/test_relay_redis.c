/*
 * test_relay_redis.c - outbox-relay publishing to a real Redis.
 *
 * Each test has its own database (cloned from the migrated template) and
 * its own stream prefix, so tests never see each other's entries. What
 * every broker must do (rollback, a bad row, a broker restart or outage,
 * kill -9, SIGTERM) runs from test_relay_brokers.c; here is what only
 * Redis does: the entry's fields, dedup of re-driven rows, BUSY, long
 * stream names, cleanup under --once, --check.
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

#include "fixtures.h"
#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"

static int
setup(void **state)
{
    struct fixture_redis *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    fixture_redis_open(f, "relay-test", "orders");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    fixture_redis_close(*state);
    free(*state);
    return 0;
}

static int
compare_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* Checks that the stream holds every row of queue 'orders' exactly once, and nothing else. */
static void
assert_each_row_once(struct fixture_redis *f, long long expected)
{
    struct stream_consumer_stream stream;
    PGresult *rows;
    int64_t *ids;

    rows = PQexec(f->conn, "SELECT job_id FROM outbox.job WHERE queue = 'orders' ORDER BY 1");
    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(rows), expected);
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    assert_int_equal((long long)stream.count, expected);
    ids = calloc(stream.count + 1, sizeof(*ids));
    for (size_t i = 0; i < stream.count; i++)
        ids[i] = stream.entries[i].job_id;
    qsort(ids, stream.count, sizeof(*ids), compare_id);
    for (size_t i = 0; i < stream.count; i++) {
        if (i > 0 && ids[i] == ids[i - 1])
            fail_msg("job %lld appended twice", (long long)ids[i]);
        if (ids[i] != strtoll(PQgetvalue(rows, (int)i, 0), NULL, 10))
            fail_msg("stream and table differ at job %lld", (long long)ids[i]);
    }
    free(ids);
    PQclear(rows);
    stream_consumer_stream_clear(&stream);
}

static void
test_fields(void **state)
{
    struct fixture_redis *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    struct stream_consumer_stream stream;
    long long id;

    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{\"order\": 1}', NULL,"
                          " '{\"trace\": \"t-1\"}')");
    harness_exec(f->conn, "COMMIT");
    id = harness_query_ll(f->conn, "SELECT job_id FROM outbox.job");

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);

    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    assert_int_equal(stream.count, 1);
    assert_int_equal(stream.entries[0].job_id, id);
    assert_string_equal(stream.entries[0].queue, "orders");
    assert_string_equal(stream.entries[0].payload, "{\"order\": 1}");
    assert_string_equal(stream.entries[0].headers, "{\"trace\": \"t-1\"}");
    assert_int_equal(stream.entries[0].attempt, 1);
    assert_int_equal(stream.entries[0].field_count, 6);
    stream_consumer_stream_clear(&stream);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     1);
}

static void
test_redriven_rows_are_not_appended_twice(void **state)
{
    struct fixture_redis *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};

    enqueue_rows(f->conn, "orders", 3000);
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_each_row_once(f, 3000);

    /* as if a relay had appended and died before marking: rows ready again */
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', finished_at = NULL");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 2"),
                     3000);
    assert_each_row_once(f, 3000);
}

/*
 * Redis refusing whole script calls (BUSY while another script runs) is no
 * row's fault either: rows published into it go back without spending their
 * attempt and are published once the server answers again.
 */
static void
test_busy_redis_costs_no_attempt(void **state)
{
    static const char busy_script[] =
        "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2]"
        " repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > 2500000"
        " return 1";
    struct fixture_redis *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--poll-interval", "20ms", NULL};
    struct relay_process relay;
    redisContext *busy_client;
    redisReply *reply;
    bool busy = false;
    int done = 0;
    long long left;

    relay_start_process(&relay, f->url, f->broker, extra);
    /* connected and idle: a first row goes through */
    harness_query_ll(f->conn, "SELECT outbox.enqueue('orders', '{}')");
    assert_int_equal(wait_for_value(f->conn, "SELECT count(*) FROM outbox.job"
                                             " WHERE state = 'succeeded'",
                                    1, 20000),
                     1);
    freeReplyObject(redisCommand(f->redis, "CONFIG SET busy-reply-threshold 100"));
    busy_client = stream_consumer_connect(f->broker);
    assert_non_null(busy_client);
    redisAppendCommand(busy_client, "EVAL %s 0", busy_script);
    while (!done)
        assert_int_equal(redisBufferWrite(busy_client, &done), REDIS_OK);
    /* wait until the server answers BUSY (the script ran past the threshold), at most 2 s */
    for (int i = 0; i < 40 && !busy; i++) {
        reply = redisCommand(f->redis, "PING");
        busy = reply != NULL && reply->type == REDIS_REPLY_ERROR &&
               strncmp(reply->str, "BUSY", 4) == 0;
        freeReplyObject(reply);
        if (!busy)
            usleep(50 * 1000);
    }
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " max_attempts => 1)) FROM generate_series(1, 50) AS g");
    left = wait_for_value(f->conn,
                          "SELECT count(*) FROM outbox.job WHERE state NOT IN ('succeeded', 'dead')",
                          0, 30000);
    if (redisGetReply(busy_client, (void **)&reply) == REDIS_OK)
        freeReplyObject(reply);
    redisFree(busy_client);
    freeReplyObject(redisCommand(f->redis, "CONFIG SET busy-reply-threshold 5000"));
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_true(busy);
    assert_int_equal(left, 0);
    if (harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'dead'") != 0) {
        relay_dump_log(&relay);
        fail_msg("rows died of a busy server");
    }
    unlink(relay.log_path);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 1"),
                     51);
    assert_each_row_once(f, 51);
}

/* A queue name of 200 characters is a stream of its own, like any other. */
static void
test_long_queue_is_its_own_stream(void **state)
{
    struct fixture_redis *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    char long_queue[201], sql[512], stream[300];

    memset(long_queue, 'q', 200);
    long_queue[200] = '\0';
    enqueue_rows(f->conn, "orders", 10);
    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s', '{\"long\": true}')", long_queue);
    harness_exec(f->conn, sql);

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     11);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 10);
    snprintf(stream, sizeof(stream), "%s%s", f->prefix, long_queue);
    assert_int_equal(stream_consumer_stream_length(f->redis, stream), 1);
}

/*
 * Cleanup keeps up: --once deletes every succeeded row past --retention,
 * however many (here more than the old 100 000 a minute), in short batches,
 * and keeps the ones within it; the rows it publishes meanwhile are fine.
 */
static void
test_once_cleans_up_everything_past_retention(void **state)
{
    struct fixture_redis *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--retention", "1h", NULL};

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'old', '{}', 'succeeded', now() - interval '2 hours'"
                          " FROM generate_series(1, 130000);"
                          "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'old', '{}', 'succeeded', now() - interval '10 minutes'"
                          " FROM generate_series(1, 10)");
    enqueue_rows(f->conn, "orders", 3);
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE finished_at < now() - interval '1 hour'"),
                     0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'old'"),
                     10);
    assert_each_row_once(f, 3);
}

static void
test_check_reports_bad_credentials(void **state)
{
    struct fixture_redis *f = *state;
    char output[4096], bad[512];
    const char *argv[] = {"--database-url", f->url, "--broker", bad, "--check", NULL};
    const char *at = strchr(f->broker, '@');

    snprintf(bad, sizeof(bad), "redis://:wrong-hunter2%s", at);
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "outbox-relay:"));
    assert_null(strstr(output, "hunter2"));

    argv[3] = f->broker;
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    assert_non_null(strstr(output, "configuration OK"));

    snprintf(bad, sizeof(bad), "%.*s/99999", (int)(strrchr(f->broker, '/') - f->broker),
             f->broker);
    argv[3] = bad;
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    assert_null(strstr(output, "outbox-test-secret"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redriven_rows_are_not_appended_twice, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_busy_redis_costs_no_attempt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_queue_is_its_own_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_once_cleans_up_everything_past_retention, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_check_reports_bad_credentials, setup, teardown),
    };

    return cmocka_run_group_tests_name("relay_redis", tests, NULL, NULL);
}
