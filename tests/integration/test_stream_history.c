/*
 * test_stream_history.c - stream positions and dedup that do not assume one
 * linear history of the database (issue 47, cases 5 and 7):
 *
 * - a PostgreSQL crash that loses asynchronously committed transactions
 *   after the stream published them hands their transaction ids (and job
 *   ids) out again: the next durable rows sit at places the Redis order
 *   record says were appended, and must be published all the same;
 * - a rebase (a promotion: the timeline moved on the same cluster) keeps a
 *   key's commit order for the rows waiting, also when a transaction drew
 *   its job id before another one of its key and committed after it.
 *
 * The crash is one of the stack's PostgreSQL, `pg_ctl stop -m immediate`,
 * with the WAL writer and the background writer stopped (SIGSTOP) and
 * wal_writer_delay 10 s, so the producer's last commits are really lost:
 * the test checks that they are.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "key_inversion.h"
#include "redis_consumer.h"
#include "relay_runner.h"

static int
setup(void **state)
{
    struct fixture_redis *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    fixture_redis_open(f, "stream-history", "ev");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture_redis *f = *state;
    PGconn *admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));

    harness_exec(admin, "ALTER SYSTEM RESET wal_writer_delay");
    harness_exec(admin, "SELECT pg_reload_conf()");
    PQfinish(admin);
    fixture_redis_close(f);
    free(f);
    return 0;
}

/* How many entries of the stream have a payload holding text. */
static long long
entries_with(struct fixture_redis *f, const char *text)
{
    struct stream_consumer_stream stream = {0};
    long long count = 0;

    if (stream_consumer_read_stream(f->redis, f->stream, &stream) != 0)
        return 0;
    for (size_t i = 0; i < stream.count; i++)
        count += stream.entries[i].payload != NULL && strstr(stream.entries[i].payload, text) != NULL;
    stream_consumer_stream_clear(&stream);
    return count;
}

/* Waits up to timeout_ms for count entries holding text; returns how many there are. */
static long long
wait_for_entries(struct fixture_redis *f, const char *text, long long count, int timeout_ms)
{
    long long seen = 0;

    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        seen = entries_with(f, text);
        if (seen >= count)
            break;
        usleep(100 * 1000);
    }
    return seen;
}

/* Ten transactions of one row each, committed as conn's session commits. */
static void
enqueue_ten(PGconn *conn, const char *marker)
{
    char sql[256];

    for (int i = 1; i <= 10; i++) {
        snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('ev', '{\"%s\": %d}')", marker, i);
        harness_exec(conn, sql);
    }
}

/*
 * Stops (SIGSTOP) the stack's WAL writer and background writer: with them,
 * and no synchronous commit, nothing flushes the WAL of an asynchronous
 * commit until the crash. The crash kills them (SIGKILL after SIGQUIT).
 */
static void
hold_wal_flushes(PGconn *admin)
{
    PGresult *r = PQexec(admin, "SELECT pid FROM pg_stat_activity"
                                " WHERE backend_type IN ('walwriter', 'background writer')");

    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 2);
    for (int i = 0; i < PQntuples(r); i++)
        assert_int_equal(kill((pid_t)atoi(PQgetvalue(r, i, 0)), SIGSTOP), 0);
    PQclear(r);
}

/* The stack's PostgreSQL crashes (stop -m immediate) and starts again; f->conn reconnects. */
static void
crash_postgres(struct fixture_redis *f)
{
    PQfinish(f->conn);
    f->conn = NULL;
    assert_int_equal(harness_stack("kill-service", "postgres"), 0);
    assert_int_equal(harness_stack("start-service", "postgres"), 0);
    f->conn = harness_connect(f->url);
}

/*
 * Case 5: ten rows committed with synchronous_commit = off are published,
 * then a crash loses them (checked); the ten rows enqueued next take their
 * transaction ids again, and all ten reach the stream.
 */
static void
test_rows_after_a_crash_that_lost_commits_are_published(void **state)
{
    struct fixture_redis *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--poll-interval", "50ms", NULL};
    struct relay_process relay;
    PGconn *producer, *admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));
    long long after;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(admin, "ALTER SYSTEM SET wal_writer_delay = '10s'");
    harness_exec(admin, "SELECT pg_reload_conf()");
    harness_exec(admin, "CHECKPOINT");
    relay_start_process(&relay, f->url, f->broker, extra);
    usleep(500 * 1000);
    hold_wal_flushes(admin);
    PQfinish(admin);
    producer = harness_connect(f->url);
    harness_exec(producer, "SET synchronous_commit = off");
    enqueue_ten(producer, "lost");
    PQfinish(producer);
    if (wait_for_entries(f, "\"lost\"", 10, 20000) != 10) {
        relay_dump_log(&relay);
        fail_msg("the relay did not publish the ten rows before the crash");
    }
    relay_signal(&relay, SIGKILL); /* no write of its own flushes the WAL now */
    relay_wait(&relay, 10000);
    unlink(relay.log_path);
    crash_postgres(f);
    /* the crash lost them: they are no rows of the database any more */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE payload ? 'lost'"),
                     0);

    enqueue_ten(f->conn, "after");
    relay_start_process(&relay, f->url, f->broker, extra);
    after = wait_for_entries(f, "\"after\"", 10, 20000);
    if (after != 10) {
        relay_dump_log(&relay);
        fail_msg("%lld of the 10 rows committed after the crash reached the stream", after);
    }
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    /* said once, as a warning */
    {
        char *log = fixture_read_file(relay.log_path);
        const char *said = strstr(log, "stream order record of another database history dropped");

        assert_non_null(said);
        assert_null(strstr(said + 1, "stream order record of another database history dropped"));
        free(log);
    }
    unlink(relay.log_path);
}

/*
 * Case 7, a promotion: five keys get rows committed as 1, 3, 2 (job ids 1,
 * 2, 3 in their draw order) while no relay runs; the timeline moves on (as
 * a promotion moves it), the relay rebases every partition and must publish
 * each key as 1, 3, 2.
 */
static void
test_key_order_is_kept_across_a_rebase(void **state)
{
    struct fixture_redis *f = *state;
    const char *keys[] = {"a", "b", "c", "d", "e"};
    const char *extra[] = {"--once", "--stream-prefix", f->prefix, NULL};

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    key_inversion_install(f->conn);
    for (size_t k = 0; k < 5; k++)
        key_inversion_make(f->conn, f->url, keys[k]);
    /* what identity_observe() finds after a promotion: the timeline moved on */
    harness_exec(f->conn, "UPDATE outbox.identity SET timeline = timeline - 1");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT epoch FROM outbox.identity"), 2);
    key_inversion_assert_kept(f->redis, f->stream, keys, 5, "132");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_key_order_is_kept_across_a_rebase, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_after_a_crash_that_lost_commits_are_published,
                                        setup, teardown),
    };

    return cmocka_run_group_tests_name("stream_history", tests, NULL, NULL);
}
