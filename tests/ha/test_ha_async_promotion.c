/*
 * test_ha_async_promotion.c - an asynchronous standby promoted while it
 * lagged: the relay had published rows the standby never received, so the
 * new primary hands out their job ids (and transaction ids) again. Rows
 * committed on the new primary after the switch must all be published,
 * none taken for a duplicate of the old primary's, in row-state mode and
 * in a stream, here to Redis (whose dedup and order records outlive the
 * switch by 24 h).
 *
 * A primary with a streaming standby (stack.sh postgres-standby, made
 * asynchronous here), cut off from the primary before the second batch of
 * rows; the relay publishes through libpq's multi-host URL with
 * target_session_attrs=read-write, then the primary dies and the standby
 * is promoted.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ha_common.h"
#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define FIRST_ROWS 100   /* published by the old primary and received by the standby */
#define LOST_ROWS 300    /* published by the old primary, never received by the standby */
#define AFTER_ROWS 300   /* committed on the new primary */

struct fixture {
    char *url;
    char database[64];
    char ha_url[512];
    char standby_url[256];
    const char *broker;
    char prefix[64];
    redisContext *redis;
    struct relay_process last; /* the last relay_once's, its log kept until the checks */
};

static int
setup(void **state)
{
    const char *const services[] = {"postgres", "postgres-standby", NULL};
    struct fixture *f = calloc(1, sizeof(*f));
    const char *slash;
    PGconn *conn;

    assert_non_null(f);
    ha_start_servers("postgres-async-promotion", services);
    f->url = harness_database_new();
    slash = strrchr(f->url, '/');
    assert_non_null(slash);
    snprintf(f->database, sizeof(f->database), "%.*s", (int)strcspn(slash + 1, "?"), slash + 1);
    snprintf(f->ha_url, sizeof(f->ha_url),
             "postgresql://postgres@127.0.0.1:%s,127.0.0.1:%s/%s?target_session_attrs=read-write",
             harness_env("OUTBOX_TEST_PG_PORT"), harness_env("OUTBOX_TEST_PG_STANDBY_PORT"),
             f->database);
    snprintf(f->standby_url, sizeof(f->standby_url), "postgresql://postgres@127.0.0.1:%s/%s",
             harness_env("OUTBOX_TEST_PG_STANDBY_PORT"), f->database);
    /* asynchronous: commits no longer wait for the standby */
    conn = harness_connect(f->url);
    harness_exec(conn, "ALTER SYSTEM SET synchronous_standby_names = ''");
    harness_exec(conn, "SELECT pg_reload_conf()");
    PQfinish(conn);
    f->broker = harness_env("OUTBOX_TEST_REDIS_URL");
    f->redis = stream_consumer_connect(f->broker);
    assert_non_null(f->redis);
    snprintf(f->prefix, sizeof(f->prefix), "ha-async-%d:", (int)getpid());
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    char tagged[80];

    stream_consumer_delete_prefix(f->redis, f->prefix);
    snprintf(tagged, sizeof(tagged), "{%s", f->prefix);
    stream_consumer_delete_prefix(f->redis, tagged);
    redisFree(f->redis);
    if (f->last.log_path[0] != '\0')
        unlink(f->last.log_path);
    free(f->url);
    free(f);
    ha_stop_servers();
    return 0;
}

static void
enqueue(PGconn *conn, const char *queue, int count)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue_batch('%s', array_agg(jsonb_build_object('n', g)),"
             " ordering_keys => array_agg('key-' || (g %% 5)))"
             " FROM generate_series(1, %d) AS g",
             queue, count);
    harness_exec(conn, sql);
}

/* Publishes what is publishable now, through the multi-host URL. */
static void
relay_once(struct fixture *f, PGconn *conn)
{
    const char *extra[] = {"--once", "--stream-prefix", f->prefix, "--batch-size", "50", NULL};
    struct relay_process relay;

    wait_for_value(conn,
                   "SELECT count(*) FROM outbox.job"
                   " WHERE state = 'stream' AND xid >= pg_snapshot_xmin(pg_current_snapshot())",
                   0, 60000);
    if (f->last.log_path[0] != '\0')
        unlink(f->last.log_path);
    relay_start_process(&relay, f->ha_url, f->broker, extra);
    if (relay_wait(&relay, 120000) != 0) {
        relay_dump_log(&relay);
        fail_msg("the relay did not stop cleanly");
    }
    f->last = relay;
}

/*
 * How many of the rows of queue committed on conn's database since
 * (created_at after it) the stream prefix + queue holds, under the message
 * id the database gives them now; *rows receives how many there are.
 */
static long long
published_since(struct fixture *f, PGconn *conn, const char *queue, const char *since,
                long long *rows)
{
    struct stream_consumer_stream stream = {0};
    const char *values[2] = {queue, since};
    char key[160];
    long long found = 0;
    PGresult *result = PQexecParams(conn,
                                    "SELECT i.database_id || ':' || i.epoch || ':' || j.job_id"
                                    " FROM outbox.job AS j, outbox.identity AS i"
                                    " WHERE j.queue = $1 AND j.created_at > $2::timestamptz",
                                    2, NULL, values, NULL, NULL, 0);

    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    snprintf(key, sizeof(key), "%s%s", f->prefix, queue);
    assert_int_equal(stream_consumer_read_stream(f->redis, key, &stream), 0);
    *rows = PQntuples(result);
    for (int r = 0; r < PQntuples(result); r++) {
        bool seen = false;

        for (size_t e = 0; e < stream.count && !seen; e++)
            seen = stream.entries[e].message_id != NULL &&
                   strcmp(stream.entries[e].message_id, PQgetvalue(result, r, 0)) == 0;
        found += seen;
    }
    PQclear(result);
    stream_consumer_stream_clear(&stream);
    return found;
}

static void
test_rows_committed_after_an_async_promotion_are_published(void **state)
{
    struct fixture *f = *state;
    const char *const crash[] = {"crash-primary", NULL};
    const char *const promote[] = {"promote-standby", NULL};
    PGconn *primary = harness_connect(f->url), *standby, *promoted;
    char switched[64];
    long long rows, found;
    PGresult *now;

    harness_exec(primary, "SELECT outbox.stream_enable('ev-stream', 2)");
    enqueue(primary, "ev-row", FIRST_ROWS);
    enqueue(primary, "ev-stream", FIRST_ROWS);
    relay_once(f, primary);
    /* the standby has all of it, then is cut off: it receives nothing more */
    wait_for_value(primary,
                   "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn < pg_current_wal_lsn()",
                   0, 30000);
    standby = harness_connect(f->standby_url);
    harness_exec(standby, "ALTER SYSTEM SET primary_conninfo = ''");
    harness_exec(standby, "SELECT pg_reload_conf()");
    PQfinish(standby);
    assert_int_equal(wait_for_value(primary, "SELECT count(*) FROM pg_stat_replication", 0, 30000),
                     0);

    enqueue(primary, "ev-row", LOST_ROWS);
    enqueue(primary, "ev-stream", LOST_ROWS);
    relay_once(f, primary);
    assert_int_equal(harness_query_ll(primary, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev-row' AND state = 'succeeded'"),
                     FIRST_ROWS + LOST_ROWS);
    PQfinish(primary);

    ha_stack(crash);
    ha_stack(promote);
    promoted = harness_connect(f->standby_url);
    wait_for_value(promoted, "SELECT pg_is_in_recovery()::int", 0, 30000);
    now = PQexec(promoted, "SELECT clock_timestamp()::text");
    snprintf(switched, sizeof(switched), "%s", PQgetvalue(now, 0, 0));
    PQclear(now);
    enqueue(promoted, "ev-row", AFTER_ROWS);
    enqueue(promoted, "ev-stream", AFTER_ROWS);
    {
        char sql[160];

        snprintf(sql, sizeof(sql), "SELECT min(job_id) FROM outbox.job WHERE created_at > '%s'",
                 switched);
        printf("ha: the new primary's job ids start at %lld; the old primary published up to %lld\n",
               harness_query_ll(promoted, sql), (long long)2 * (FIRST_ROWS + LOST_ROWS));
    }
    relay_once(f, promoted);

    found = published_since(f, promoted, "ev-row", switched, &rows);
    printf("ha: row-state: %lld of %lld rows committed after the promotion published\n", found,
           rows);
    if (found != AFTER_ROWS)
        relay_dump_log(&f->last); /* what the relay saw of the new primary */
    assert_int_equal(rows, AFTER_ROWS);
    assert_int_equal(found, AFTER_ROWS);
    found = published_since(f, promoted, "ev-stream", switched, &rows);
    printf("ha: stream: %lld of %lld rows committed after the promotion published\n", found, rows);
    assert_int_equal(rows, AFTER_ROWS);
    assert_int_equal(found, AFTER_ROWS);
    PQfinish(promoted);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rows_committed_after_an_async_promotion_are_published,
                                        setup, teardown),
    };

    return cmocka_run_group_tests_name("ha_async_promotion", tests, NULL, NULL);
}
