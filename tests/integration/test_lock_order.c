/*
 * test_lock_order.c - the relay's statements that wait for row locks take
 * them in one order, so two relays never deadlock on outbox.job.
 *
 * A mark (complete, fail) releases the next waiting row of each key it
 * finishes, and the sweep of waiting rows releases the first waiting row of
 * keys whose head has finished: both lock waiting rows. Each scenario holds
 * one waiting row locked from a third session so that the first statement
 * stops halfway, lets the second run into the rows the first has not reached
 * yet, then lets the first go on. Taken in different orders, the two would
 * wait on each other and PostgreSQL would kill one with "deadlock detected".
 *
 * Each test runs on a fresh database cloned from the migrated template.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "outbox.h"

/* Three keys; the sweep walks them in this (text) order. */
#define KEYS 3
static const char *const key_names[KEYS] = {"key-a", "key-b", "key-c"};

struct fixture {
    char *url;
    PGconn *conn;    /* inspector, and the one who crafts rows */
    PGconn *blocker; /* holds a waiting row locked */
    outbox_store *relay_a;
    outbox_store *relay_b;
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    struct outbox_error err;

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    /* a table with a history, planned as in production: by its indexes */
    harness_exec(f->conn,
                 "INSERT INTO outbox.job (queue, payload, ordering_key, state, finished_at)"
                 " SELECT 'history', '{}', 'key-' || i % 1000, 'succeeded', now()"
                 " FROM generate_series(1, 50000) AS i");
    f->blocker = harness_connect(f->url);
    f->relay_a = outbox_store_connect(f->url, "relay-a", &err);
    assert_non_null(f->relay_a);
    f->relay_b = outbox_store_connect(f->url, "relay-b", &err);
    assert_non_null(f->relay_b);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    outbox_store_free(f->relay_a);
    outbox_store_free(f->relay_b);
    PQfinish(f->blocker);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* Inserts one row of key (held or not) and returns its job id. */
static long long
insert_row(PGconn *conn, const char *key, bool held)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "INSERT INTO outbox.job (queue, payload, ordering_key, held)"
             " VALUES ('q', '{}', '%s', %s) RETURNING job_id",
             key, held ? "true" : "false");
    return harness_query_ll(conn, sql);
}

/*
 * Makes row job_id a row that worker claimed (generation 1), its lease
 * ending in an hour and seconds.
 */
static void
make_running(PGconn *conn, long long job_id, const char *worker, int seconds)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "UPDATE outbox.job SET state = 'running', attempts = 1, worker_id = '%s',"
             " lease_until = now() + make_interval(hours => 1, secs => %d) WHERE job_id = %lld",
             worker, seconds, job_id);
    harness_exec(conn, sql);
}

/* Sessions of this database waiting for a lock right now. */
static long long
lock_waiters(PGconn *conn)
{
    return harness_query_ll(conn,
                            "SELECT count(*) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND wait_event_type = 'Lock'");
}

/* Waits up to 10 s until count sessions wait for a lock. */
static void
await_lock_waiters(PGconn *conn, long long count)
{
    struct timespec pause = {0, 20 * 1000 * 1000};

    for (int i = 0; i < 500; i++) {
        if (lock_waiters(conn) >= count)
            return;
        nanosleep(&pause, NULL);
    }
    fail_msg("%lld sessions never waited for a lock", count);
}

struct call {
    outbox_store *store;
    const struct outbox_lease *leases; /* complete these; NULL: sweep */
    size_t count;
    size_t changed;
    int rc;
    struct outbox_error err;
};

static void *
run_call(void *arg)
{
    struct call *c = arg;
    bool done[KEYS];

    if (c->leases != NULL)
        c->rc = outbox_complete(c->store, c->leases, c->count, done, &c->changed, &c->err);
    else
        c->rc = outbox_release_waiting(c->store, 1000, &c->changed, &c->err);
    return NULL;
}

/*
 * Runs first until it waits for the row job_id, which the blocker holds,
 * then second until it waits too, then lets the blocker go; both must end
 * without an error.
 */
static void
meet(struct fixture *f, long long job_id, struct call *first, struct call *second)
{
    pthread_t first_thread, second_thread;
    char sql[160];

    harness_exec(f->blocker, "BEGIN");
    snprintf(sql, sizeof(sql), "SELECT 1 FROM outbox.job WHERE job_id = %lld FOR UPDATE", job_id);
    harness_exec(f->blocker, sql);
    assert_int_equal(pthread_create(&first_thread, NULL, run_call, first), 0);
    await_lock_waiters(f->conn, 1);
    assert_int_equal(pthread_create(&second_thread, NULL, run_call, second), 0);
    await_lock_waiters(f->conn, 2);
    harness_exec(f->blocker, "COMMIT");
    pthread_join(first_thread, NULL);
    pthread_join(second_thread, NULL);
    if (first->rc != 0)
        fail_msg("%s: %s", first->leases ? "complete" : "sweep", first->err.message);
    if (second->rc != 0)
        fail_msg("%s: %s", second->leases ? "complete" : "sweep", second->err.message);
}

/*
 * The scenario. Each key has a waiting row whose key has no unfinished row
 * before it, so the sweep frees all three, in the keys' order; key-a and
 * key-c also have a later row in flight (claimed while the waiting row's
 * insert was not yet committed) that relay-a completes, so the mark frees
 * their waiting rows too. held_ids_ascending says whether the waiting rows'
 * job ids follow the keys' order. mark_key_c_first puts key-c's row first
 * among the leases and in lease expiry, the two orders a mark used to free
 * waiting rows in (whichever its plan followed): against the sweep's.
 */
static void
mark_and_sweep_meet(struct fixture *f, bool held_ids_ascending, bool mark_key_c_first)
{
    long long held[KEYS], running_a, running_c;
    struct outbox_lease leases[2];
    struct call sweep = {.store = f->relay_b};
    struct call mark = {.store = f->relay_a, .leases = leases, .count = 2};

    for (int i = 0; i < KEYS; i++) {
        int k = held_ids_ascending ? i : KEYS - 1 - i;

        held[k] = insert_row(f->conn, key_names[k], true);
    }
    running_c = insert_row(f->conn, "key-c", false);
    running_a = insert_row(f->conn, "key-a", false);
    make_running(f->conn, running_a, "relay-a", mark_key_c_first ? 1 : 0);
    make_running(f->conn, running_c, "relay-a", mark_key_c_first ? 0 : 1);
    harness_exec(f->conn, "ANALYZE outbox.job");
    leases[mark_key_c_first ? 1 : 0] = (struct outbox_lease){running_a, 1};
    leases[mark_key_c_first ? 0 : 1] = (struct outbox_lease){running_c, 1};

    /* key-b's waiting row is locked: the sweep stops there */
    meet(f, held[1], &sweep, &mark);
    assert_int_equal(mark.changed, 2);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE held"), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'q' AND state = 'succeeded'"),
                     2);
}

static void
test_waiting_ids_in_key_order_mark_key_a_first(void **state)
{
    mark_and_sweep_meet(*state, true, false);
}

static void
test_waiting_ids_in_key_order_mark_key_c_first(void **state)
{
    mark_and_sweep_meet(*state, true, true);
}

static void
test_waiting_ids_reversed_mark_key_a_first(void **state)
{
    mark_and_sweep_meet(*state, false, false);
}

static void
test_waiting_ids_reversed_mark_key_c_first(void **state)
{
    mark_and_sweep_meet(*state, false, true);
}

/*
 * Two marks. Each key has a waiting row and two later rows in flight, one
 * of each relay (claimed while the waiting row's insert was not yet
 * committed). relay-a's leases and lease expiry name the keys in their
 * order, relay-b's in the reverse, the two orders a mark used to free the
 * waiting rows in: key-b's waiting row locked, relay-a's mark stops there
 * holding key-a's, relay-b's holding key-c's.
 */
static void
test_two_marks_free_the_same_rows(void **state)
{
    struct fixture *f = *state;
    long long held[KEYS];
    struct outbox_lease leases_a[KEYS], leases_b[KEYS];
    struct call mark_a = {.store = f->relay_a, .leases = leases_a, .count = KEYS};
    struct call mark_b = {.store = f->relay_b, .leases = leases_b, .count = KEYS};

    for (int k = 0; k < KEYS; k++)
        held[k] = insert_row(f->conn, key_names[k], true);
    for (int k = 0; k < KEYS; k++) {
        long long a = insert_row(f->conn, key_names[k], false);
        long long b = insert_row(f->conn, key_names[k], false);

        make_running(f->conn, a, "relay-a", k);
        make_running(f->conn, b, "relay-b", KEYS - k);
        leases_a[k] = (struct outbox_lease){a, 1};
        leases_b[KEYS - 1 - k] = (struct outbox_lease){b, 1};
    }
    harness_exec(f->conn, "ANALYZE outbox.job");
    meet(f, held[1], &mark_a, &mark_b);
    assert_int_equal(mark_a.changed, KEYS);
    assert_int_equal(mark_b.changed, KEYS);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE held"), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'q' AND state = 'succeeded'"),
                     2 * KEYS);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_waiting_ids_in_key_order_mark_key_a_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_waiting_ids_in_key_order_mark_key_c_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_waiting_ids_reversed_mark_key_a_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_waiting_ids_reversed_mark_key_c_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_two_marks_free_the_same_rows, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
