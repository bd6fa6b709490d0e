/*
 * test_relay_notices.c - what PostgreSQL says outside a query result (a
 * WARNING raised by a user's trigger on outbox.job, the FATAL a server sends
 * to idle sessions when it shuts down) reaches the relay's log as a log
 * event, never as a raw line on stderr that breaks --log-format json.
 *
 * Found by the chaos run: every PostgreSQL restart left
 * "FATAL:  terminating connection due to administrator command" lines in
 * the relay's output, written by libpq's default notice processor.
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
#include "redis_consumer.h"
#include "relay_runner.h"

static void
test_server_notices_are_log_events(void **state)
{
    char *url = harness_database_new();
    PGconn *conn = harness_connect(url);
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char prefix[64], output[16384];
    const char *argv[] = {"--database-url", url,   "--broker",     broker, "--once",
                          "--metrics-addr", "off", "--log-format", "json", "--stream-prefix",
                          prefix,           NULL};
    redisContext *redis;
    bool seen = false;

    (void)state;
    snprintf(prefix, sizeof(prefix), "notices-%d:", (int)getpid());
    harness_exec(conn, "CREATE FUNCTION warn_on_update() RETURNS trigger LANGUAGE plpgsql AS $$"
                       " BEGIN RAISE WARNING 'user trigger saw job %', NEW.job_id;"
                       " RETURN NEW; END $$;"
                       "CREATE TRIGGER warn_on_update BEFORE UPDATE ON outbox.job"
                       " FOR EACH ROW EXECUTE FUNCTION warn_on_update()");
    enqueue_rows(conn, "orders", 1);

    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    for (char *line = strtok(output, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (line[0] != '{')
            fail_msg("a line of the relay's output is not a json log event: %s", line);
        if (strstr(line, "user trigger saw job") != NULL)
            seen = true;
    }
    assert_true(seen);
    assert_int_equal(harness_query_ll(conn, "SELECT count(*) FROM outbox.job"
                                            " WHERE state = 'succeeded'"),
                     1);

    redis = stream_consumer_connect(broker);
    assert_non_null(redis);
    stream_consumer_delete_prefix(redis, prefix);
    redisFree(redis);
    PQfinish(conn);
    harness_database_drop(url);
}

/*
 * The same on the stream threads' connections: a user's trigger on the
 * stream cursors warns at every lease taken and cursor moved.
 */
static void
test_stream_notices_are_log_events(void **state)
{
    char *url = harness_database_new();
    PGconn *conn = harness_connect(url);
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char prefix[64], output[16384];
    const char *argv[] = {"--database-url", url,   "--broker",     broker, "--once",
                          "--metrics-addr", "off", "--log-format", "json", "--stream-prefix",
                          prefix,           NULL};
    redisContext *redis;
    bool seen = false;

    (void)state;
    snprintf(prefix, sizeof(prefix), "stream-notices-%d:", (int)getpid());
    harness_exec(conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(conn, "CREATE FUNCTION warn_on_cursor() RETURNS trigger LANGUAGE plpgsql AS $$"
                       " BEGIN RAISE WARNING 'user trigger saw cursor %', NEW.partition;"
                       " RETURN NEW; END $$;"
                       "CREATE TRIGGER warn_on_cursor BEFORE UPDATE ON outbox.stream_cursor"
                       " FOR EACH ROW EXECUTE FUNCTION warn_on_cursor()");
    enqueue_rows(conn, "ev", 1);

    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    for (char *line = strtok(output, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (line[0] != '{')
            fail_msg("a line of the relay's output is not a json log event: %s", line);
        if (strstr(line, "user trigger saw cursor") != NULL && strstr(line, "stream") != NULL)
            seen = true;
    }
    assert_true(seen);

    redis = stream_consumer_connect(broker);
    assert_non_null(redis);
    stream_consumer_delete_prefix(redis, prefix);
    redisFree(redis);
    PQfinish(conn);
    harness_database_drop(url);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_notices_are_log_events),
        cmocka_unit_test(test_stream_notices_are_log_events),
    };

    return cmocka_run_group_tests_name("relay_notices", tests, NULL, NULL);
}
