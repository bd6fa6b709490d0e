/*
 * test_stream.c - stream queues (sql/009_stream.sql, relay/stream.c) against real Redis.
 *
 * Each test has its own database and stream prefix. What a user relies
 * on: every committed row of a stream queue reaches the broker, whatever
 * order the producers' transactions committed in, whoever owned the
 * partition when; rows of one ordering key arrive in order; a row the
 * broker refuses leaves the stream without stopping it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"

/* A test's database, Redis and key prefix; stream is the prefix + "ev". */
#define fixture fixture_redis

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    fixture_redis_open(f, "stream-test", "ev");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    fixture_redis_close(f);
    free(f);
    return 0;
}

/* Waits until the Redis stream holds at least want entries; the last length seen. */
static long long
wait_for_entries(struct fixture *f, long long want, int timeout_ms)
{
    long long length = 0;

    for (int waited = 0; waited <= timeout_ms; waited += 50) {
        length = stream_consumer_stream_length(f->redis, f->stream);
        if (length >= want)
            break;
        usleep(50 * 1000);
    }
    return length;
}

/*
 * Checks that every row of queue 'ev' in state 'stream' is in the Redis
 * stream at least once, and returns how many entries were duplicates.
 */
static long long
assert_every_row_published(struct fixture *f)
{
    struct stream_consumer_stream stream;
    PGresult *rows = PQexec(f->conn, "SELECT max(job_id) FROM outbox.job");
    long long max_id = strtoll(PQgetvalue(rows, 0, 0), NULL, 10), duplicates = 0;
    unsigned char *seen = calloc((size_t)max_id + 1, 1);

    PQclear(rows);
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    for (size_t i = 0; i < stream.count; i++) {
        int64_t id = stream.entries[i].job_id;

        assert_true(id >= 1 && id <= max_id);
        if (seen[id])
            duplicates++;
        seen[id] = 1;
    }
    rows = PQexec(f->conn, "SELECT job_id FROM outbox.job WHERE queue = 'ev' AND state = 'stream'");
    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    for (int r = 0; r < PQntuples(rows); r++) {
        long long id = strtoll(PQgetvalue(rows, r, 0), NULL, 10);

        if (!seen[id])
            fail_msg("committed stream row %lld was never published", id);
    }
    PQclear(rows);
    free(seen);
    stream_consumer_stream_clear(&stream);
    return duplicates;
}

/* The value of counter name{..., queue="ev", ...} in a scrape, -1 when absent. */
static double
queue_counter(const char *text, const char *name)
{
    size_t name_len = strlen(name);

    for (const char *line = text; line != NULL && *line != '\0';) {
        const char *end = strchr(line, '\n');
        const char *brace = strchr(line, '}');

        if (strncmp(line, name, name_len) == 0 && line[name_len] == '{' && brace != NULL &&
            (end == NULL || brace < end)) {
            const char *label = strstr(line, "queue=\"ev\"");

            if (label != NULL && label < brace)
                return strtod(brace + 1, NULL);
        }
        line = end != NULL ? end + 1 : NULL;
    }
    return -1;
}

/* Rows after every cursor of queue 'ev' (0 once the stream is drained). */
static const char SQL_UNPUBLISHED[] =
    "SELECT count(*) FROM outbox.job AS j JOIN outbox.stream_cursor AS c"
    " ON c.queue = j.queue AND c.partition = j.stream_partition"
    " WHERE j.state = 'stream' AND j.queue = 'ev' AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)";

/*
 * Transaction A inserts first and commits last. While A is open the
 * stream waits (B's row is not published ahead: that would move the
 * cursor past A's place), the lag and A itself show in the log; once A
 * commits both rows are published, A's first.
 */
static void
test_out_of_order_commit_is_not_skipped(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--horizon-warning", "1s", NULL};
    PGconn *a = harness_connect(f->url);
    struct relay_process relay;
    struct stream_consumer_stream stream;
    long long a_id, b_id;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(a, "SET application_name = 'slow-producer'");
    harness_exec(a, "BEGIN");
    a_id = harness_query_ll(a, "SELECT outbox.enqueue('ev', '{\"from\": \"a\"}')");
    b_id = harness_query_ll(f->conn, "SELECT outbox.enqueue('ev', '{\"from\": \"b\"}')");
    assert_true(a_id < b_id);

    relay_start_process(&relay, f->url, f->broker, extra);
    /* the stream waits for A: nothing is published in the meantime */
    assert_int_equal(wait_for_entries(f, 1, 3000), 0);
    {
        bool shown = false;

        for (int i = 0; i < 150 && !shown; i++) {
            shown = relay_log_find(&relay, 0, false,
                                   (const char *const[]){"holds the stream horizon",
                                                         "slow-producer", NULL},
                                   NULL, 0) > 0;
            if (!shown)
                usleep(100 * 1000);
        }
        if (!shown)
            relay_dump_log(&relay);
        assert_true(shown);
    }
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 0);
    harness_exec(a, "COMMIT");

    assert_int_equal(wait_for_entries(f, 2, 15000), 2);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    assert_int_equal((long long)stream.count, 2);
    assert_int_equal(stream.entries[0].job_id, a_id);
    assert_int_equal(stream.entries[1].job_id, b_id);
    stream_consumer_stream_clear(&stream);
    /* no row was written on publish: both are still stream rows, behind the cursor */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'stream' AND attempts = 0"),
                     2);
    assert_int_equal(harness_query_ll(f->conn, SQL_UNPUBLISHED), 0);
    PQfinish(a);
}

/*
 * The owner is killed (-9) while publishing; once its lease ends another
 * relay takes the partitions over from their cursors: every committed row
 * is published, the only duplicates are the batch that was in flight.
 */
static void
test_kill_owner_mid_batch(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--batch-size", "50", NULL};
    struct relay_process first, second;
    long long duplicates;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->conn, "SELECT outbox.enqueue_batch('ev', array_agg(jsonb_build_object('n', g)))"
                          " FROM generate_series(1, 20000) AS g");

    relay_start_process(&first, f->url, f->broker, extra);
    assert_true(wait_for_entries(f, 500, 30000) >= 500);
    relay_signal(&first, SIGKILL);
    relay_wait(&first, 10000);
    assert_true(stream_consumer_stream_length(f->redis, f->stream) < 20000);
    /* rows committed after the kill are published too */
    harness_exec(f->conn, "SELECT outbox.enqueue_batch('ev', array_agg(jsonb_build_object('m', g)))"
                          " FROM generate_series(1, 1000) AS g");

    relay_start_process(&second, f->url, f->broker, extra);
    if (wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 60000) != 0)
        relay_dump_log(&second);
    assert_int_equal(wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 1000), 0);
    relay_signal(&second, SIGTERM);
    assert_int_equal(relay_wait(&second, 15000), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.stream_cursor"
                                               " WHERE owner IS NOT NULL"),
                     0);
    duplicates = assert_every_row_published(f);
    /* at most the batches in flight in the two partitions */
    assert_true(duplicates <= 2 * 50);
}

/* Producers committing rows of 20 keys while 3 relays share 4 partitions. */
static void
test_key_order_across_relays(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--batch-size", "20", NULL};
    struct relay_process relays[3];
    struct stream_consumer_stream stream;
    long long last[20] = {0};

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 4)");
    for (int i = 0; i < 3; i++)
        relay_start_process(&relays[i], f->url, f->broker, extra);
    for (int round = 0; round < 20; round++) {
        harness_exec(f->conn, "SELECT outbox.enqueue_batch('ev',"
                              " array_agg(jsonb_build_object('n', g) ORDER BY g), NULL,"
                              " array_agg('key-' || (g % 20) ORDER BY g))"
                              " FROM generate_series(1, 100) AS g");
        usleep(20 * 1000);
    }
    assert_int_equal(wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 60000), 0);
    for (int i = 0; i < 3; i++) {
        relay_signal(&relays[i], SIGTERM);
        assert_int_equal(relay_wait(&relays[i], 15000), 0);
    }
    assert_int_equal(assert_every_row_published(f), 0);
    /* per key, job ids arrive rising (the producer inserted each key's rows in that order) */
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    for (size_t i = 0; i < stream.count; i++) {
        char sql[128];
        long long key;

        snprintf(sql, sizeof(sql),
                 "SELECT substr(ordering_key, 5)::int FROM outbox.job WHERE job_id = %lld",
                 (long long)stream.entries[i].job_id);
        key = harness_query_ll(f->conn, sql);
        if (stream.entries[i].job_id <= last[key])
            fail_msg("key-%lld: job %lld arrived after job %lld", key,
                     (long long)stream.entries[i].job_id, last[key]);
        last[key] = stream.entries[i].job_id;
    }
    stream_consumer_stream_clear(&stream);
}

/* Relays holding a live lease on a partition of 'ev', and the most partitions one holds. */
static const char SQL_OWNERS[] =
    "SELECT count(DISTINCT owner) FROM outbox.stream_cursor"
    " WHERE queue = 'ev' AND lease_until > clock_timestamp()";
static const char SQL_MOST_HELD[] =
    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM outbox.stream_cursor"
    " WHERE queue = 'ev' AND lease_until > clock_timestamp() GROUP BY owner) AS o";
static const char SQL_HELD[] =
    "SELECT count(*) FROM outbox.stream_cursor WHERE queue = 'ev' AND lease_until > clock_timestamp()";

/*
 * A relay started after another took every partition gets its share: the
 * first gives partitions back between batches and the second takes them;
 * when the second stops, the first takes them again. No row is lost or
 * published twice on the way.
 */
static void
test_partitions_spread_to_a_later_relay(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--lease", "6", NULL};
    struct relay_process first, second;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 4)");
    relay_start_process(&first, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn, SQL_MOST_HELD, 4, 20000), 4);
    harness_exec(f->conn, "SELECT outbox.enqueue_batch('ev', array_agg(jsonb_build_object('n', g)))"
                          " FROM generate_series(1, 200) AS g");

    relay_start_process(&second, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn, SQL_OWNERS, 2, 30000), 2);
    assert_int_equal(wait_for_value(f->conn, SQL_MOST_HELD, 2, 30000), 2);
    assert_int_equal(wait_for_value(f->conn, SQL_HELD, 4, 30000), 4);
    harness_exec(f->conn, "SELECT outbox.enqueue_batch('ev', array_agg(jsonb_build_object('n', g)))"
                          " FROM generate_series(1, 200) AS g");
    assert_int_equal(wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 30000), 0);

    relay_signal(&second, SIGTERM);
    assert_int_equal(relay_wait(&second, 15000), 0);
    assert_int_equal(wait_for_value(f->conn, SQL_MOST_HELD, 4, 30000), 4);
    harness_exec(f->conn, "SELECT outbox.enqueue_batch('ev', array_agg(jsonb_build_object('n', g)))"
                          " FROM generate_series(1, 200) AS g");
    assert_int_equal(wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 30000), 0);
    relay_signal(&first, SIGTERM);
    assert_int_equal(relay_wait(&first, 15000), 0);
    assert_int_equal(assert_every_row_published(f), 0);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 600);
}

/* A row too large for the broker leaves the stream (dead, with why); the rest is published. */
static void
test_refused_row_leaves_the_stream(void **state)
{
    struct fixture *f = *state;
    char metrics_addr[32];
    const char *extra[] = {"--stream-prefix", f->prefix, "--max-message-bytes", "1000",
                           "--metrics-addr", metrics_addr, NULL};
    struct relay_process relay;
    long long big;
    int port = harness_closed_port();
    char *text;

    snprintf(metrics_addr, sizeof(metrics_addr), "127.0.0.1:%d", port);

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{\"n\": 1}')");
    big = harness_query_ll(f->conn, "SELECT outbox.enqueue('ev', jsonb_build_object('big', repeat('x', 5000)))");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{\"n\": 3}')");

    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 20000), 0);
    assert_int_equal(wait_for_entries(f, 2, 5000), 2);
    /* the stream's rows count in the relay's metrics as the row-state ones do */
    text = relay_scrape_metrics(port);
    assert_non_null(text);
    assert_true(queue_counter(text, "outbox_rows_published_total") == 2);
    assert_true(queue_counter(text, "outbox_rows_dead_total") == 1);
    free(text);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    {
        char sql[160];

        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM outbox.job WHERE job_id = %lld AND state = 'dead'"
                 " AND last_error IS NOT NULL AND stream_partition IS NULL",
                 big);
        assert_int_equal(harness_query_ll(f->conn, sql), 1);
    }
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 2);
}

/* Row-state queues are untouched: a stream queue's rows are never claimed, others are. */
static void
test_claims_skip_stream_rows(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    char other[112];

    snprintf(other, sizeof(other), "%sother", f->prefix);
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 10)");
    harness_exec(f->conn, "SELECT outbox.enqueue('other', '{}') FROM generate_series(1, 10)");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev' AND state = 'stream'"),
                     10);
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'other' AND state = 'succeeded'"),
                     10);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev' AND state = 'stream'"
                                               " AND attempts = 0"),
                     10);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 10);
    assert_int_equal(stream_consumer_stream_length(f->redis, other), 10);
    /* disabling hands unpublished rows to the claims, published ones become succeeded */
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}')");
    harness_exec(f->conn, "SELECT outbox.stream_disable('ev')");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev' AND state = 'succeeded'"),
                     10);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev' AND state = 'ready'"),
                     1);
}

/*
 * A row the broker fails (its Redis stream key holds a string: WRONGTYPE)
 * leaves the stream for the retry path, ready with a backoff and its error;
 * the rows after it are published meanwhile.
 */
static void
test_failed_row_goes_to_retry_path(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--retry-base", "1h", "--retry-max", "2h",
                           NULL};
    struct relay_process relay;
    char bad_key[112], sql[256];
    const char *set_argv[] = {"SET", bad_key, "not a stream"};
    long long failing;

    snprintf(bad_key, sizeof(bad_key), "%sbroken", f->prefix);
    freeReplyObject(stream_consumer_command(f->redis, 3, set_argv));
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{\"n\": 1}')");
    failing = harness_query_ll(f->conn, "SELECT outbox.enqueue('ev', '{\"n\": 2}',"
                                        " routing_key => 'broken')");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{\"n\": 3}') FROM generate_series(1, 5)");

    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 20000), 0);
    assert_int_equal(wait_for_entries(f, 6, 5000), 6);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM outbox.job WHERE job_id = %lld AND state = 'ready'"
             " AND attempts = 1 AND run_at > now() + interval '10 minutes'"
             " AND last_error ILIKE '%%wrongtype%%'",
             failing);
    assert_int_equal(harness_query_ll(f->conn, sql), 1);
}

/*
 * The cleanup deletes stream rows behind the cursor and older than
 * --retention, and no row the stream has not published (a paused stream).
 */
static void
test_cleanup_deletes_published_rows_only(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--retention", "1s", NULL};
    struct relay_process relay;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->conn, "SELECT outbox.stream_enable('held', 1)");
    harness_exec(f->conn, "SELECT outbox.pause('held')");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 20)");
    harness_exec(f->conn, "SELECT outbox.enqueue('held', '{}') FROM generate_series(1, 5)");

    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'ev'", 0,
                                    30000),
                     0);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 20);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'held' AND state = 'stream'"),
                     5);
}

/*
 * --ordering-dead-policy block: a failing row whose key has a later row
 * behind it keeps its place; the partition waits and tries it again until
 * it is dead, and only then the key's next row is published.
 */
static void
block_policy_keeps_key_order(struct fixture *f, const char *batch_size)
{
    const char *extra[] = {"--stream-prefix", f->prefix, "--ordering-dead-policy", "block",
                           "--retry-base", "1s", "--retry-max", "1s", "--batch-size", batch_size,
                           NULL};
    struct relay_process relay;
    struct stream_consumer_stream stream;
    char bad_key[112], sql[256], attempts_sql[128];
    const char *set_argv[] = {"SET", bad_key, "not a stream"};
    long long failing, next;

    snprintf(bad_key, sizeof(bad_key), "%sbroken", f->prefix);
    freeReplyObject(stream_consumer_command(f->redis, 3, set_argv));
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(f->conn, "BEGIN");
    failing = harness_query_ll(f->conn, "SELECT outbox.enqueue('ev', '{\"n\": 1}', max_attempts => 3,"
                                        " ordering_key => 'k', routing_key => 'broken')");
    next = harness_query_ll(f->conn, "SELECT outbox.enqueue('ev', '{\"n\": 2}', ordering_key => 'k')");
    harness_exec(f->conn, "COMMIT");

    relay_start_process(&relay, f->url, f->broker, extra);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM outbox.job WHERE job_id = %lld AND state = 'dead' AND attempts = 3",
             failing);
    /*
     * The key's next row goes out with the failing row's last attempt at
     * the earliest: read the stream's length first, then the attempts
     * recorded (2 while that last batch is in flight, 3 after).
     */
    snprintf(attempts_sql, sizeof(attempts_sql), "SELECT attempts FROM outbox.job WHERE job_id = %lld",
             failing);
    for (int waited = 0; waited < 30000; waited += 100) {
        long long length = stream_consumer_stream_length(f->redis, f->stream);
        long long attempts = harness_query_ll(f->conn, attempts_sql);

        if (length > 0 && attempts < 2)
            fail_msg("job %lld was published after %lld attempt(s) of job %lld of its key", next,
                     attempts, failing);
        if (length > 0)
            break;
        usleep(100 * 1000);
    }
    assert_int_equal(wait_for_value(f->conn, sql, 1, 10000), 1);
    assert_int_equal(harness_query_ll(f->conn, sql), 1);
    assert_int_equal(wait_for_entries(f, 1, 10000), 1);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    assert_int_equal((long long)stream.count, 1);
    assert_int_equal(stream.entries[0].job_id, next);
    stream_consumer_stream_clear(&stream);
}

static void
test_block_policy_keeps_key_order(void **state)
{
    block_policy_keeps_key_order(*state, "500");
}

/* The key's next row is in a later batch than the failing one: it waits all the same. */
static void
test_block_policy_keeps_key_order_across_batches(void **state)
{
    block_policy_keeps_key_order(*state, "1");
}

/*
 * A producer that does not own outbox.job (the insert guard of migration
 * 003 checks its rows) enqueues into a stream queue as into any other. Its
 * stream rows record their transaction, whatever xid the insert names; rows
 * of other queues record none (migration 012).
 */
static void
test_producer_role_enqueues_into_stream(void **state)
{
    struct fixture *f = *state;
    char role[64], sql[512];

    snprintf(role, sizeof(role), "stream_producer_%d", (int)getpid());
    snprintf(sql, sizeof(sql),
             "DROP ROLE IF EXISTS %s; CREATE ROLE %s NOLOGIN;"
             " GRANT USAGE ON SCHEMA outbox TO %s; GRANT INSERT ON outbox.job TO %s;"
             " GRANT SELECT (job_id, queue, idempotency_key, ordering_key, state)"
             " ON outbox.job TO %s;",
             role, role, role, role, role);
    harness_exec(f->conn, sql);
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    snprintf(sql, sizeof(sql), "SET ROLE %s", role);
    harness_exec(f->conn, sql);
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}', ordering_key => 'k')");
    harness_exec(f->conn, "SELECT outbox.enqueue_batch('ev', ARRAY['{}', '{}']::jsonb[])");
    harness_exec(f->conn, "RESET ROLE");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'stream'"
                                               " AND stream_partition IS NOT NULL AND xid IS NOT NULL"),
                     3);

    /* a producer naming an xid behind every cursor gets its own transaction's */
    harness_exec(f->conn, "BEGIN");
    snprintf(sql, sizeof(sql), "SET LOCAL ROLE %s", role);
    harness_exec(f->conn, sql);
    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, xid) VALUES ('ev', '{}', '1')");
    harness_exec(f->conn, "RESET ROLE");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'ev'"
                                               " AND xid = pg_current_xact_id()"),
                     1);
    harness_exec(f->conn, "COMMIT");
    harness_exec(f->conn, "SELECT outbox.enqueue('plain', '{}')");
    harness_exec(f->conn, "SELECT outbox.enqueue_batch('plain', ARRAY['{}', '{}']::jsonb[])");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'plain'"
                                               " AND state = 'ready' AND xid IS NULL"),
                     3);
    snprintf(sql, sizeof(sql), "DROP OWNED BY %s; DROP ROLE %s", role, role);
    harness_exec(f->conn, sql);
}

/* Runs outboxctl with args on the test database; its exit status, its stdout in out. */
static int
run_outboxctl(const struct fixture *f, const char *args, char *out, size_t size)
{
    char command[1024];
    FILE *pipe;
    size_t used = 0;
    int status;

    snprintf(command, sizeof(command), "'%s/outboxctl' --database-url '%s' %s 2>&1",
             harness_env("OUTBOX_BIN"), f->url, args);
    pipe = popen(command, "r");
    assert_non_null(pipe);
    out[0] = '\0';
    while (used + 1 < size && fgets(out + used, (int)(size - used), pipe) != NULL)
        used += strlen(out + used);
    status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* outboxctl stream enable / list / disable, and its refusals. */
static void
test_outboxctl_stream_commands(void **state)
{
    struct fixture *f = *state;
    char out[4096];

    assert_int_equal(run_outboxctl(f, "stream enable ev --partitions 3", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "stream enabled: queue 'ev' (3 partitions)"));
    assert_int_equal(run_outboxctl(f, "stream enable ev --partitions 3", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "already a stream"));
    /* another partition count would move keys between partitions */
    assert_int_equal(run_outboxctl(f, "stream enable ev --partitions 4", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "is a stream of 3 partitions already"));
    assert_int_equal(run_outboxctl(f, "stream enable ev --partitions 0", out, sizeof(out)), 2);
    assert_int_equal(run_outboxctl(f, "stream enable 'no spaces'", out, sizeof(out)), 2);
    assert_int_equal(run_outboxctl(f, "stream frob", out, sizeof(out)), 2);
    assert_int_equal(run_outboxctl(f, "stream disable", out, sizeof(out)), 2);

    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}', ordering_key => 'k') FROM generate_series(1, 7)");
    assert_int_equal(run_outboxctl(f, "stream list", out, sizeof(out)), 0);
    /* one key: all 7 rows lag in one of the 3 partitions */
    assert_non_null(strstr(out, "partition"));
    assert_non_null(strstr(out, " 7 "));
    assert_int_equal(run_outboxctl(f, "stream disable ev", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "stream disabled: queue 'ev'"));
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'"), 7);
    assert_int_equal(run_outboxctl(f, "stream list", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "no stream queues"));
}

/*
 * The relay's database connections are cut: the stream reconnects and goes
 * on with the partitions it holds (their leases still run), without waiting
 * for a lease of 60 s to end.
 */
static void
test_reconnect_keeps_partitions(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--lease", "60", NULL};
    struct relay_process relay;
    long long generations;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 10)");
    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_entries(f, 10, 20000), 10);
    generations = harness_query_ll(f->conn, "SELECT sum(generation) FROM outbox.stream_cursor");
    harness_query_ll(f->conn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                              " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                              "   AND application_name = 'outbox-relay'");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 10)");
    if (wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 30000) != 0)
        relay_dump_log(&relay);
    assert_int_equal(wait_for_value(f->conn, SQL_UNPUBLISHED, 0, 100), 0);
    /* the same leases: no partition was taken again */
    assert_int_equal(harness_query_ll(f->conn, "SELECT sum(generation) FROM outbox.stream_cursor"),
                     generations);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_int_equal(assert_every_row_published(f), 0);
}

/* Backends of the relays on the test's database. */
static const char SQL_RELAY_BACKENDS[] =
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    "   AND application_name = 'outbox-relay'";

/*
 * A relay holds --concurrency connections to its database and one for its
 * upkeep while it has no stream queue: no connection waits for one, and a
 * stop then logs no fault of the database (its stream slots, which held
 * none, are no failure). Once one is made (here while a relay runs) its
 * stream slots connect: --concurrency more.
 */
static void
test_no_stream_costs_no_connection(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--concurrency", "2", NULL};
    struct relay_process relay;
    double fault_line;

    enqueue_rows(f->conn, "plain", 5);
    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn,
                                     "SELECT count(*) FROM outbox.job WHERE state = 'ready'", 0,
                                     20000),
                     0);
    /* 2 pipelines + maintenance, and still so after several stream checks */
    assert_int_equal(wait_for_value(f->conn, SQL_RELAY_BACKENDS, 3, 10000), 3);
    usleep(5 * 1000 * 1000);
    assert_int_equal(harness_query_ll(f->conn, SQL_RELAY_BACKENDS), 3);
    /* its stream slots held no connection: a stop is no fault of the database's */
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    fault_line = relay_log_find(&relay, 0, false, (const char *[]){"database available again", NULL},
                                NULL, 0);
    if (fault_line >= 0)
        relay_dump_log(&relay);
    assert_true(fault_line < 0);

    relay_start_process(&relay, f->url, f->broker, extra);
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 10)");
    if (wait_for_entries(f, 10, 20000) != 10)
        relay_dump_log(&relay);
    assert_int_equal(wait_for_entries(f, 10, 100), 10);
    /* ... and 2 stream slots once there is a stream (the lag report is the maintenance's) */
    assert_int_equal(wait_for_value(f->conn, SQL_RELAY_BACKENDS, 5, 10000), 5);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_int_equal(assert_every_row_published(f), 0);
}

/* Lets role hold at most limit sessions at once: PostgreSQL refuses one more. */
static void
limit_role(struct fixture *f, const char *role, int limit)
{
    char sql[160];

    snprintf(sql, sizeof(sql), "ALTER ROLE %s CONNECTION LIMIT %d", role, limit);
    harness_exec(f->conn, sql);
}

/*
 * --max-db-connections holds for a relay of one database as for a list: with
 * --concurrency 3 and a budget of 2, the relay never holds more than 2
 * connections, its stream partitions and its maintenance included, and
 * moves every row of both kinds; with a budget of one, so does --once. The
 * relay logs in as a role PostgreSQL lets hold no more than the budget (a
 * connection beyond it is refused, and the refusal logged), and its
 * sessions are sampled besides.
 */
static void
test_budget_holds_for_one_database(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--concurrency", "3",
                           "--max-db-connections", "2", NULL};
    const char *budget_of_one[] = {"--stream-prefix", f->prefix, "--max-db-connections", "1",
                                   NULL};
    const char *refused[] = {"too many connections", NULL};
    struct relay_process relay;
    long long most = 0;
    double refused_at;
    char role[64], grants[128];
    char *url;

    snprintf(role, sizeof(role), "budget_relay_%d", (int)getpid());
    fixture_create_outbox_roles(f->conn);
    snprintf(grants, sizeof(grants), "GRANT outbox_relay TO %s", role);
    fixture_create_login_role(f->conn, role, grants);
    limit_role(f, role, 2);
    url = fixture_url_as(f->url, role);
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 4)");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 300)");
    enqueue_rows(f->conn, "plain", 300);
    relay_start_process(&relay, url, f->broker, extra);
    for (int i = 0; i < 100; i++) {
        long long now = harness_query_ll(f->conn, SQL_RELAY_BACKENDS);

        most = now > most ? now : most;
        if (harness_query_ll(f->conn, SQL_UNPUBLISHED) == 0 &&
            harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'") == 0)
            break;
        usleep(100 * 1000);
    }
    if (harness_query_ll(f->conn, SQL_UNPUBLISHED) != 0)
        relay_dump_log(&relay);
    assert_int_equal(harness_query_ll(f->conn, SQL_UNPUBLISHED), 0);
    assert_int_equal(wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'",
                                    0, 10000),
                     0);
    assert_int_equal(wait_for_entries(f, 300, 10000), 300);
    printf("budget: at most %lld connections of the relay seen\n", most);
    assert_true(most <= 2);
    assert_true(harness_query_ll(f->conn, SQL_RELAY_BACKENDS) <= 2);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    refused_at = relay_log_find(&relay, 0, false, refused, NULL, 0);
    if (refused_at >= 0)
        relay_dump_log(&relay);
    assert_true(refused_at < 0);

    /* a budget of one: the one slot publishes both kinds and maintains (a second
     * connection would be refused, and --once give up) */
    limit_role(f, role, 1);
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 100)");
    enqueue_rows(f->conn, "plain", 100);
    assert_int_equal(relay_run_once(url, f->broker, budget_of_one), 0);
    free(url);
    fixture_drop_role(f->conn, role);
    assert_int_equal(harness_query_ll(f->conn, SQL_UNPUBLISHED), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'"),
                     0);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 400);
    assert_int_equal(assert_every_row_published(f), 0);
}

/* A number of queue 'ev' in `outboxctl status --json`; -1 when absent. */
static long long
status_field(const struct fixture *f, const char *field)
{
    char out[16384];
    const char *params[2] = {out, field};
    PGresult *result;
    long long value = -1;

    assert_int_equal(run_outboxctl(f, "status --json", out, sizeof(out)), 0);
    result = PQexecParams(f->conn,
                          "SELECT CASE q->>$2 WHEN 'true' THEN 1 WHEN 'false' THEN 0"
                          "       ELSE (q->>$2)::bigint END"
                          "  FROM jsonb_array_elements($1::jsonb->'queues') AS q"
                          " WHERE q->>'queue' = 'ev'",
                          2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("status --json is not the expected JSON: %s\n%s", PQerrorMessage(f->conn), out);
    if (PQntuples(result) == 1 && !PQgetisnull(result, 0, 0))
        value = strtoll(PQgetvalue(result, 0, 0), NULL, 10);
    PQclear(result);
    return value;
}

/*
 * outboxctl on a stream queue: status counts its rows as published or
 * waiting from the cursors; replay republishes published rows (by id)
 * without moving the cursor and refuses the unpublished one; pausing one
 * key is refused in one line (exit 2), pausing the queue is not.
 */
static void
test_outboxctl_sees_stream_rows(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    const char *cursor_sql = "SELECT sum(cursor_job_id) FROM outbox.stream_cursor";
    char out[4096], args[256];
    long long cursor, waiting_id, first;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 10)");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 10);
    first = harness_query_ll(f->conn, "SELECT min(job_id) FROM outbox.job");
    waiting_id = harness_query_ll(f->conn, "SELECT outbox.enqueue('ev', '{}')");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 2)");

    assert_int_equal(status_field(f, "stream"), 1);
    assert_int_equal(status_field(f, "stream_published"), 10);
    assert_int_equal(status_field(f, "stream_waiting"), 3);
    assert_int_equal(status_field(f, "ready"), 0);
    assert_int_equal(run_outboxctl(f, "status", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "STREAM WAITING"));

    /* by time: the published rows, by when they were created; nothing changes on --dry-run */
    assert_int_equal(run_outboxctl(f, "replay --queue ev --since 1h --dry-run", out, sizeof(out)),
                     0);
    assert_non_null(strstr(out, "would replay 10 succeeded jobs"));
    cursor = harness_query_ll(f->conn, cursor_sql);
    snprintf(args, sizeof(args), "replay --queue ev --job %lld --job %lld --job %lld", first + 1,
             first + 4, waiting_id);
    assert_int_equal(run_outboxctl(f, args, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "replayed 2 succeeded jobs"));
    assert_non_null(strstr(out, "1 ready"));
    assert_int_equal(harness_query_ll(f->conn, cursor_sql), cursor);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'ready' AND replays = 1"),
                     2);
    assert_int_equal(status_field(f, "stream_published"), 8);

    /* the replayed rows go out again, the waiting ones for the first time */
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 15);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND replays = 1"),
                     2);
    assert_int_equal(status_field(f, "stream_waiting"), 0);

    assert_int_equal(run_outboxctl(f, "pause ev --ordering-key k1", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "queue 'ev' is a stream"));
    assert_null(strchr(strchr(out, '\n') + 1, '\n')); /* one line */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 0);
    assert_int_equal(run_outboxctl(f, "pause ev", out, sizeof(out)), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_claims_skip_stream_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_role_enqueues_into_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_order_commit_is_not_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_owner_mid_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_order_across_relays, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_row_leaves_the_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_row_goes_to_retry_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cleanup_deletes_published_rows_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_partitions_spread_to_a_later_relay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_policy_keeps_key_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_policy_keeps_key_order_across_batches, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_outboxctl_stream_commands, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconnect_keeps_partitions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_stream_costs_no_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_holds_for_one_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outboxctl_sees_stream_rows, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
