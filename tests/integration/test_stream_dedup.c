/*
 * test_stream_dedup.c - a stream queue's rows reach a Redis stream at most
 * once, without one dedup record per row, against real PostgreSQL and Redis.
 *
 * The case every test stages: an owner published rows and stopped before it
 * moved its cursor over them (killed, or its lease lost). The cursor is
 * rolled back by hand to stand for it. Whoever publishes those rows next (a
 * relay taking the partitions over, or the claims after `stream disable`)
 * must find them in Redis by their place in the partition, and publish every
 * row that was not there.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
    fixture_redis_open(f, "stream-dedup", "ev");
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

/* Relays what is publishable now with --once; the stream prefix is the fixture's. */
static void
relay_once(struct fixture *f)
{
    const char *extra[] = {"--stream-prefix", f->prefix, "--batch-size", "100", NULL};

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
}

static void
enqueue(struct fixture *f, int count)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue_batch('ev', array_agg(jsonb_build_object('n', g)))"
             " FROM generate_series(1, %d) AS g",
             count);
    harness_exec(f->conn, sql);
}

/* The owners published and stopped before their cursors moved: the cursors go back to the start. */
static void
forget_cursors(struct fixture *f)
{
    harness_exec(f->conn, "UPDATE outbox.stream_cursor"
                          " SET cursor_xid = '0', cursor_job_id = 0, owner = NULL, lease_until = NULL");
}

/*
 * Checks that the stream holds every row of queue 'ev' exactly once, replays
 * times more for the rows replayed, and holds want entries.
 */
static void
assert_each_row_once(struct fixture *f, long long want)
{
    struct stream_consumer_stream stream;
    PGresult *rows = PQexec(f->conn, "SELECT job_id, replays FROM outbox.job WHERE queue = 'ev'"
                                     " ORDER BY job_id");
    long long max_id;
    int *seen;

    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    max_id = strtoll(PQgetvalue(rows, PQntuples(rows) - 1, 0), NULL, 10);
    seen = calloc((size_t)max_id + 1, sizeof(*seen));
    assert_non_null(seen);
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    for (size_t i = 0; i < stream.count; i++) {
        int64_t id = stream.entries[i].job_id;

        assert_true(id >= 1 && id <= max_id);
        seen[id]++;
    }
    for (int r = 0; r < PQntuples(rows); r++) {
        long long id = strtoll(PQgetvalue(rows, r, 0), NULL, 10);
        int replays = atoi(PQgetvalue(rows, r, 1));

        if (seen[id] != 1 + replays)
            fail_msg("row %lld (replayed %d times) is in the stream %d times", id, replays,
                     seen[id]);
    }
    assert_int_equal((long long)stream.count, want);
    PQclear(rows);
    free(seen);
    stream_consumer_stream_clear(&stream);
}

/* Keys in Redis whose name starts with "{<stream>}" followed by infix. */
static long long
records_named(struct fixture *f, const char *infix)
{
    char prefix[160];

    snprintf(prefix, sizeof(prefix), "{%s}%s", f->stream, infix);
    return stream_consumer_count_prefix(f->redis, prefix);
}

/* Runs outboxctl with args on the test database; its exit status. */
static int
run_outboxctl(const struct fixture *f, const char *args)
{
    char command[1024];
    int status;

    snprintf(command, sizeof(command), "'%s/outboxctl' --database-url '%s' %s >/dev/null 2>&1",
             harness_env("OUTBOX_BIN"), f->url, args);
    status = system(command);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/*
 * The partitions are taken over from cursors that never moved over the
 * rows published: nothing is appended twice, the rows committed since are
 * appended, and the stream path wrote no dedup record per row (one record
 * per partition instead).
 */
static void
test_takeover_appends_nothing_twice(void **state)
{
    struct fixture *f = *state;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    enqueue(f, 3000);
    relay_once(f);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 3000);

    forget_cursors(f);
    enqueue(f, 500);
    relay_once(f);
    assert_each_row_once(f, 3500);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job AS j"
                                               " JOIN outbox.stream_cursor AS c"
                                               " ON c.queue = j.queue AND c.partition = j.stream_partition"
                                               " WHERE (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)"),
                     0);
    assert_int_equal(records_named(f, ":outbox-dedup:"), 0);
    assert_int_equal(records_named(f, ":outbox-order:"), 2);
}

/*
 * `stream disable` while the last batches were published but not recorded:
 * the rows go back to the claims with their place, so the claims append
 * only the rows Redis lacks. A replayed row is appended once more; a stream
 * made again later (another partition count) starts an order of its own.
 */
static void
test_disable_appends_nothing_twice(void **state)
{
    struct fixture *f = *state;
    char args[64];
    long long replayed;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    enqueue(f, 2000);
    relay_once(f);
    enqueue(f, 300); /* never published */
    forget_cursors(f);
    assert_int_equal(run_outboxctl(f, "stream disable ev"), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'"
                                               " AND stream_epoch IS NOT NULL"
                                               " AND stream_partition IS NOT NULL"),
                     2300);

    relay_once(f);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'"),
                     2300);
    assert_each_row_once(f, 2300);

    replayed = harness_query_ll(f->conn, "SELECT min(job_id) FROM outbox.job");
    snprintf(args, sizeof(args), "replay --queue ev --job %lld", replayed);
    assert_int_equal(run_outboxctl(f, args), 0);
    relay_once(f);
    assert_each_row_once(f, 2301);

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 3)");
    enqueue(f, 200);
    relay_once(f);
    assert_each_row_once(f, 2501);
    assert_int_equal(records_named(f, ":outbox-order:"), 2 + 3);
}

/*
 * Sets the order record of partition 0 of queue 'ev''s stream to say every
 * row up to the highest place was appended, the last by a row this
 * database never held: what a second history of the database (a standby
 * promoted beside another, a crash that lost commits) leaves behind.
 */
static void
plant_foreign_order_record(struct fixture *f)
{
    PGresult *name = PQexec(f->conn,
                            "SELECT i.database_id || ':' || i.epoch || coalesce('.' || i.history_token, '')"
                            "       || ':' || (extract(epoch FROM s.created_at) * 1000000)::bigint || ':0'"
                            " FROM outbox.identity AS i, outbox.stream AS s WHERE s.queue = 'ev'");
    char key[320], value[128];
    const char *argv[3] = {"SET", key, value};
    redisReply *reply;

    assert_int_equal(PQresultStatus(name), PGRES_TUPLES_OK);
    snprintf(key, sizeof(key), "{%s}:outbox-order:ev:%s", f->stream, PQgetvalue(name, 0, 0));
    PQclear(name);
    assert_int_equal(records_named(f, ":outbox-order:"), 1);
    /* done: a place after every row here (xid, job id); gap: none; then the row named */
    snprintf(value, sizeof(value), "%020d%019d%039d%s", 999999999, 999999999, 0,
             "00000000-0000-4000-8000-00000000f00d");
    reply = stream_consumer_command(f->redis, 3, argv);
    assert_non_null(reply);
    freeReplyObject(reply);
    assert_int_equal(records_named(f, ":outbox-order:"), 1); /* the relay's own, overwritten */
}

/* Enqueues count rows of ordering key key, each in a transaction of its own. */
static void
enqueue_keyed(struct fixture *f, int count, const char *key)
{
    char sql[160];

    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('ev', '{\"n\": 1}', ordering_key => '%s')",
             key);
    for (int i = 0; i < count; i++)
        harness_exec(f->conn, sql);
}

/*
 * Rows a disabled stream handed back and a stream made again took in are
 * judged by the order they left. When that order's record names a row
 * this database does not hold (another history wrote it), the rows are
 * checked against the database and appended, not taken for appended; the
 * rows of their key written after the enable wait for them.
 */
static void
test_rows_taken_back_are_checked_against_their_former_order(void **state)
{
    struct fixture *f = *state;
    struct stream_consumer_stream stream;
    int64_t last = 0;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    enqueue(f, 10);
    relay_once(f);
    enqueue_keyed(f, 5, "k"); /* never published */
    plant_foreign_order_record(f);
    assert_int_equal(run_outboxctl(f, "stream disable ev"), 0);
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'stream' AND stream_from <> ''"),
                     5);
    enqueue_keyed(f, 3, "k");
    relay_once(f);
    assert_each_row_once(f, 18);
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    for (size_t i = 0; i < stream.count; i++) { /* key k's rows in their commit order */
        if (stream.entries[i].job_id <= 10)
            continue;
        assert_true(stream.entries[i].job_id > last);
        last = stream.entries[i].job_id;
    }
    stream_consumer_stream_clear(&stream);
}

/* Fails unless the stream holds the rows of queue 'ev' in job id order (one key's commit order). */
static void
assert_in_job_id_order(struct fixture *f)
{
    struct stream_consumer_stream stream;
    int64_t last = 0;

    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    for (size_t i = 0; i < stream.count; i++) {
        if (stream.entries[i].job_id <= last)
            fail_msg("row %lld is in the stream after row %lld", (long long)stream.entries[i].job_id,
                     (long long)last);
        last = stream.entries[i].job_id;
    }
    stream_consumer_stream_clear(&stream);
}

/*
 * Rows a disabled stream handed to the claims are judged by the order they
 * left, as a stream made again judges them: when its record names a row
 * this database does not hold, the claims ask the database (between two
 * turns, the rows given back meanwhile), and append the rows instead of
 * taking them for appended.
 */
static void
test_rows_handed_to_the_claims_are_checked_against_their_order(void **state)
{
    struct fixture *f = *state;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    enqueue(f, 10);
    relay_once(f);
    enqueue_keyed(f, 5, "k"); /* never published */
    plant_foreign_order_record(f);
    assert_int_equal(run_outboxctl(f, "stream disable ev"), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'"
                                               " AND stream_partition IS NOT NULL"),
                     5);
    relay_once(f);
    assert_each_row_once(f, 15);
    assert_in_job_id_order(f);
}

/*
 * A stream made again takes in rows of one key that left two orders: three
 * its first stream appended before its owner moved the cursor, one it
 * never published (both from its order), and one written while the queue
 * was not a stream (no order). The first three are checked against the
 * record of the order they left (the database holds its row: found
 * appended); the fourth waits for that answer, and the fifth for the
 * fourth: each is appended once, in the key's order.
 */
static void
test_rows_taken_back_from_two_orders_keep_their_key_order(void **state)
{
    struct fixture *f = *state;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    enqueue_keyed(f, 3, "k");
    relay_once(f);
    forget_cursors(f);
    enqueue_keyed(f, 1, "k"); /* never published */
    assert_int_equal(run_outboxctl(f, "stream disable ev"), 0);
    enqueue_keyed(f, 1, "k"); /* while the queue is not a stream */
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'stream'"
                                               " AND stream_from IS NOT NULL"),
                     5);
    relay_once(f);
    assert_each_row_once(f, 5);
    assert_in_job_id_order(f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_takeover_appends_nothing_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disable_appends_nothing_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_taken_back_are_checked_against_their_former_order,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_taken_back_from_two_orders_keep_their_key_order,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_handed_to_the_claims_are_checked_against_their_order,
                                        setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
