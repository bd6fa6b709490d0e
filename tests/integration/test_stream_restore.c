/*
 * test_stream_restore.c - a stream queue moved to another cluster by
 * pg_dump -Fc | pg_restore (a major upgrade, a move to another host): the
 * new cluster's transaction ids start below the restored cursors, and
 * every row enqueued there must still be published (Redis, where the
 * partitions' order records also remember places of the old cluster), with
 * the rows the old cluster published not lost either.
 *
 * The second cluster is a stack of its own (tests/harness/stack.sh with
 * postgres only) in a directory inside the run's, freshly initdb'd.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "key_inversion.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define PG_BIN "/usr/lib/postgresql/15/bin"

struct fixture {
    struct fixture_redis first; /* the database dumped, the Redis and its keys */
    char second_dir[2048];  /* the second cluster's stack */
    char second_admin[256]; /* its postgres database */
    char second_url[256];   /* the restored database */
    char *log;              /* stack.sh's and pg_restore's output */
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    fixture_redis_open(&f->first, "stream-restore", "ev");
    f->log = harness_log_path("stream-restore");
    *state = f;
    return 0;
}

/* Stops the second cluster, if any: the run's stop would too, this is sooner. */
static void
second_stop(struct fixture *f)
{
    const char *argv[] = {"sh", "-c", "\"$0\" stop \"$1\" >/dev/null 2>&1", NULL, NULL, NULL};
    char script[2048];

    if (f->second_dir[0] == '\0')
        return;
    snprintf(script, sizeof(script), "%s/tests/harness/stack.sh", harness_env("OUTBOX_SOURCE_DIR"));
    argv[3] = script;
    argv[4] = f->second_dir;
    harness_wait_exit(harness_spawn(argv, f->log), 60000);
    f->second_dir[0] = '\0';
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    second_stop(f);
    fixture_redis_close(&f->first);
    free(f->log);
    free(f);
    return 0;
}

/* Starts a second, freshly initdb'd PostgreSQL and reads its port. */
static void
second_start(struct fixture *f)
{
    const char *argv[] = {"sh", "-c", "\"$0\" start \"$1\" postgres", NULL, NULL, NULL};
    static int started;
    char script[2048], env_path[2100];
    const char *port_line;
    char *env;
    int port;

    /* a directory of its own for each test: stack.sh sets one cluster up once in a directory */
    snprintf(f->second_dir, sizeof(f->second_dir), "%s/restore-%d-%d",
             harness_env("OUTBOX_TEST_STACK_DIR"), (int)getpid(), ++started);
    if (mkdir(f->second_dir, 0755) != 0 && errno != EEXIST)
        fail_msg("unable to create %s: %s", f->second_dir, strerror(errno));
    snprintf(script, sizeof(script), "%s/tests/harness/stack.sh", harness_env("OUTBOX_SOURCE_DIR"));
    argv[3] = script;
    argv[4] = f->second_dir;
    if (harness_wait_exit(harness_spawn(argv, f->log), 120000) != 0)
        fail_msg("the second cluster did not start (see %s)", f->log);
    snprintf(env_path, sizeof(env_path), "%s/env", f->second_dir);
    env = fixture_read_file(env_path);
    port_line = strstr(env, "OUTBOX_TEST_PG_PORT=");
    assert_non_null(port_line);
    port = atoi(port_line + strlen("OUTBOX_TEST_PG_PORT="));
    free(env);
    snprintf(f->second_admin, sizeof(f->second_admin), "postgresql://postgres@127.0.0.1:%d/postgres",
             port);
    snprintf(f->second_url, sizeof(f->second_url), "postgresql://postgres@127.0.0.1:%d/restored",
             port);
}

/* pg_dump -Fc of the first database, restored into a new database of the second cluster. */
static void
dump_and_restore(struct fixture *f)
{
    char command[2048];
    const char *argv[] = {"sh", "-c", command, NULL};
    PGconn *admin = harness_connect(f->second_admin);

    harness_exec(admin, "CREATE DATABASE restored");
    PQfinish(admin);
    snprintf(command, sizeof(command),
             PG_BIN "/pg_dump -Fc '%s' | " PG_BIN "/pg_restore --exit-on-error -d '%s'", f->first.url,
             f->second_url);
    if (harness_wait_exit(harness_spawn(argv, f->log), 120000) != 0)
        fail_msg("pg_dump | pg_restore failed (see %s)", f->log);
}

/* Runs a relay with --once; its log stays in *relay for relay_dump_log() (unlinked by the caller). */
static void
relay_once(const struct fixture *f, const char *url, struct relay_process *relay)
{
    const char *extra[] = {"--once", "--stream-prefix", f->first.prefix, "--batch-size", "100", NULL};

    PGconn *conn = harness_connect(url);

    /*
     * --once publishes what is readable now: the rows' transactions older
     * than every open one. Rows restored from the old cluster carry its
     * transaction ids, beyond this cluster's: they are not waited for.
     */
    wait_for_value(conn,
                   "SELECT count(*) FROM outbox.job"
                   " WHERE state = 'stream' AND xid >= pg_snapshot_xmin(pg_current_snapshot())"
                   " AND xid < pg_snapshot_xmax(pg_current_snapshot())",
                   0, 60000);
    PQfinish(conn);
    relay_start_process(relay, url, f->first.broker, extra);
    if (relay_wait(relay, 60000) != 0) {
        relay_dump_log(relay);
        fail_msg("the relay did not stop cleanly");
    }
}

static void
enqueue(PGconn *conn, int count)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue_batch('ev', array_agg(jsonb_build_object('n', g)),"
             " ordering_keys => array_agg('key-' || (g %% 7)))"
             " FROM generate_series(1, %d) AS g",
             count);
    harness_exec(conn, sql);
}

/* The job ids the Redis stream holds, each once, and how many entries it has. */
static long long
entries_of(struct fixture *f, long long *distinct)
{
    struct stream_consumer_stream stream = {0};
    long long count;

    assert_int_equal(stream_consumer_read_stream(f->first.redis, f->first.stream, &stream), 0);
    count = (long long)stream.count;
    *distinct = 0;
    for (size_t i = 0; i < stream.count; i++) {
        bool seen = false;

        for (size_t j = 0; j < i && !seen; j++)
            seen = stream.entries[j].job_id == stream.entries[i].job_id;
        *distinct += !seen;
    }
    stream_consumer_stream_clear(&stream);
    return count;
}

/*
 * 120 rows published from the first cluster (its transaction ids pushed
 * well above where a new cluster starts), 30 more waiting in it; a dump
 * restored into a fresh cluster, 50 rows enqueued there: the stream ends up
 * with all 200 rows, and no partition of the restored queue has rows left.
 */
static void
test_rows_enqueued_after_a_restore_are_published(void **state)
{
    struct fixture *f = *state;
    struct relay_process first, second;
    PGconn *restored;
    long long count, distinct;

    harness_exec(f->first.conn, "SELECT outbox.stream_enable('ev', 2)");
    for (int i = 0; i < 3000; i++) /* transaction ids the new cluster will not reach */
        harness_query_ll(f->first.conn, "SELECT pg_current_xact_id()::text::bigint");
    enqueue(f->first.conn, 120);
    relay_once(f, f->first.url, &first);
    if (entries_of(f, &distinct) != 120) {
        relay_dump_log(&first);
        fail_msg("the first cluster's relay published %lld rows of 120", distinct);
    }
    unlink(first.log_path);
    enqueue(f->first.conn, 30); /* committed, not yet published when the dump is taken */

    second_start(f);
    dump_and_restore(f);
    restored = harness_connect(f->second_url);
    enqueue(restored, 50);
    relay_once(f, f->second_url, &second);

    count = entries_of(f, &distinct);
    if (distinct != 200) {
        relay_dump_log(&second);
        fail_msg("after the restore the stream holds %lld entries of %lld rows, expected 200 rows",
                 count, distinct);
    }
    unlink(second.log_path);
    /* every row of the restored database is behind its partition's cursor */
    assert_int_equal(harness_query_ll(restored,
                                      "SELECT count(*) FROM outbox.job AS j"
                                      " JOIN outbox.stream_cursor AS c"
                                      "   ON c.queue = j.queue AND c.partition = j.stream_partition"
                                      " WHERE j.state = 'stream'"
                                      "   AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)"),
                     0);
    /* the restored database kept its identity and moved to a new history */
    {
        PGresult *a = PQexec(f->first.conn, "SELECT database_id FROM outbox.identity");
        PGresult *b = PQexec(restored, "SELECT database_id FROM outbox.identity");

        assert_string_equal(PQgetvalue(a, 0, 0), PQgetvalue(b, 0, 0));
        PQclear(a);
        PQclear(b);
    }
    assert_int_equal(harness_query_ll(restored, "SELECT epoch FROM outbox.identity"),
                     harness_query_ll(f->first.conn, "SELECT epoch FROM outbox.identity") + 1);
    PQfinish(restored);
}

/* Whether the file at path holds text. */
static bool
log_has(const char *path, const char *text)
{
    char *log = fixture_read_file(path);
    bool found = strstr(log, text) != NULL;

    free(log);
    return found;
}

/*
 * A cursor of a later history than the database's (the identity restored
 * apart from the cursors): which rows were published cannot be told, so
 * the relay publishes none of its partition, says why, and the rows wait.
 * The other partition goes on.
 */
static void
test_cursor_of_a_later_history_is_refused(void **state)
{
    struct fixture *f = *state;
    struct relay_process relay;
    long long distinct;

    harness_exec(f->first.conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->first.conn, "UPDATE outbox.stream_cursor SET history_epoch = 7 WHERE partition = 0");
    enqueue(f->first.conn, 40);
    relay_once(f, f->first.url, &relay);
    if (!log_has(relay.log_path, "belongs to history epoch 7, after this database's 1")) {
        relay_dump_log(&relay);
        fail_msg("the relay did not say why partition 0 is not published");
    }
    unlink(relay.log_path);
    entries_of(f, &distinct);
    assert_int_equal(distinct, harness_query_ll(f->first.conn, "SELECT count(*) FROM outbox.job"
                                                         " WHERE stream_partition = 1"));
    assert_true(harness_query_ll(f->first.conn, "SELECT count(*) FROM outbox.job"
                                          " WHERE stream_partition = 0") > 0);
    /* waiting: after the cursor, as stream list and status count them */
    assert_int_equal(harness_query_ll(f->first.conn,
                                      "SELECT count(*) FROM outbox.job AS j"
                                      " JOIN outbox.stream_cursor AS c"
                                      "   ON c.queue = j.queue AND c.partition = j.stream_partition"
                                      " WHERE j.state = 'stream'"
                                      "   AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)"),
                     harness_query_ll(f->first.conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE stream_partition = 0"));
}

/*
 * Case 6 of issue 47: keys written in the old cluster keep places of its
 * transaction ids (outbox.stream_key), far above the new cluster's. After
 * the rebase, a new keyed row must be placed at its own transaction again,
 * not lifted to the old cluster's place (where it would wait until the new
 * cluster's transaction ids passed the old one's), and be published.
 */
static void
test_keyed_rows_after_a_restore_are_not_held(void **state)
{
    struct fixture *f = *state;
    struct relay_process first, second, third;
    PGconn *restored;
    long long distinct;

    harness_exec(f->first.conn, "SELECT outbox.stream_enable('ev', 2)");
    for (int i = 0; i < 3000; i++) /* transaction ids the new cluster will not reach */
        harness_query_ll(f->first.conn, "SELECT pg_current_xact_id()::text::bigint");
    enqueue(f->first.conn, 70);
    relay_once(f, f->first.url, &first);
    unlink(first.log_path);
    enqueue(f->first.conn, 14); /* waiting at the dump; their keys' places are the old cluster's */
    assert_true(harness_query_ll(f->first.conn, "SELECT count(*) FROM outbox.stream_key") > 0);

    second_start(f);
    dump_and_restore(f);
    relay_once(f, f->second_url, &second); /* rebases the partitions */
    if (!log_has(second.log_path, "stream partition rebased onto a new database history")) {
        relay_dump_log(&second);
        fail_msg("the relay did not say it rebased the partitions");
    }
    unlink(second.log_path);
    restored = harness_connect(f->second_url);
    enqueue(restored, 21);
    /* placed in the new history: readable as soon as their transactions ended */
    assert_int_equal(harness_query_ll(restored,
                                      "SELECT count(*) FROM outbox.job WHERE state = 'stream'"
                                      " AND xid >= pg_snapshot_xmax(pg_current_snapshot())"),
                     0);
    relay_once(f, f->second_url, &third);
    entries_of(f, &distinct);
    if (distinct != 105) {
        relay_dump_log(&third);
        fail_msg("the stream holds %lld rows, expected 105", distinct);
    }
    unlink(third.log_path);
    PQfinish(restored);
}

/*
 * Case 7 of issue 47, a restore: five keys whose rows committed as 1, 3, 2
 * (job ids in the order 1, 2, 3) wait in the old cluster; restored into a
 * new one where each key gets a row 4 before any relay connects, the rebase
 * places them anew, and each key goes out as 1, 3, 2, 4.
 */
static void
test_key_order_is_kept_across_a_restore(void **state)
{
    struct fixture *f = *state;
    const char *keys[] = {"a", "b", "c", "d", "e"};
    struct relay_process relay;
    PGconn *restored;

    harness_exec(f->first.conn, "SELECT outbox.stream_enable('ev', 2)");
    for (int i = 0; i < 3000; i++) /* transaction ids the new cluster will not reach */
        harness_query_ll(f->first.conn, "SELECT pg_current_xact_id()::text::bigint");
    key_inversion_install(f->first.conn);
    for (size_t k = 0; k < 5; k++)
        key_inversion_make(f->first.conn, f->first.url, keys[k]);
    second_start(f);
    dump_and_restore(f);
    restored = harness_connect(f->second_url);
    for (size_t k = 0; k < 5; k++) { /* a row 4 of each key in the new cluster, before any relay */
        char sql[160];

        snprintf(sql, sizeof(sql),
                 "SELECT outbox.enqueue('ev', '{\"k\": \"%s\", \"n\": 4}', ordering_key => '%s')",
                 keys[k], keys[k]);
        harness_exec(restored, sql);
    }
    PQfinish(restored);
    relay_once(f, f->second_url, &relay);
    unlink(relay.log_path);
    key_inversion_assert_kept(f->first.redis, f->first.stream, keys, 5, "1324");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cursor_of_a_later_history_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_enqueued_after_a_restore_are_published, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_keyed_rows_after_a_restore_are_not_held, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_key_order_is_kept_across_a_restore, setup, teardown),
    };

    return cmocka_run_group_tests_name("stream_restore", tests, NULL, NULL);
}
