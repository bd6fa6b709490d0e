/*
 * test_ha_postgres.c - the relay follows a PostgreSQL standby promotion.
 *
 * A primary with a synchronous streaming standby (stack.sh postgres-standby)
 * and one RabbitMQ node. Producers and the relay reach the database through
 * libpq's multi-host URL with target_session_attrs=read-write, so whichever
 * server accepts writes is the one they use. Mid-run the primary stops
 * dead (pg_ctl stop -m immediate) and the standby is promoted. Because the
 * standby is synchronous, every commit a producer saw succeed is on it;
 * the test demands that each of those rows ends succeeded on the new
 * primary and reached the broker, that the relay logged the switch, and
 * that the audit trigger of tests/chaos saw no fenced write by anyone but
 * the row's owner. It prints what the failover cost.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amqp_consumer.h"
#include "chaos.h"
#include "ha_common.h"
#include "harness.h"
#include "outbox.h"
#include "relay_runner.h"

#define ROWS 20000
#define ROWS_PER_COMMIT 100
#define CONCURRENCY 2
/* the relay writes on the promoted standby within this of the primary's crash */
#define SWITCH_LIMIT_SECONDS 30.0

struct fixture {
    char *url;         /* the test database on the primary, for harness_database_drop */
    char database[64]; /* its name */
    char ha_url[512];  /* both servers, read-write wanted */
    PGconn *conn;      /* to the primary, then to the promoted standby */
    const char *broker;
    char queue[64];
};

/* Each test crashes its primary: each gets a primary and a standby of its own. */
static int
setup(void **state, const char *stack_name)
{
    const char *const services[] = {"postgres", "postgres-standby", NULL};
    struct fixture *f = calloc(1, sizeof(*f));
    const char *slash;
    queue_consumer *mq;

    assert_non_null(f);
    ha_start_servers(stack_name, services);
    printf("ha: primary 127.0.0.1:%s, standby 127.0.0.1:%s\n", harness_env("OUTBOX_TEST_PG_PORT"),
           harness_env("OUTBOX_TEST_PG_STANDBY_PORT"));
    f->url = harness_database_new();
    slash = strrchr(f->url, '/');
    assert_non_null(slash);
    snprintf(f->database, sizeof(f->database), "%.*s", (int)strcspn(slash + 1, "?"), slash + 1);
    snprintf(f->ha_url, sizeof(f->ha_url),
             "postgresql://postgres@127.0.0.1:%s,127.0.0.1:%s/%s?target_session_attrs=read-write",
             harness_env("OUTBOX_TEST_PG_PORT"), harness_env("OUTBOX_TEST_PG_STANDBY_PORT"),
             f->database);
    f->conn = harness_connect(f->url);
    chaos_audit_install(f->conn);
    f->broker = harness_env("OUTBOX_TEST_AMQP_URL");
    snprintf(f->queue, sizeof(f->queue), "ha-pg-%d", (int)getpid());
    mq = queue_consumer_connect(f->broker);
    assert_non_null(mq);
    assert_int_equal(queue_consumer_declare_queue(mq, f->queue), 0);
    queue_consumer_free(mq);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    /* the servers go with the stack; the old primary is down and the database with it */
    PQfinish(f->conn);
    free(f->url);
    free(f);
    ha_stop_servers();
    return 0;
}

static int
setup_promotion(void **state)
{
    return setup(state, "postgres-promotion");
}

static int
setup_fencing(void **state)
{
    return setup(state, "postgres-fencing");
}

/* A URL to the test database on the standby's port alone. */
static void
standby_url(const struct fixture *f, char *out, size_t size)
{
    snprintf(out, size, "postgresql://postgres@127.0.0.1:%s/%s",
             harness_env("OUTBOX_TEST_PG_STANDBY_PORT"), f->database);
}

/* The number of acknowledged ids missing from the database of conn. */
static long long
missing_ids(PGconn *conn, const struct ha_producer *producer)
{
    size_t size = (size_t)producer->committed * 21 + 3, n = 0;
    char *array = malloc(size);
    const char *values[1];
    PGresult *result;
    long long missing;

    assert_non_null(array);
    array[n++] = '{';
    for (long long i = 0; i < producer->committed; i++)
        n += (size_t)snprintf(array + n, size - n, "%s%lld", i > 0 ? "," : "",
                              producer->committed_ids[i]);
    array[n++] = '}';
    array[n] = '\0';
    values[0] = array;
    result = PQexecParams(conn,
                          "SELECT count(*) FROM unnest($1::bigint[]) AS a(id)"
                          " WHERE NOT EXISTS (SELECT 1 FROM outbox.job j WHERE j.job_id = a.id)",
                          1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("counting missing rows: %s", PQerrorMessage(conn));
    missing = strtoll(PQgetvalue(result, 0, 0), NULL, 10);
    PQclear(result);
    free(array);
    return missing;
}

/*
 * 20 000 rows committed at a steady pace through the multi-host URL; the
 * primary dies a quarter of the way through and the standby is promoted.
 */
static void
test_standby_promotion_mid_run(void **state)
{
    struct fixture *f = *state;
    struct relay_process relay;
    struct ha_producer producer = {.queue = f->queue, .total = ROWS,
                                   .rows_per_commit = ROWS_PER_COMMIT, .pause_ms = 20};
    struct ha_delivery delivery;
    char relay_url[600], concurrency[8], line[2048], promoted_url[512], server[64];
    const char *extra[] = {"--queues", f->queue, "--concurrency", concurrency, NULL};
    const char *const crash[] = {"crash-primary", NULL};
    const char *const promote[] = {"promote-standby", NULL};
    double crash_at, promoted_at, worst = 0;
    long long succeeded_before;

    /* application_name names the relay in the audit table */
    snprintf(relay_url, sizeof(relay_url), "%s&application_name=relay-ha", f->ha_url);
    snprintf(concurrency, sizeof(concurrency), "%d", CONCURRENCY);
    snprintf(server, sizeof(server), "server=127.0.0.1:%s",
             harness_env("OUTBOX_TEST_PG_STANDBY_PORT"));
    producer.database_url = f->ha_url;
    relay_start_process(&relay, relay_url, f->broker, extra);
    ha_producer_start(&producer);

    if (wait_for_value(f->conn, "SELECT least(count(*), 5000) FROM outbox.job"
                                " WHERE state = 'succeeded'",
                       ROWS / 4, 120000) != ROWS / 4) {
        relay_dump_log(&relay);
        fail_msg("a quarter of the rows did not get through within 120 s");
    }
    succeeded_before = harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                                 " WHERE state = 'succeeded'");
    PQfinish(f->conn);
    f->conn = NULL;
    crash_at = wall_clock_seconds();
    ha_stack(crash);
    ha_stack(promote);
    promoted_at = wall_clock_seconds();
    printf("ha: primary stopped -m immediate after %lld rows succeeded; standby promoted"
           " %.2f s later\n",
           succeeded_before, promoted_at - crash_at);
    standby_url(f, promoted_url, sizeof(promoted_url));
    f->conn = harness_connect(promoted_url);

    /* every pipeline logs its connection to the promoted server */
    for (int p = 0; p < CONCURRENCY; p++) {
        char pipeline[32];
        const char *needles[] = {"database connected", pipeline, server, NULL};
        double at = -1;

        snprintf(pipeline, sizeof(pipeline), "pipeline=%d ", p);
        for (int waited = 0; at < 0 && waited < 60000; waited += 100) {
            usleep(100 * 1000);
            at = relay_log_find(&relay, crash_at, false, needles, line, sizeof(line));
        }
        if (at < 0) {
            relay_dump_log(&relay);
            fail_msg("pipeline %d did not log a connection to the promoted standby", p);
        }
        printf("ha: pipeline %d connected to the promoted standby %.2f s after the crash\n", p,
               at - crash_at);
        if (at - crash_at > worst)
            worst = at - crash_at;
    }
    if (worst > SWITCH_LIMIT_SECONDS) {
        relay_dump_log(&relay);
        fail_msg("the relay took %.1f s to switch, more than %.0f s", worst, SWITCH_LIMIT_SECONDS);
    }

    ha_producer_join(&producer);
    if (producer.error[0] != '\0')
        fail_msg("%s", producer.error);
    /* synchronous replication: nothing a producer saw committed is missing */
    assert_int_equal(missing_ids(f->conn, &producer), 0);
    if (wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'", 0,
                       180000) != 0) {
        relay_dump_log(&relay);
        fail_msg("rows left unsucceeded on the promoted standby 180 s after the last commit");
    }
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);
    {
        /* the new connections prepared their own statements */
        const char *const unprepared[] = {"prepared statement", NULL};

        if (relay_log_find(&relay, 0, false, unprepared, line, sizeof(line)) >= 0)
            fail_msg("the relay used a statement it had not prepared: %s", line);
    }

    /* no fenced write by anyone but the row's owner, before its lease ended */
    assert_int_equal(chaos_audit_violations(f->conn), 0);

    ha_drain_amqp(f->conn, f->broker, f->queue, &delivery);
    printf("ha: postgres promotion: %lld acknowledged + %lld in doubt, %lld rows on the new"
           " primary, %lld messages, %lld distinct, %lld duplicates, %lld strays; relay"
           " switched within %.2f s\n",
           producer.committed, producer.in_doubt, delivery.rows, delivery.messages,
           delivery.unique, delivery.duplicates, delivery.strays, worst);
    assert_true(delivery.rows >= producer.committed);
    assert_int_equal(delivery.unique, delivery.rows);
    assert_int_equal(delivery.strays, 0);
    ha_producer_clear(&producer);
    unlink(relay.log_path);
}

/*
 * Connects to url on the standby. A synchronous commit waits for the
 * standby to flush, not to replay, so the test database may not be there
 * yet: retries for at most 30 s.
 */
static PGconn *
connect_standby(const char *url)
{
    for (int waited = 0; waited < 30000; waited += 100) {
        PGconn *conn = PQconnectdb(url);

        if (PQstatus(conn) == CONNECTION_OK)
            return conn;
        PQfinish(conn);
        usleep(100 * 1000);
    }
    return harness_connect(url); /* fails the test with libpq's reason */
}

/* Polls conn until sql's first column reaches expected (at most 30 s); fails the test otherwise. */
static void
wait_for(PGconn *conn, const char *sql, long long expected, const char *what)
{
    if (wait_for_value(conn, sql, expected, 30000) != expected)
        fail_msg("%s: '%s' did not reach %lld within 30 s", what, sql, expected);
}

/*
 * A relay that claimed rows on the old primary comes back after the
 * promotion (its connection follows the multi-host URL to the new primary)
 * and tries to mark them, after their leases ran out and another relay
 * claimed them again on the new primary: its marks change nothing, and
 * the rows end succeeded by their new owner alone.
 */
static void
test_stale_relay_marks_nothing_after_promotion(void **state)
{
    struct fixture *f = *state;
    enum { ROWS_CLAIMED = 20, STALE_LEASE_SECONDS = 2 };
    const char *const crash[] = {"crash-primary", NULL};
    const char *const promote[] = {"promote-standby", NULL};
    char url_a[600], url_b[600], promoted_url[512];
    struct outbox_batch stale = {0}, fresh = {0};
    struct outbox_lease leases[ROWS_CLAIMED];
    bool done[ROWS_CLAIMED];
    struct outbox_reap_result reaped;
    struct outbox_error err;
    outbox_store *a, *b;
    PGconn *standby;
    size_t changed = 99;

    snprintf(url_a, sizeof(url_a), "%s&application_name=relay-a", f->ha_url);
    snprintf(url_b, sizeof(url_b), "%s&application_name=relay-b", f->ha_url);
    enqueue_rows(f->conn, f->queue, ROWS_CLAIMED);

    /* relay A claims every row on the primary, with a short lease */
    a = outbox_store_connect(url_a, "relay-a/0", &err);
    if (a == NULL)
        fail_msg("relay A: %s", err.message);
    assert_int_equal(outbox_claim(a, NULL, 0, ROWS_CLAIMED, STALE_LEASE_SECONDS, &stale, &err), 0);
    assert_int_equal(stale.count, ROWS_CLAIMED);
    for (size_t i = 0; i < stale.count; i++)
        leases[i] = (struct outbox_lease){stale.jobs[i].job_id, stale.jobs[i].generation};

    /* the claim reached the standby (A's session commits without waiting for it) */
    standby_url(f, promoted_url, sizeof(promoted_url));
    standby = connect_standby(promoted_url);
    wait_for(standby, "SELECT count(*) FROM outbox.job WHERE state = 'running'", ROWS_CLAIMED,
             "the claim on the standby");

    PQfinish(f->conn);
    f->conn = NULL;
    ha_stack(crash);
    ha_stack(promote);
    f->conn = standby;
    wait_for(f->conn, "SELECT count(*) FROM pg_stat_activity WHERE pg_is_in_recovery()", 0,
             "the promotion");

    /* A's leases run out; relay B reaps them on the new primary and claims the rows again */
    usleep((STALE_LEASE_SECONDS + 1) * 1000 * 1000);
    b = outbox_store_connect(url_b, "relay-b/0", &err);
    if (b == NULL)
        fail_msg("relay B: %s", err.message);
    assert_int_equal(outbox_reap(b, 100, 0, &reaped, &err), 0);
    assert_int_equal(reaped.ready, ROWS_CLAIMED);
    assert_int_equal(outbox_claim(b, NULL, 0, ROWS_CLAIMED, 60, &fresh, &err), 0);
    assert_int_equal(fresh.count, ROWS_CLAIMED);

    /* A's connection died with the old primary; reconnected, it lands on the new one */
    assert_int_equal(outbox_complete(a, leases, ROWS_CLAIMED, done, &changed, &err), -1);
    assert_true(outbox_error_is_transient(&err));
    outbox_store_free(a);
    a = outbox_store_connect(url_a, "relay-a/0", &err);
    if (a == NULL)
        fail_msg("relay A again: %s", err.message);
    changed = 99;
    assert_int_equal(outbox_complete(a, leases, ROWS_CLAIMED, done, &changed, &err), 0);
    assert_int_equal(changed, 0);
    for (size_t i = 0; i < ROWS_CLAIMED; i++)
        assert_false(done[i]);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'running' AND worker_id = 'relay-b/0'"),
                     ROWS_CLAIMED);

    /* the new owner marks them */
    for (size_t i = 0; i < fresh.count; i++)
        leases[i] = (struct outbox_lease){fresh.jobs[i].job_id, fresh.jobs[i].generation};
    assert_int_equal(outbox_complete(b, leases, ROWS_CLAIMED, done, &changed, &err), 0);
    assert_int_equal(changed, ROWS_CLAIMED);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     ROWS_CLAIMED);
    /* the audit on the new primary: A changed no running row, nobody wrote out of turn */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM chaos_audit"
                                               " WHERE old_state = 'running' AND actor = 'relay-a'"),
                     0);
    assert_int_equal(chaos_audit_violations(f->conn), 0);
    printf("ha: the stale relay marked 0 of %d rows on the promoted standby; the new owner %d\n",
           ROWS_CLAIMED, ROWS_CLAIMED);

    outbox_batch_release_memory(&stale);
    outbox_batch_release_memory(&fresh);
    outbox_store_free(a);
    outbox_store_free(b);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_standby_promotion_mid_run, setup_promotion,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stale_relay_marks_nothing_after_promotion,
                                        setup_fencing, teardown),
    };

    return cmocka_run_group_tests_name("ha_postgres", tests, NULL, NULL);
}
