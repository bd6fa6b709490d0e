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

#include "harness.h"
#include "key_inversion.h"
#include "redis_consumer.h"
#include "relay_runner.h"

struct fixture {
    char *url;
    PGconn *conn;
    redisContext *redis;
    const char *broker;
    char prefix[64];
    char stream[96];
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->broker = harness_env("OUTBOX_TEST_REDIS_URL");
    f->redis = stream_consumer_connect(f->broker);
    assert_non_null(f->redis);
    snprintf(f->prefix, sizeof(f->prefix), "stream-history-%d:", (int)getpid());
    snprintf(f->stream, sizeof(f->stream), "%sev", f->prefix);
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
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
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
    struct fixture *f = *state;
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
    key_inversion_assert_kept(f->redis, f->stream, keys, 5);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_key_order_is_kept_across_a_rebase, setup, teardown),
    };

    return cmocka_run_group_tests_name("stream_history", tests, NULL, NULL);
}
