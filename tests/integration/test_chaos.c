/*
 * test_chaos.c - the bounded fault-injection run of `make test`: the chaos
 * driver (tests/chaos/chaos.h) against RabbitMQ, then against Redis, each
 * with faults for OUTBOX_CHAOS_SECONDS (default 50) plus the drain, then
 * against Redis once more with relays that delete rows at completion
 * (--on-success delete; default 30 s of faults).
 *
 * OUTBOX_CHAOS_SEED replays a schedule; OUTBOX_CHAOS_BROKERS (rabbitmq,
 * redis or both, the default) picks the runs; `make soak` runs this binary
 * longer with OUTBOX_CHAOS_SOAK=1.
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

#include "chaos.h"
#include "harness.h"
#include "outbox.h"
#include "relay_runner.h"

#define DEFAULT_SECONDS 50
#define DEFAULT_SECONDS_DELETE 30

/*
 * True when OUTBOX_CHAOS_BROKERS leaves this broker in (unset: both). Not
 * under valgrind (make valgrind): relays that slow cannot drain in bounded
 * time, and the ASan build covers memory errors of a chaos run.
 */
static bool
broker_selected(const char *name)
{
    const char *brokers = getenv("OUTBOX_CHAOS_BROKERS");

    if (getenv("OUTBOX_VALGRIND") != NULL && *getenv("OUTBOX_VALGRIND") != '\0')
        return false;

    return brokers == NULL || *brokers == '\0' || strstr(brokers, name) != NULL;
}

/* Connects a worker whose session carries application_name, as the driver's relays do. */
static outbox_store *
worker_connect(const char *url, const char *name)
{
    struct outbox_error err;
    char with_name[600];
    outbox_store *store;

    snprintf(with_name, sizeof(with_name), "%s?application_name=%s", url, name);
    store = outbox_store_connect(with_name, name, &err);
    if (store == NULL)
        fail_msg("%s", err.message);
    return store;
}

/*
 * The verdict's audit is only worth something if it catches what it looks
 * for: a stale owner's write (after its lease ended, or after another
 * worker re-claimed the row), while the store's own fenced writes pass.
 */
static void
test_audit_catches_stale_writes(void **state)
{
    char *url = harness_database_new();
    PGconn *conn = harness_connect(url), *stale;
    outbox_store *a, *b;
    struct outbox_batch batch;
    struct outbox_lease lease;
    struct outbox_reap_result reaped;
    struct outbox_error err;
    char stale_url[600];
    bool done = true;

    (void)state;
    chaos_audit_install(conn);
    enqueue_rows(conn, "audit", 2);
    a = worker_connect(url, "worker-a");
    b = worker_connect(url, "worker-b");

    /* a claims both rows with a 1 s lease, then stalls past it */
    assert_int_equal(outbox_claim(a, NULL, 0, 2, 1, &batch, &err), 0);
    assert_int_equal(batch.count, 2);
    lease = (struct outbox_lease){batch.jobs[0].job_id, batch.jobs[0].generation};
    outbox_batch_release_memory(&batch);
    usleep(1300 * 1000);

    /* b reaps and re-claims; a's fenced complete must change nothing */
    assert_int_equal(outbox_reap(b, 10, 0, &reaped, &err), 0);
    assert_int_equal(reaped.ready, 2);
    assert_int_equal(outbox_claim(b, NULL, 0, 1, 30, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    outbox_batch_release_memory(&batch);
    assert_int_equal(outbox_complete(a, &lease, 1, &done, NULL, &err), 0);
    assert_false(done);
    assert_int_equal(chaos_audit_violations(conn), 0);

    /* a write that skips the fence, from a's session, is caught */
    snprintf(stale_url, sizeof(stale_url), "%s?application_name=worker-a", url);
    stale = harness_connect(stale_url);
    harness_exec(stale, "UPDATE outbox.job SET state = 'succeeded', worker_id = NULL,"
                        " lease_until = NULL, finished_at = now() WHERE state = 'running'");
    assert_int_equal(chaos_audit_violations(conn), 1);

    /* --on-success delete: the owner's delete passes, a delete that skips the fence is caught */
    outbox_store_set_delete_on_success(b, true);
    assert_int_equal(outbox_claim(b, NULL, 0, 1, 30, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    lease = (struct outbox_lease){batch.jobs[0].job_id, batch.jobs[0].generation};
    outbox_batch_release_memory(&batch);
    assert_int_equal(outbox_complete(b, &lease, 1, &done, NULL, &err), 0);
    assert_true(done);
    assert_int_equal(harness_query_ll(conn,
                                      "SELECT count(*) FROM chaos_audit"
                                      " WHERE old_state = 'running' AND new_state = 'deleted'"),
                     1);
    assert_int_equal(chaos_audit_violations(conn), 1);
    enqueue_rows(conn, "audit", 1);
    assert_int_equal(outbox_claim(b, NULL, 0, 1, 30, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    outbox_batch_release_memory(&batch);
    harness_exec(stale, "DELETE FROM outbox.job WHERE state = 'running'");
    assert_int_equal(chaos_audit_violations(conn), 2);

    PQfinish(stale);
    outbox_store_free(a);
    outbox_store_free(b);
    PQfinish(conn);
    harness_database_drop(url);
}

static void
test_chaos_rabbitmq(void **state)
{
    struct chaos_options options;

    (void)state;
    if (!broker_selected("rabbitmq"))
        skip();
    chaos_options_from_env(&options, CHAOS_RABBITMQ, DEFAULT_SECONDS);
    assert_true(chaos_run(&options));
}

static void
test_chaos_redis(void **state)
{
    struct chaos_options options;

    (void)state;
    if (!broker_selected("redis"))
        skip();
    chaos_options_from_env(&options, CHAOS_REDIS, DEFAULT_SECONDS);
    assert_true(chaos_run(&options));
}

static void
test_chaos_redis_on_success_delete(void **state)
{
    struct chaos_options options;

    (void)state;
    if (!broker_selected("redis"))
        skip();
    chaos_options_from_env(&options, CHAOS_REDIS, DEFAULT_SECONDS_DELETE);
    options.delete_on_success = true;
    assert_true(chaos_run(&options));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_audit_catches_stale_writes),
        cmocka_unit_test(test_chaos_rabbitmq),
        cmocka_unit_test(test_chaos_redis),
        cmocka_unit_test(test_chaos_redis_on_success_delete),
    };

    return cmocka_run_group_tests_name("chaos", tests, NULL, NULL);
}
