/*
 * test_stream_safety.c - a stream queue's promises where they are easiest to
 * break, against real PostgreSQL and Redis: `stream disable` then `enable`
 * under a running relay, transactions of one ordering key that took their
 * transaction ids in the other order than they committed, a key's rows
 * across `stream disable` and `enable` (rows handed back, rows of the
 * claims, rows a row-state relay is publishing, a new partition count),
 * and a prepared transaction holding the horizon.
 *
 * What a user notices: every committed row is in the Redis stream exactly
 * once, a key's rows in the commit order of their transactions, and a
 * stopped stream names what stops it.
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
#include "outbox.h"
#include "redis_consumer.h"
#include "relay_runner.h"

/* A test's database, Redis and key prefix; stream is the prefix + "ev". */
#define fixture fixture_redis

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    fixture_redis_open(f, "stream-safety", "ev");
    *state = f;
    return 0;
}

/* Ends the prepared transactions a test left in its database (they would keep it from dropping). */
static void
rollback_prepared(struct fixture *f)
{
    PGresult *gids = PQexec(f->conn, "SELECT format('ROLLBACK PREPARED %L', gid)"
                                     " FROM pg_prepared_xacts WHERE database = current_database()");

    for (int r = 0; PQresultStatus(gids) == PGRES_TUPLES_OK && r < PQntuples(gids); r++)
        PQclear(PQexec(f->conn, PQgetvalue(gids, r, 0)));
    PQclear(gids);
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    rollback_prepared(f);
    fixture_redis_close(f);
    free(f);
    return 0;
}

/* Rows of queue 'ev' neither succeeded nor behind their stream cursor. */
static const char SQL_NOT_DONE[] =
    "SELECT count(*) FROM outbox.job AS j WHERE j.queue = 'ev' AND NOT (j.state = 'succeeded'"
    " OR (j.state = 'stream' AND EXISTS (SELECT 1 FROM outbox.stream_cursor AS c"
    "      WHERE c.queue = j.queue AND c.partition = j.stream_partition"
    "        AND (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id))))";

/*
 * Fails unless every row of queue 'ev' is in the Redis stream exactly once
 * (a row the table marks succeeded but Redis lacks is a lost row).
 */
static void
assert_each_row_once(struct fixture *f)
{
    struct stream_consumer_stream stream;
    PGresult *rows = PQexec(f->conn, "SELECT job_id, state FROM outbox.job WHERE queue = 'ev'"
                                     " ORDER BY job_id");
    long long max_id, lost = 0, twice = 0;
    int *seen;

    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    assert_true(PQntuples(rows) > 0);
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

        if (seen[id] == 0) {
            lost++;
            print_error("row %lld (%s) is not in the stream\n", id, PQgetvalue(rows, r, 1));
        }
        if (seen[id] > 1)
            twice += seen[id] - 1;
    }
    PQclear(rows);
    free(seen);
    stream_consumer_stream_clear(&stream);
    if (lost > 0 || twice > 0)
        fail_msg("%lld rows lost, %lld appended more than once", lost, twice);
}

/*
 * `stream disable` then `stream enable` in one transaction while a relay
 * holds the partitions: the rows the disable hands to the claims (due a
 * few seconds later) and the rows of the stream made again are each
 * published once. A relay still holding a lease of the stream that was
 * disabled must neither publish the new stream's rows under the old one's
 * order nor write the new cursors.
 */
static void
reenable_with_relay(struct fixture *f, bool one_transaction)
{
    const char *extra[] = {"--stream-prefix", f->prefix, "--lease", "6", NULL};
    struct relay_process relay;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    relay_start_process(&relay, f->url, f->broker, extra);
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 10)");
    assert_int_equal(wait_for_value(f->conn, SQL_NOT_DONE, 0, 20000), 0);

    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{\"handed\": true}',"
                          " run_at => now() + interval '3 seconds') FROM generate_series(1, 5)");
    harness_exec(f->conn, "SELECT outbox.stream_disable('ev')");
    if (!one_transaction) {
        harness_exec(f->conn, "COMMIT");
        harness_exec(f->conn, "BEGIN");
    }
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->conn, "COMMIT");
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{\"new\": true}') FROM generate_series(1, 20)");

    if (wait_for_value(f->conn, SQL_NOT_DONE, 0, 30000) != 0)
        relay_dump_log(&relay);
    assert_int_equal(wait_for_value(f->conn, SQL_NOT_DONE, 0, 100), 0);
    usleep(500 * 1000); /* a stale append would come now */
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'ev'"),
                     35);
    assert_each_row_once(f);
}

static void
test_reenable_in_one_transaction(void **state)
{
    reenable_with_relay(*state, true);
}

static void
test_reenable_in_two_commands(void **state)
{
    reenable_with_relay(*state, false);
}

/* The job ids of the Redis stream's entries, in stream order, as "1,2,3". */
static void
stream_job_ids(struct fixture *f, char *out, size_t size)
{
    struct stream_consumer_stream stream;
    size_t used = 0;

    out[0] = '\0';
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    for (size_t i = 0; i < stream.count && used + 24 < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%lld", i > 0 ? "," : "",
                                 (long long)stream.entries[i].job_id);
    stream_consumer_stream_clear(&stream);
}

/*
 * T1 takes its transaction id first (a write of its own), T2 writes key
 * order:1 and commits, then T1 writes the key twice and commits: the stream
 * publishes T2's row, then T1's two in job id order (commit order, which is
 * not the order the ids were taken). While T1 runs, T2's row waits for it
 * (the horizon): nothing of T1 can go out first.
 */
static void
test_key_follows_commit_order(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    PGconn *t1 = harness_connect(f->url);
    long long created, shipped, delivered;
    char want[96], got[256];

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 4)");
    harness_exec(f->conn, "CREATE TABLE orders (id int PRIMARY KEY, status text)");
    harness_exec(t1, "BEGIN");
    harness_exec(t1, "INSERT INTO orders VALUES (99, 'other')");
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "INSERT INTO orders VALUES (1, 'created')");
    created = harness_query_ll(f->conn, "SELECT outbox.enqueue('ev', '{\"event\": \"created\"}',"
                                        " ordering_key => 'order:1')");
    harness_exec(f->conn, "COMMIT");
    harness_exec(t1, "UPDATE orders SET status = 'shipped' WHERE id = 1");
    shipped = harness_query_ll(t1, "SELECT outbox.enqueue('ev', '{\"event\": \"shipped\"}',"
                                   " ordering_key => 'order:1')");
    delivered = harness_query_ll(t1, "SELECT outbox.enqueue('ev', '{\"event\": \"delivered\"}',"
                                     " ordering_key => 'order:1')");
    harness_exec(t1, "COMMIT");
    PQfinish(t1);

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    snprintf(want, sizeof(want), "%lld,%lld,%lld", created, shipped, delivered);
    stream_job_ids(f, got, sizeof(got));
    assert_string_equal(got, want);
    assert_each_row_once(f);
    /* the key's last place is below the horizon now: the relay's cleanup deleted it */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.stream_key"), 0);
}

/* The job ids of the Redis stream's entries of ordering key key, in stream order. */
static void
stream_key_job_ids(struct fixture *f, const char *key, char *out, size_t size)
{
    struct stream_consumer_stream stream;
    char sql[256];
    size_t used = 0;

    out[0] = '\0';
    assert_int_equal(stream_consumer_read_stream(f->redis, f->stream, &stream), 0);
    for (size_t i = 0; i < stream.count && used + 24 < size; i++) {
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM outbox.job WHERE job_id = %lld AND ordering_key = '%s'",
                 (long long)stream.entries[i].job_id, key);
        if (harness_query_ll(f->conn, sql) == 1)
            used += (size_t)snprintf(out + used, size - used, "%s%lld", used > 0 ? "," : "",
                                     (long long)stream.entries[i].job_id);
    }
    stream_consumer_stream_clear(&stream);
}

/* Enqueues one row of key (NULL: none) due after delay seconds; its job id, appended to list. */
static long long
enqueue_keyed(struct fixture *f, const char *key, int delay, char *list, size_t size)
{
    char sql[256];
    long long id;

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue('ev', '{}', ordering_key => %s%s%s,"
             " run_at => now() + make_interval(secs => %d))",
             key != NULL ? "'" : "", key != NULL ? key : "NULL", key != NULL ? "'" : "", delay);
    id = harness_query_ll(f->conn, sql);
    if (list != NULL) {
        size_t used = strlen(list);

        snprintf(list + used, size - used, "%s%lld", used > 0 ? "," : "", id);
    }
    return id;
}

/*
 * A key's rows in commit order across the switches: a row of the claims
 * from before the queue was a stream, stream rows handed back by `stream
 * disable` (due later: a retry's backoff), a row of the claims between,
 * then `stream enable` with another partition count and the new stream's
 * rows. Every row goes out once, each key's in the order written, though
 * the rows the claims held were not due yet.
 */
static void
test_key_order_across_reenable(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    char want_a[256] = "", want_b[256] = "", got[512];

    enqueue_keyed(f, "a", 3, want_a, sizeof(want_a));
    enqueue_keyed(f, NULL, 3, NULL, 0);
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    for (int i = 0; i < 3; i++) {
        enqueue_keyed(f, "a", 3, want_a, sizeof(want_a));
        enqueue_keyed(f, "b", 3, want_b, sizeof(want_b));
    }
    harness_exec(f->conn, "SELECT outbox.stream_disable('ev')");
    enqueue_keyed(f, "b", 3, want_b, sizeof(want_b));
    enqueue_keyed(f, "a", 3, want_a, sizeof(want_a));
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 3)");
    for (int i = 0; i < 2; i++) {
        enqueue_keyed(f, "b", 0, want_b, sizeof(want_b));
        enqueue_keyed(f, "a", 0, want_a, sizeof(want_a));
        enqueue_keyed(f, NULL, 0, NULL, 0);
    }

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    stream_key_job_ids(f, "a", got, sizeof(got));
    assert_string_equal(got, want_a);
    stream_key_job_ids(f, "b", got, sizeof(got));
    assert_string_equal(got, want_b);
    assert_int_equal(harness_query_ll(f->conn, SQL_NOT_DONE), 0);
    assert_each_row_once(f);
}

/*
 * Rows published without a record of it are not appended again after
 * the switch: a stream's batch whose cursor move was lost (the owner died),
 * handed back by `disable` and taken again by `enable`, once through the
 * new stream and once through a stream disabled again before publishing
 * them; and a row a row-state relay appended before it died, unmarked.
 */
static void
test_adopted_rows_not_appended_twice(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    char ignored[512] = "";

    enqueue_keyed(f, "c", 0, ignored, sizeof(ignored));
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', finished_at = NULL"
                          " WHERE queue = 'ev'"); /* its relay died before the mark */

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    for (int i = 0; i < 4; i++) {
        enqueue_keyed(f, "a", 0, ignored, sizeof(ignored));
        enqueue_keyed(f, "b", 0, ignored, sizeof(ignored));
        enqueue_keyed(f, NULL, 0, ignored, sizeof(ignored));
    }
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 13);
    harness_exec(f->conn, "UPDATE outbox.stream_cursor SET cursor_xid = '0', cursor_job_id = 0"
                          " WHERE queue = 'ev'"); /* its owner died before the move */
    harness_exec(f->conn, "SELECT outbox.stream_disable('ev')");
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 3)");
    enqueue_keyed(f, "a", 0, ignored, sizeof(ignored));
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, SQL_NOT_DONE), 0);
    assert_each_row_once(f);

    /* the same once more, the stream disabled again before it published them */
    harness_exec(f->conn, "UPDATE outbox.stream_cursor SET cursor_xid = '0', cursor_job_id = 0"
                          " WHERE queue = 'ev'");
    harness_exec(f->conn, "SELECT outbox.stream_disable('ev')");
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(f->conn, "SELECT outbox.stream_disable('ev')");
    enqueue_keyed(f, "b", 0, ignored, sizeof(ignored));
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev' AND state <> 'succeeded'"),
                     0);
    assert_each_row_once(f);
}

/*
 * A row handed back with a place of another history (the database was
 * restored into another cluster since: its transaction ids are not handed
 * out here yet) is published once the queue is a stream again, in its
 * key's order, instead of waiting for the ids to reach its place.
 */
static void
test_taken_row_of_another_history(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    char want[256] = "", got[512];

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    enqueue_keyed(f, "a", 0, want, sizeof(want));
    enqueue_keyed(f, "a", 0, want, sizeof(want));
    harness_exec(f->conn, "SELECT outbox.stream_disable('ev')");
    harness_exec(f->conn, "UPDATE outbox.job SET xid = '900000000000' WHERE queue = 'ev'");
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    enqueue_keyed(f, "a", 0, want, sizeof(want));

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    stream_key_job_ids(f, "a", got, sizeof(got));
    assert_string_equal(got, want);
    assert_int_equal(harness_query_ll(f->conn, SQL_NOT_DONE), 0);
    assert_each_row_once(f);
}

/*
 * `stream enable` while a row-state relay publishes a row of the queue:
 * the stream takes that row over with the others, in its key's order, and
 * the relay finds its lease lost (its copy, if it sends one, is a duplicate
 * Redis drops).
 */
static void
test_running_row_taken_over(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, NULL};
    char want[256] = "", got[512];
    struct outbox_error err = {0};
    struct outbox_batch batch = {0};
    outbox_store *ghost = outbox_store_connect(f->url, "ghost", &err);
    const char *queues[] = {"ev"};
    struct outbox_lease lease;
    bool done = true;

    assert_non_null(ghost);
    enqueue_keyed(f, "a", 0, want, sizeof(want));
    enqueue_keyed(f, "a", 0, want, sizeof(want));
    assert_int_equal(outbox_claim(ghost, queues, 1, 10, 3600, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    lease = (struct outbox_lease){batch.jobs[0].job_id, batch.jobs[0].generation};
    outbox_batch_release_memory(&batch);

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    enqueue_keyed(f, "a", 0, want, sizeof(want));
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    stream_key_job_ids(f, "a", got, sizeof(got));
    assert_string_equal(got, want);

    assert_int_equal(outbox_complete(ghost, &lease, 1, &done, NULL, &err), 0);
    assert_false(done);
    outbox_store_free(ghost);
    assert_int_equal(harness_query_ll(f->conn, SQL_NOT_DONE), 0);
    assert_each_row_once(f);
}

/* The value of an unlabelled-by-queue gauge name{...} in a scrape, -1 when absent. */
static double
gauge_value(const char *text, const char *name)
{
    size_t length = strlen(name);

    for (const char *line = text; line != NULL && *line != '\0';) {
        const char *brace = strchr(line, '}');

        if (strncmp(line, name, length) == 0 && (line[length] == '{' || line[length] == ' '))
            return strtod(line[length] == ' ' ? line + length : brace + 1, NULL);
        line = strchr(line, '\n');
        line = line != NULL ? line + 1 : NULL;
    }
    return -1;
}

/* Runs outboxctl with args on the test database; its exit status, its output in out. */
static int
run_outboxctl(const struct fixture *f, const char *args, char *out, size_t size)
{
    char command[1024];
    FILE *pipe;
    size_t used = 0;

    snprintf(command, sizeof(command), "'%s/outboxctl' --database-url '%s' %s 2>&1",
             harness_env("OUTBOX_BIN"), f->url, args);
    pipe = popen(command, "r");
    assert_non_null(pipe);
    out[0] = '\0';
    while (used + 1 < size && fgets(out + used, (int)(size - used), pipe) != NULL)
        used += strlen(out + used);
    return pclose(pipe) == 0 ? 0 : 1;
}

/*
 * A prepared transaction with an xid stops every stream as an open one
 * does: the relay's log, /metrics and `outboxctl status` name it (gid,
 * owner, database, age) and say how to end it; once it is committed the
 * rows go out.
 */
static void
test_prepared_transaction_is_named(void **state)
{
    struct fixture *f = *state;
    char metrics_addr[32], gid[80], sql[200], out[8192];
    const char *extra[] = {"--stream-prefix", f->prefix, "--horizon-warning", "1s",
                           "--metrics-addr", metrics_addr, NULL};
    int port = harness_free_port();
    PGconn *holder = harness_connect(f->url);
    struct relay_process relay;
    bool named = false;
    char *text = NULL;

    snprintf(metrics_addr, sizeof(metrics_addr), "127.0.0.1:%d", port);
    snprintf(gid, sizeof(gid), "stuck-%s", f->prefix); /* the prefix is this test's alone */
    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 1)");
    harness_exec(holder, "BEGIN");
    harness_exec(holder, "SELECT pg_current_xact_id()");
    snprintf(sql, sizeof(sql), "PREPARE TRANSACTION '%s'", gid);
    harness_exec(holder, sql);
    PQfinish(holder);
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}') FROM generate_series(1, 3)");

    relay_start_process(&relay, f->url, f->broker, extra);
    for (int i = 0; i < 150 && !named; i++) {
        named = relay_log_find(&relay, 0, false,
                               (const char *const[]){"prepared transaction holds the stream horizon",
                                                     gid, "ROLLBACK PREPARED", NULL},
                               NULL, 0) > 0;
        if (!named)
            usleep(100 * 1000);
    }
    if (!named)
        relay_dump_log(&relay);
    assert_true(named);
    assert_int_equal(stream_consumer_stream_length(f->redis, f->stream), 0);
    text = relay_scrape_metrics(port);
    assert_non_null(text);
    assert_true(gauge_value(text, "outbox_stream_horizon_prepared") == 1);
    assert_true(gauge_value(text, "outbox_stream_horizon_age_seconds") > 0);
    free(text);

    assert_int_equal(run_outboxctl(f, "status", out, sizeof(out)), 0);
    assert_non_null(strstr(out, gid));
    assert_non_null(strstr(out, "COMMIT PREPARED"));
    assert_int_equal(run_outboxctl(f, "status --json", out, sizeof(out)), 0);
    snprintf(sql, sizeof(sql), "\"prepared_gid\":\"%s\"", gid);
    assert_non_null(strstr(out, sql));

    snprintf(sql, sizeof(sql), "COMMIT PREPARED '%s'", gid);
    harness_exec(f->conn, sql);
    assert_int_equal(wait_for_value(f->conn, SQL_NOT_DONE, 0, 20000), 0);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_each_row_once(f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reenable_in_one_transaction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reenable_in_two_commands, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_follows_commit_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_order_across_reenable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopted_rows_not_appended_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_taken_row_of_another_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_running_row_taken_over, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepared_transaction_is_named, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
