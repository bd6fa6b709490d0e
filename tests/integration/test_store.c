/*
 * test_store.c - the worker protocol against a real PostgreSQL: enqueue,
 * claim, extend, complete, fail, release, reap, cleanup, ordering keys,
 * and a store whose server stops answering.
 *
 * Each test runs on a fresh database cloned from the migrated template.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "outbox.h"

struct fixture {
    char *url;
    PGconn *conn; /* the producer's / inspector's connection */
    outbox_store *a;
    outbox_store *b;
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    struct outbox_error err;

    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->a = outbox_store_connect(f->url, "worker-a", &err);
    assert_non_null(f->a);
    f->b = outbox_store_connect(f->url, "worker-b", &err);
    assert_non_null(f->b);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    outbox_store_free(f->a);
    outbox_store_free(f->b);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* Enqueues one committed row and returns its id. */
static int64_t
enqueue_committed(PGconn *conn, const struct outbox_message *message)
{
    struct outbox_error err;
    int64_t id = 0;

    harness_exec(conn, "BEGIN");
    if (outbox_enqueue(conn, message, &id, &err) != 0)
        fail_msg("enqueue: %s", err.message);
    harness_exec(conn, "COMMIT");
    return id;
}

static int64_t
enqueue_simple(PGconn *conn, const char *queue, const char *payload)
{
    struct outbox_message message = {.queue = queue, .payload_json = payload};

    return enqueue_committed(conn, &message);
}

/* The state of one row, read from the database. */
static char *
row_state(PGconn *conn, int64_t job_id)
{
    char sql[128];
    PGresult *result;
    char *state;

    snprintf(sql, sizeof(sql), "SELECT state FROM outbox.job WHERE job_id = %lld",
             (long long)job_id);
    result = PQexec(conn, sql);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    state = strdup(PQntuples(result) ? PQgetvalue(result, 0, 0) : "gone");
    PQclear(result);
    return state;
}

static void
assert_state(PGconn *conn, int64_t job_id, const char *expected)
{
    char *state = row_state(conn, job_id);

    assert_string_equal(state, expected);
    free(state);
}

static void
test_enqueue_needs_a_transaction_and_rolls_back(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "orders", .payload_json = "{\"n\":1}"};
    struct outbox_error err;
    int64_t id = 0;

    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_STATE);

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), 0);
    assert_true(id > 0);
    harness_exec(f->conn, "ROLLBACK");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 0);

    id = enqueue_committed(f->conn, &message);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 1);
    assert_state(f->conn, id, "ready");
}

static void
test_enqueue_is_idempotent_on_key(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {
        .queue = "invoices", .payload_json = "{}", .idempotency_key = "invoice:1842:send"};
    int64_t first = enqueue_committed(f->conn, &message);
    int64_t again = enqueue_committed(f->conn, &message);

    assert_int_equal(first, again);
    message.queue = "receipts";
    assert_int_not_equal(enqueue_committed(f->conn, &message), first);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 2);
}

static void
test_enqueue_rejects_bad_input(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "bad queue", .payload_json = "{}"};
    struct outbox_error err;
    int64_t id;

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_non_null(strstr(err.message, "invalid outbox queue name"));
    harness_exec(f->conn, "ROLLBACK");

    message.queue = "ok";
    message.headers_json = "{\"n\": 1}";
    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue(f->conn, &message, &id, &err), -1);
    assert_non_null(strstr(err.message, "string values"));
    harness_exec(f->conn, "ROLLBACK");
}

static void
test_claim_then_complete(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "orders",
                                     .payload_json = "{\"order\": 1842}",
                                     .headers_json = "{\"trace\": \"abc\"}",
                                     .max_attempts = 5};
    int64_t id = enqueue_committed(f->conn, &message);
    struct outbox_batch batch;
    struct outbox_error err;
    struct outbox_lease lease;
    bool done = false;
    size_t changed = 0;

    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    assert_int_equal(batch.jobs[0].job_id, id);
    assert_int_equal(batch.jobs[0].generation, 1);
    assert_int_equal(batch.jobs[0].max_attempts, 5);
    assert_string_equal(batch.jobs[0].queue, "orders");
    assert_string_equal(batch.jobs[0].payload, "{\"order\": 1842}");
    assert_string_equal(batch.jobs[0].headers, "{\"trace\": \"abc\"}");
    assert_null(batch.jobs[0].ordering_key);
    assert_true(batch.jobs[0].created_at > 1.7e9);
    assert_state(f->conn, id, "running");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE worker_id = 'worker-a'"
                                               " AND lease_until > now() + interval '50 s'"),
                     1);

    /* a running row is not claimable by anyone else */
    {
        struct outbox_batch other;

        assert_int_equal(outbox_claim(f->b, NULL, 0, 10, 60, &other, &err), 0);
        assert_int_equal(other.count, 0);
        outbox_batch_release_memory(&other);
    }

    lease.job_id = id;
    lease.generation = batch.jobs[0].generation;
    outbox_batch_release_memory(&batch);
    /* another worker cannot complete it */
    assert_int_equal(outbox_complete(f->b, &lease, 1, &done, &changed, &err), 0);
    assert_false(done);
    assert_int_equal(changed, 0);
    assert_state(f->conn, id, "running");

    assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_int_equal(changed, 1);
    assert_state(f->conn, id, "succeeded");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE finished_at IS NOT NULL"
                                               " AND worker_id IS NULL"),
                     1);
    /* completing twice is not a success */
    assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_false(done);
}

/*
 * A pause committed after the store last read the pauses holds for its next
 * claim, however fresh its copy: a claim sent while a broker stalls the
 * turn, or queued behind a write a lock holds up, runs seconds after its
 * copy was read. The store's copy is read by a first claim (queue b), the
 * pause of queue a comes at once after: the next claims take nothing of a,
 * with a copy of no pause or of another queue's.
 */
static void
test_claim_honours_a_pause_its_copy_misses(void **state)
{
    struct fixture *f = *state;
    struct outbox_message a = {.queue = "a", .payload_json = "1"};
    struct outbox_message b = {.queue = "b", .payload_json = "2"};
    const char *queues_a[] = {"a"}, *queues_b[] = {"b"};
    int64_t a_id = enqueue_committed(f->conn, &a);
    struct outbox_batch batch;
    struct outbox_error err;

    enqueue_committed(f->conn, &b);
    /* the copy: no pause */
    assert_int_equal(outbox_claim(f->a, queues_b, 1, 1, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    outbox_batch_release_memory(&batch);
    harness_exec(f->conn, "SELECT outbox.pause('a', NULL, 'test')");
    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 0);
    outbox_batch_release_memory(&batch);
    assert_int_equal(outbox_claim(f->a, queues_a, 1, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 0);
    outbox_batch_release_memory(&batch);
    assert_state(f->conn, a_id, "ready");

    /* the copy: a pause of queue c; then queue a paused beside it */
    harness_exec(f->conn, "SELECT outbox.resume('a', NULL)");
    harness_exec(f->conn, "SELECT outbox.pause('c', NULL, 'test')");
    usleep(300 * 1000); /* the copy ages past its bound: the next claim reads it again */
    assert_int_equal(outbox_claim(f->b, queues_a, 1, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    assert_int_equal(batch.jobs[0].job_id, a_id);
    outbox_batch_release_memory(&batch);
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', worker_id = NULL,"
                          " lease_until = NULL WHERE queue = 'a'");
    harness_exec(f->conn, "SELECT outbox.pause('a', NULL, 'test')");
    assert_int_equal(outbox_claim(f->b, queues_a, 1, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 0);
    outbox_batch_release_memory(&batch);
    assert_state(f->conn, a_id, "ready");
}

static void
test_claim_order_and_queue_filter(void **state)
{
    struct fixture *f = *state;
    struct outbox_message low = {.queue = "a", .payload_json = "1"};
    struct outbox_message high = {.queue = "a", .payload_json = "2", .priority = 5};
    struct outbox_message later = {.queue = "a", .payload_json = "3", .delay_seconds = 3600};
    struct outbox_message other = {.queue = "b", .payload_json = "4"};
    const char *queues[] = {"a"};
    int64_t low_id = enqueue_committed(f->conn, &low);
    int64_t high_id = enqueue_committed(f->conn, &high);
    int64_t other_id;
    struct outbox_batch batch;
    struct outbox_error err;

    enqueue_committed(f->conn, &later);
    other_id = enqueue_committed(f->conn, &other);

    /* priority first; a row whose run_at is in the future is not claimed */
    assert_int_equal(outbox_claim(f->a, queues, 1, 1, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    assert_int_equal(batch.jobs[0].job_id, high_id);
    outbox_batch_release_memory(&batch);
    assert_int_equal(outbox_claim(f->a, queues, 1, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    assert_int_equal(batch.jobs[0].job_id, low_id);
    outbox_batch_release_memory(&batch);

    /* queue b was left alone, and the all-queues claim finds it */
    assert_state(f->conn, other_id, "ready");
    assert_int_equal(outbox_claim(f->b, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    assert_int_equal(batch.jobs[0].job_id, other_id);
    outbox_batch_release_memory(&batch);
}

/* Moves the lease of a row into the past, as if its worker stalled. */
static void
expire_lease(PGconn *conn, int64_t job_id)
{
    char sql[160];

    snprintf(sql, sizeof(sql),
             "UPDATE outbox.job SET lease_until = now() - interval '1 second' WHERE job_id = %lld",
             (long long)job_id);
    harness_exec(conn, sql);
}

static void
test_expired_lease_is_fenced_reaped_and_reclaimed(void **state)
{
    struct fixture *f = *state;
    int64_t id = enqueue_simple(f->conn, "orders", "{}");
    struct outbox_batch batch;
    struct outbox_reap_result reaped;
    struct outbox_error err;
    struct outbox_lease old_lease, new_lease;
    struct outbox_failure failure;
    bool done;
    size_t changed;

    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    old_lease = (struct outbox_lease){.job_id = id, .generation = batch.jobs[0].generation};
    outbox_batch_release_memory(&batch);

    /* expired but not yet reaped: the owner can no longer complete or extend */
    expire_lease(f->conn, id);
    assert_int_equal(outbox_complete(f->a, &old_lease, 1, &done, &changed, &err), 0);
    assert_false(done);
    assert_int_equal(outbox_extend(f->a, &old_lease, 1, 60, &done, &changed, &err), 0);
    assert_false(done);
    assert_state(f->conn, id, "running");

    assert_int_equal(outbox_reap(f->b, 100, 0, &reaped, &err), 0);
    assert_int_equal(reaped.ready, 1);
    assert_int_equal(reaped.dead, 0);
    assert_state(f->conn, id, "ready");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE last_error LIKE 'lease expired%'"),
                     1);

    assert_int_equal(outbox_claim(f->b, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    assert_int_equal(batch.jobs[0].generation, 2);
    new_lease = (struct outbox_lease){.job_id = id, .generation = 2};
    outbox_batch_release_memory(&batch);

    /* the stale worker changes nothing, whatever it tries */
    assert_int_equal(outbox_complete(f->a, &old_lease, 1, &done, &changed, &err), 0);
    assert_false(done);
    assert_int_equal(outbox_extend(f->a, &old_lease, 1, 60, &done, &changed, &err), 0);
    assert_false(done);
    assert_int_equal(outbox_release(f->a, &old_lease, 1, &done, &changed, &err), 0);
    assert_false(done);
    failure = (struct outbox_failure){.job_id = id, .generation = 1, .error = "stale"};
    assert_int_equal(outbox_fail(f->a, &failure, 1, &done, NULL, &changed, &err), 0);
    assert_false(done);
    /* even with the right generation number, another worker id is not the owner */
    assert_int_equal(outbox_complete(f->a, &new_lease, 1, &done, &changed, &err), 0);
    assert_false(done);
    assert_state(f->conn, id, "running");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE worker_id = 'worker-b' AND attempts = 2"),
                     1);

    assert_int_equal(outbox_extend(f->b, &new_lease, 1, 120, &done, &changed, &err), 0);
    assert_true(done);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE lease_until > now() + interval '100 s'"),
                     1);
    assert_int_equal(outbox_complete(f->b, &new_lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_state(f->conn, id, "succeeded");
}

static void
test_reap_kills_rows_without_attempts_left(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "q", .payload_json = "{}", .max_attempts = 1};
    int64_t id = enqueue_committed(f->conn, &message);
    struct outbox_batch batch;
    struct outbox_reap_result reaped;
    struct outbox_error err;

    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    outbox_batch_release_memory(&batch);
    expire_lease(f->conn, id);
    assert_int_equal(outbox_reap(f->a, 100, 0, &reaped, &err), 0);
    assert_int_equal(reaped.dead, 1);
    assert_state(f->conn, id, "dead");
}

static void
test_failures_retry_then_die_with_last_error(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "q", .payload_json = "{}", .max_attempts = 3};
    int64_t id = enqueue_committed(f->conn, &message);
    struct outbox_error err;

    for (int attempt = 1; attempt <= 3; attempt++) {
        struct outbox_batch batch;
        struct outbox_failure failure;
        char reason[32];
        bool done = false, dead = false;
        size_t changed;

        assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
        assert_int_equal(batch.count, 1);
        assert_int_equal(batch.jobs[0].generation, attempt);
        snprintf(reason, sizeof(reason), "boom %d", attempt);
        failure = (struct outbox_failure){
            .job_id = id, .generation = attempt, .error = reason, .retry_seconds = 0};
        outbox_batch_release_memory(&batch);
        assert_int_equal(outbox_fail(f->a, &failure, 1, &done, &dead, &changed, &err), 0);
        assert_true(done);
        assert_int_equal(dead, attempt == 3);
    }
    assert_state(f->conn, id, "dead");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE last_error = 'boom 3'"
                                               " AND finished_at IS NOT NULL AND attempts = 3"),
                     1);
}

static void
test_fail_backs_off_and_permanent_is_dead(void **state)
{
    struct fixture *f = *state;
    int64_t first = enqueue_simple(f->conn, "q", "1");
    int64_t second = enqueue_simple(f->conn, "q", "2");
    struct outbox_batch batch;
    struct outbox_failure failures[2];
    struct outbox_error err;
    bool done[2], dead[2];
    size_t changed;

    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 2);
    failures[0] = (struct outbox_failure){.job_id = first,
                                          .generation = 1,
                                          .error = "quote \" and \\ backslash, {braces}",
                                          .retry_seconds = 3600};
    failures[1] = (struct outbox_failure){
        .job_id = second, .generation = 1, .error = "too large", .permanent = true};
    outbox_batch_release_memory(&batch);
    assert_int_equal(outbox_fail(f->a, failures, 2, done, dead, &changed, &err), 0);
    assert_int_equal(changed, 2);
    assert_false(dead[0]);
    assert_true(dead[1]);
    assert_state(f->conn, first, "ready");
    assert_state(f->conn, second, "dead");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE run_at > now() + interval '3000 s'"
                                               " AND last_error = 'quote \" and \\ backslash,"
                                               " {braces}'"),
                     1);
    /* backing off: not claimable now */
    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 0);
    outbox_batch_release_memory(&batch);
}

/*
 * The relay's turn: the marks of one batch and the next claim are sent
 * ahead, each commits on its own, and their results come back in order.
 */
static void
test_marks_and_next_claim_sent_ahead(void **state)
{
    struct fixture *f = *state;
    struct outbox_message message = {.queue = "orders", .payload_json = "{}"};
    struct outbox_batch first, second, none;
    struct outbox_lease lease;
    struct outbox_failure failure;
    struct outbox_error err;
    bool done = false, dead = false;
    size_t changed = 0;
    int64_t ids[3];

    for (int i = 0; i < 3; i++)
        ids[i] = enqueue_committed(f->conn, &message);
    assert_int_equal(outbox_claim(f->a, NULL, 0, 2, 60, &first, &err), 0);
    assert_int_equal(first.count, 2);
    lease = (struct outbox_lease){first.jobs[0].job_id, first.jobs[0].generation};
    failure = (struct outbox_failure){.job_id = first.jobs[1].job_id,
                                      .generation = first.jobs[1].generation,
                                      .error = "broker said no",
                                      .permanent = true};

    assert_int_equal(outbox_complete_send(f->a, &lease, 1, &err), 0);
    assert_int_equal(outbox_fail_send(f->a, &failure, 1, &err), 0);
    assert_int_equal(outbox_claim_send(f->a, NULL, 0, 10, 60, &err), 0);
    /* results must be taken in the order sent */
    assert_int_equal(outbox_claim_receive(f->a, &none, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_non_null(strstr(err.message, "out of order"));

    assert_int_equal(outbox_complete_receive(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_int_equal(changed, 1);
    assert_int_equal(outbox_fail_receive(f->a, &failure, 1, &done, &dead, &changed, &err), 0);
    assert_true(done);
    assert_true(dead);
    assert_int_equal(outbox_claim_receive(f->a, &second, &err), 0);
    assert_int_equal(second.count, 1);
    assert_int_equal(second.jobs[0].job_id, ids[2]);

    assert_state(f->conn, ids[0], "succeeded");
    assert_state(f->conn, ids[1], "dead");
    assert_state(f->conn, ids[2], "running");
    /* with nothing sent ahead the store takes plain calls again */
    lease = (struct outbox_lease){second.jobs[0].job_id, second.jobs[0].generation};
    assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_state(f->conn, ids[2], "succeeded");
    outbox_batch_release_memory(&first);
    outbox_batch_release_memory(&second);
}

static void
test_release_keeps_the_attempt(void **state)
{
    struct fixture *f = *state;
    int64_t id = enqueue_simple(f->conn, "q", "{}");
    struct outbox_batch batch;
    struct outbox_lease lease;
    struct outbox_error err;
    bool done;
    size_t changed;

    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    lease = (struct outbox_lease){.job_id = id, .generation = batch.jobs[0].generation};
    outbox_batch_release_memory(&batch);
    assert_int_equal(outbox_release(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_state(f->conn, id, "ready");
    assert_int_equal(harness_query_ll(f->conn, "SELECT attempts FROM outbox.job"), 0);
    /* at once claimable again, with generation 1 */
    assert_int_equal(outbox_claim(f->b, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    assert_int_equal(batch.jobs[0].generation, 1);
    outbox_batch_release_memory(&batch);
}

static void
count_backlog(void *arg, const struct outbox_backlog *backlog)
{
    double *ages = arg;

    if (strcmp(backlog->queue, "q") == 0)
        ages[0] = backlog->oldest_ready_age;
    else
        ages[1] = backlog->oldest_ready_age;
}

static void
count_ready(void *arg, const struct outbox_backlog *backlog)
{
    long long *ready = arg;

    if (strcmp(backlog->queue, "keyed") == 0)
        *ready = backlog->ready;
}

/* The backlog counts a key's rows held behind its first as ready, beside free rows. */
static void
test_backlog_counts_held_rows(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    long long ready = -1;

    for (int i = 0; i < 3; i++)
        harness_exec(f->conn, "SELECT outbox.enqueue('keyed', '{}'::jsonb, ordering_key => 'k')");
    enqueue_simple(f->conn, "keyed", "{}");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE held"), 2);
    if (outbox_sample_backlog(f->a, count_ready, &ready, &err) != 0)
        fail_msg("backlog: %s", err.message);
    assert_int_equal(ready, 4);
}

/* Rows that hold an infinite run_at (from before the schema refused them) sample fine. */
static void
test_backlog_survives_infinite_run_at(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    double ages[2] = {-1, -1};

    enqueue_simple(f->conn, "q", "{}");
    enqueue_simple(f->conn, "r", "{}");
    enqueue_simple(f->conn, "r", "{}");
    harness_exec(f->conn, "UPDATE outbox.job SET run_at = '-infinity',"
                          " created_at = now() - interval '30 seconds' WHERE queue = 'q'");
    harness_exec(f->conn, "UPDATE outbox.job SET run_at = 'infinity'"
                          " WHERE job_id = (SELECT max(job_id) FROM outbox.job)");
    if (outbox_sample_backlog(f->a, count_backlog, ages, &err) != 0)
        fail_msg("backlog: %s", err.message);
    assert_true(ages[0] >= 29 && ages[0] < 3600);
    assert_true(ages[1] >= 0 && ages[1] < 3600);
    /* and the connection is still usable */
    assert_int_equal(outbox_sample_backlog(f->a, count_backlog, ages, &err), 0);
}

/*
 * A release sent ahead (as the relay sends it with its other marks) hands the
 * attempt back too, and is fenced like the others: a stale generation is
 * not released.
 */
static void
test_release_sent_ahead_keeps_the_attempt(void **state)
{
    struct fixture *f = *state;
    int64_t id = enqueue_simple(f->conn, "q", "{}");
    struct outbox_batch batch;
    struct outbox_lease lease, stale;
    struct outbox_error err;
    bool done = false;
    size_t changed = 0;

    assert_int_equal(outbox_claim(f->a, NULL, 0, 10, 60, &batch, &err), 0);
    assert_int_equal(batch.count, 1);
    lease = (struct outbox_lease){.job_id = id, .generation = batch.jobs[0].generation};
    outbox_batch_release_memory(&batch);
    stale = (struct outbox_lease){.job_id = id, .generation = lease.generation + 1};
    assert_int_equal(outbox_release_send(f->a, &stale, 1, &err), 0);
    assert_int_equal(outbox_release_receive(f->a, &stale, 1, &done, &changed, &err), 0);
    assert_false(done);
    assert_int_equal(changed, 0);
    assert_state(f->conn, id, "running");

    assert_int_equal(outbox_release_send(f->a, &lease, 1, &err), 0);
    assert_int_equal(outbox_release_receive(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_int_equal(changed, 1);
    assert_state(f->conn, id, "ready");
    assert_int_equal(harness_query_ll(f->conn, "SELECT attempts FROM outbox.job"), 0);
}

#define CONCURRENT_ROWS 20000
#define CLAIMERS 4

struct claimer {
    const char *url;
    char worker[32];
    int64_t *ids;
    size_t count;
    int generation_errors;
    int failures;
};

static void *
claimer_run(void *arg)
{
    struct claimer *c = arg;
    struct outbox_error err;
    outbox_store *store = outbox_store_connect(c->url, c->worker, &err);

    if (store == NULL) {
        c->failures++;
        return NULL;
    }
    c->ids = calloc(CONCURRENT_ROWS, sizeof(*c->ids));
    for (int round = 0; round < CONCURRENT_ROWS; round++) {
        struct outbox_batch batch;
        struct outbox_lease leases[100];
        bool done[100];
        size_t changed;

        if (outbox_claim(store, NULL, 0, 100, 60, &batch, &err) != 0) {
            c->failures++;
            break;
        }
        if (batch.count == 0) {
            outbox_batch_release_memory(&batch);
            break;
        }
        for (size_t i = 0; i < batch.count; i++) {
            c->ids[c->count++] = batch.jobs[i].job_id;
            if (batch.jobs[i].generation != 1)
                c->generation_errors++;
            leases[i] = (struct outbox_lease){batch.jobs[i].job_id, batch.jobs[i].generation};
        }
        if (outbox_complete(store, leases, batch.count, done, &changed, &err) != 0 ||
            changed != batch.count)
            c->failures++;
        outbox_batch_release_memory(&batch);
    }
    outbox_store_free(store);
    return NULL;
}

static int
compare_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

static void
test_concurrent_claimers_get_disjoint_rows(void **state)
{
    struct fixture *f = *state;
    struct claimer claimers[CLAIMERS];
    pthread_t threads[CLAIMERS];
    int64_t *all = malloc(CONCURRENT_ROWS * sizeof(*all));
    size_t total = 0;

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload)"
                          " SELECT 'bulk', jsonb_build_object('n', g)"
                          " FROM generate_series(1, 20000) AS g");
    for (int i = 0; i < CLAIMERS; i++) {
        claimers[i] = (struct claimer){.url = f->url};
        snprintf(claimers[i].worker, sizeof(claimers[i].worker), "claimer-%d", i);
        assert_int_equal(pthread_create(&threads[i], NULL, claimer_run, &claimers[i]), 0);
    }
    for (int i = 0; i < CLAIMERS; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(claimers[i].failures, 0);
        assert_int_equal(claimers[i].generation_errors, 0);
        assert_true(claimers[i].count > 0); /* SKIP LOCKED lets every claimer make progress */
        assert_true(total + claimers[i].count <= CONCURRENT_ROWS);
        memcpy(all + total, claimers[i].ids, claimers[i].count * sizeof(*all));
        total += claimers[i].count;
        free(claimers[i].ids);
    }
    assert_int_equal(total, CONCURRENT_ROWS);
    qsort(all, total, sizeof(*all), compare_id);
    for (size_t i = 1; i < total; i++)
        assert_true(all[i] != all[i - 1]);
    free(all);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 1"),
                     CONCURRENT_ROWS);
}

static void
test_cleanup_removes_only_old_succeeded_rows(void **state)
{
    struct fixture *f = *state;
    PGconn *conn = outbox_store_conn(f->a);
    struct outbox_cleanup_result cleaned;
    struct outbox_error err;
    char cutoff[64];
    size_t total = 0;

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'q', '{}', 'succeeded', now() - interval '2 hours'"
                          " FROM generate_series(1, 250);"
                          "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'q', '{}', 'succeeded', now() - interval '10 minutes'"
                          " FROM generate_series(1, 5);"
                          "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'q', '{}', 'dead', now() - interval '2 hours'"
                          " FROM generate_series(1, 5);"
                          "INSERT INTO outbox.job (queue, payload) SELECT 'q', '{}'"
                          " FROM generate_series(1, 5)");
    assert_int_equal(outbox_cleanup_cutoff(conn, 3600, cutoff, sizeof(cutoff), &err), 0);
    do {
        assert_int_equal(outbox_cleanup_batch(conn, cutoff, 100, &cleaned, &err), 0);
        assert_true(cleaned.locked);
        total += cleaned.deleted;
    } while (cleaned.deleted == 100);
    assert_int_equal(total, 250);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 15);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     5);
}

/*
 * One cleanup batch at a time across all sessions: while another session's
 * batch holds the cleanup lock, a batch deletes nothing and says so; once
 * that transaction ends, the next batch goes ahead.
 */
static void
test_cleanup_batches_take_turns(void **state)
{
    struct fixture *f = *state;
    struct outbox_cleanup_result cleaned;
    struct outbox_error err;
    char cutoff[64];

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'q', '{}', 'succeeded', now() - interval '2 hours'"
                          " FROM generate_series(1, 30)");
    assert_int_equal(outbox_store_cleanup_cutoff(f->a, 3600, cutoff, sizeof(cutoff), &err), 0);
    harness_exec(f->conn, "BEGIN; SELECT pg_advisory_xact_lock(" OUTBOX_CLEANUP_LOCK_KEY ")");
    assert_int_equal(outbox_store_cleanup_batch(f->a, cutoff, 100, &cleaned, &err), 0);
    assert_false(cleaned.locked);
    assert_int_equal(cleaned.deleted, 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 30);
    harness_exec(f->conn, "COMMIT");
    assert_int_equal(outbox_store_cleanup_batch(f->a, cutoff, 100, &cleaned, &err), 0);
    assert_true(cleaned.locked);
    assert_int_equal(cleaned.deleted, 30);
    /* the batch's own transaction ended with it: the lock is free again */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM pg_locks"
                                               " WHERE locktype = 'advisory'"),
                     0);
}

/*
 * The table sample: succeeded rows against the retention. A finish time at
 * -infinity (PostgreSQL refuses to subtract it) reads as the largest age.
 */
static void
test_table_sample(void **state)
{
    struct fixture *f = *state;
    struct outbox_table_sample sample;
    struct outbox_error err;

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " VALUES ('q', '{}', 'succeeded', '-infinity'),"
                          "        ('q', '{}', 'succeeded', now())");
    assert_int_equal(outbox_sample_table(outbox_store_conn(f->a), 60, &sample, &err), 0);
    assert_int_equal(sample.succeeded_rows, 2);
    assert_int_equal(sample.past_retention_rows, 1);
    assert_true(sample.oldest_past_retention_seconds > 1e8);
    assert_true(sample.table_bytes > 0);
    assert_true(sample.index_bytes > 0);
    /* the same figures through the store's prepared statement */
    assert_int_equal(outbox_store_sample_table(f->a, 60, &sample, &err), 0);
    assert_int_equal(sample.succeeded_rows, 2);
    assert_int_equal(sample.past_retention_rows, 1);
    assert_true(sample.oldest_past_retention_seconds > 1e8);
}

/* A cleanup batch run on a thread, and what it returned. */
struct stalled_cleanup {
    outbox_store *store;
    const char *cutoff;
    int rc;
    struct outbox_error err;
    volatile int done;
};

static void *
run_stalled_cleanup(void *arg)
{
    struct stalled_cleanup *c = arg;
    struct outbox_cleanup_result cleaned;

    c->rc = outbox_store_cleanup_batch(c->store, c->cutoff, 100, &cleaned, &c->err);
    __atomic_store_n(&c->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/*
 * The relay's maintenance runs cleanup on its store: when the server stops
 * answering mid-batch (a stopped backend behind a socket its kernel still
 * acknowledges), the batch ends with OUTBOX_ERR_TIMEOUT at the store's
 * deadline while the backend is still stopped, like every other statement
 * of the store, instead of holding the maintenance thread for ever. The
 * backend is let go on every path, and only then is the thread joined.
 */
static void
test_cleanup_on_a_stalled_server_ends_at_the_deadline(void **state)
{
    struct fixture *f = *state;
    struct stalled_cleanup c = {.store = f->a};
    struct outbox_error err;
    char cutoff[64];
    int backend = PQbackendPID(outbox_store_conn(f->a)), waited = 0;
    bool ended_while_stalled;
    pthread_t thread;

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'q', '{}', 'succeeded', now() - interval '2 hours'"
                          " FROM generate_series(1, 10)");
    assert_int_equal(outbox_store_cleanup_cutoff(f->a, 3600, cutoff, sizeof(cutoff), &err), 0);
    c.cutoff = cutoff;
    assert_int_equal(kill(backend, SIGSTOP), 0);
    if (pthread_create(&thread, NULL, run_stalled_cleanup, &c) != 0) {
        kill(backend, SIGCONT);
        fail_msg("unable to start the cleanup thread");
    }
    /* bounded: well past the store's 12 s deadline */
    while (!__atomic_load_n(&c.done, __ATOMIC_SEQ_CST) && waited++ < 300)
        usleep(100 * 1000);
    ended_while_stalled = __atomic_load_n(&c.done, __ATOMIC_SEQ_CST);
    kill(backend, SIGCONT);
    pthread_join(thread, NULL);
    assert_true(ended_while_stalled);
    assert_int_equal(c.rc, -1);
    assert_int_equal(c.err.code, OUTBOX_ERR_TIMEOUT);
    assert_true(outbox_error_is_transient(&c.err));
}

/* Claims everything claimable now and returns how many rows, recording ids. */
static size_t
claim_ids(outbox_store *store, int64_t *ids, size_t max)
{
    struct outbox_batch batch;
    struct outbox_error err;
    size_t n;

    assert_int_equal(outbox_claim(store, NULL, 0, (int)max, 60, &batch, &err), 0);
    n = batch.count;
    for (size_t i = 0; i < n; i++)
        ids[i] = batch.jobs[i].job_id;
    outbox_batch_release_memory(&batch);
    return n;
}

static void
test_ordering_key_one_at_a_time(void **state)
{
    struct fixture *f = *state;
    struct outbox_message k1 = {.queue = "q", .payload_json = "{}", .ordering_key = "order-1"};
    struct outbox_message k2 = {.queue = "q", .payload_json = "{}", .ordering_key = "order-2"};
    struct outbox_message same_key_other_queue = {
        .queue = "r", .payload_json = "{}", .ordering_key = "order-1"};
    int64_t a1 = enqueue_committed(f->conn, &k1);
    int64_t a2 = enqueue_committed(f->conn, &k1);
    int64_t b1 = enqueue_committed(f->conn, &k2);
    int64_t c1 = enqueue_committed(f->conn, &same_key_other_queue);
    int64_t free_row = enqueue_simple(f->conn, "q", "{}");
    int64_t ids[10];
    struct outbox_lease lease;
    struct outbox_failure failure;
    struct outbox_error err;
    bool done;
    size_t changed;

    /* heads of each key, plus the unkeyed row; never a2 while a1 is unfinished */
    assert_int_equal(claim_ids(f->a, ids, 10), 4);
    assert_int_equal(ids[0], a1);
    assert_int_equal(ids[1], b1);
    assert_int_equal(ids[2], c1);
    assert_int_equal(ids[3], free_row);
    assert_int_equal(claim_ids(f->b, ids, 10), 0);

    /* a retrying head blocks its key */
    failure = (struct outbox_failure){.job_id = a1, .generation = 1, .error = "x"};
    assert_int_equal(outbox_fail(f->a, &failure, 1, &done, NULL, &changed, &err), 0);
    assert_int_equal(claim_ids(f->b, ids, 10), 1); /* a1 itself, retry delay 0 */
    assert_int_equal(ids[0], a1);
    lease = (struct outbox_lease){.job_id = a1, .generation = 2};
    assert_int_equal(outbox_complete(f->b, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_int_equal(claim_ids(f->b, ids, 10), 1);
    assert_int_equal(ids[0], a2);
}

static void
test_ordering_dead_head_policy(void **state)
{
    struct fixture *f = *state;
    struct outbox_message k1 = {.queue = "q", .payload_json = "{}", .ordering_key = "k"};
    int64_t head = enqueue_committed(f->conn, &k1);
    int64_t next = enqueue_committed(f->conn, &k1);
    int64_t ids[10];
    struct outbox_failure failure;
    struct outbox_error err;
    bool done, dead;
    size_t changed;

    assert_int_equal(claim_ids(f->a, ids, 10), 1);
    failure = (struct outbox_failure){
        .job_id = head, .generation = 1, .error = "poison", .permanent = true};
    assert_int_equal(outbox_fail(f->a, &failure, 1, &done, &dead, &changed, &err), 0);
    assert_true(dead);

    outbox_store_set_block_on_dead_head(f->b, true);
    assert_int_equal(claim_ids(f->b, ids, 10), 0);
    outbox_store_set_block_on_dead_head(f->b, false);
    assert_int_equal(claim_ids(f->b, ids, 10), 1);
    assert_int_equal(ids[0], next);
}

/* Whether a row is held (waiting for an earlier row of its key). */
static bool
is_held(PGconn *conn, int64_t job_id)
{
    char sql[96];

    snprintf(sql, sizeof(sql), "SELECT held::int FROM outbox.job WHERE job_id = %lld",
             (long long)job_id);
    return harness_query_ll(conn, sql) == 1;
}

static void
test_ordering_later_rows_wait_out_of_the_ready_index(void **state)
{
    struct fixture *f = *state;
    struct outbox_message k = {.queue = "q", .payload_json = "{}", .ordering_key = "hot"};
    int64_t first = enqueue_committed(f->conn, &k);
    int64_t second = enqueue_committed(f->conn, &k);
    int64_t third = enqueue_committed(f->conn, &k);
    int64_t ids[10];
    struct outbox_lease lease = {.job_id = first, .generation = 1};
    struct outbox_error err;
    bool done;
    size_t changed;

    assert_false(is_held(f->conn, first));
    assert_true(is_held(f->conn, second));
    assert_true(is_held(f->conn, third));
    assert_int_equal(claim_ids(f->a, ids, 10), 1);
    assert_int_equal(ids[0], first);

    /* finishing the head releases exactly the next row */
    assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_false(is_held(f->conn, second));
    assert_true(is_held(f->conn, third));
    assert_int_equal(claim_ids(f->a, ids, 10), 1);
    assert_int_equal(ids[0], second);

    /* a dead row releases the next one too (default policy) */
    {
        struct outbox_failure failure = {
            .job_id = second, .generation = 1, .error = "poison", .permanent = true};
        bool dead;

        assert_int_equal(outbox_fail(f->a, &failure, 1, &done, &dead, &changed, &err), 0);
        assert_true(dead);
    }
    assert_false(is_held(f->conn, third));
    assert_int_equal(claim_ids(f->a, ids, 10), 1);
    assert_int_equal(ids[0], third);
}

static void
test_sweep_releases_a_row_stranded_by_a_race(void **state)
{
    struct fixture *f = *state;
    int64_t ids[10];
    struct outbox_error err;
    size_t released = 0;

    /* as if the head of 'k' finished while this row's insert was not yet committed */
    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, ordering_key, held)"
                          " VALUES ('q', '{}', 'k', true), ('q', '{}', 'k', true),"
                          " ('q', '{}', 'other', true)");
    assert_int_equal(claim_ids(f->a, ids, 10), 0);
    assert_int_equal(outbox_release_waiting(f->b, 1, &released, &err), 0);
    assert_int_equal(released, 1); /* one key per call here */
    assert_int_equal(outbox_release_waiting(f->b, 1, &released, &err), 0);
    assert_int_equal(released, 1);
    assert_int_equal(outbox_release_waiting(f->b, 1, &released, &err), 0);
    assert_int_equal(released, 0); /* the second row of 'k' still waits for the first */
    assert_int_equal(claim_ids(f->a, ids, 10), 2);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE held"), 1);
}

/* Enqueues messages in one committed call of outbox_enqueue_many(). */
static void
enqueue_many_committed(PGconn *conn, const struct outbox_message *messages, size_t count,
                       int64_t *ids)
{
    struct outbox_error err;

    harness_exec(conn, "BEGIN");
    if (outbox_enqueue_many(conn, messages, count, ids, &err) != 0)
        fail_msg("enqueue_many: %s", err.message);
    harness_exec(conn, "COMMIT");
}

/* The payload of one row as text, e.g. {"n": 1}; the caller frees it. */
static char *
row_payload(PGconn *conn, int64_t job_id)
{
    char sql[128];
    PGresult *result;
    char *payload;

    snprintf(sql, sizeof(sql), "SELECT payload::text FROM outbox.job WHERE job_id = %lld",
             (long long)job_id);
    result = PQexec(conn, sql);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(result), 1);
    payload = strdup(PQgetvalue(result, 0, 0));
    PQclear(result);
    return payload;
}

static void
test_enqueue_many_returns_ids_in_order(void **state)
{
    struct fixture *f = *state;
    struct outbox_message messages[5] = {
        {.queue = "orders", .payload_json = "{\"n\": 0}"},
        {.queue = "orders", .payload_json = "{\"n\": 1, \"q\": \"a \\\"quoted\\\" {x,y}\"}"},
        {.queue = "orders", .payload_json = "[2]", .priority = 5},
        {.queue = "invoices", .payload_json = "3", .headers_json = "{\"h\": \"v\"}"},
        {.queue = "orders", .payload_json = "\"four\""},
    };
    const char *expected[5] = {"{\"n\": 0}", "{\"n\": 1, \"q\": \"a \\\"quoted\\\" {x,y}\"}", "[2]",
                               "3", "\"four\""};
    int64_t ids[5] = {0};

    enqueue_many_committed(f->conn, messages, 5, ids);
    for (int i = 0; i < 5; i++) {
        char *payload = row_payload(f->conn, ids[i]);

        assert_string_equal(payload, expected[i]);
        free(payload);
        if (i > 0)
            assert_true(ids[i] > ids[i - 1]);
    }
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 5);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue ="
                                               " 'invoices' AND headers = '{\"h\": \"v\"}'"),
                     1);
    assert_int_equal(
        harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE priority = 5"), 1);

    /* the same in SQL: ids in payload order; an empty array inserts nothing */
    assert_int_equal(harness_query_ll(f->conn,
                                      "SELECT (ids[1] < ids[2] AND ids[2] < ids[3])::int FROM ("
                                      " SELECT outbox.enqueue_batch('q', '{1,2,3}') AS ids) AS b"),
                     1);
    assert_int_equal(
        harness_query_ll(f->conn, "SELECT cardinality(outbox.enqueue_batch('q', '{}'))"), 0);
    assert_int_equal(harness_query_ll(f->conn,
                                      "SELECT (string_agg(payload::text, ',' ORDER BY job_id)"
                                      " = '1,2,3')::int FROM outbox.job WHERE queue = 'q'"),
                     1);
}

static void
test_enqueue_many_is_idempotent_on_key(void **state)
{
    struct fixture *f = *state;
    struct outbox_message earlier = {
        .queue = "orders", .payload_json = "\"earlier\"", .idempotency_key = "k1"};
    struct outbox_message messages[5] = {
        {.queue = "orders", .payload_json = "\"a\"", .idempotency_key = "k1"},
        {.queue = "orders", .payload_json = "\"b\"", .idempotency_key = "k2"},
        {.queue = "orders", .payload_json = "\"c\""},
        {.queue = "orders", .payload_json = "\"d\"", .idempotency_key = "k2"},
        {.queue = "orders", .payload_json = "\"e\"", .idempotency_key = "NULL"},
    };
    int64_t first = enqueue_committed(f->conn, &earlier);
    int64_t ids[5] = {0}, again[5] = {0};
    char *payload;

    enqueue_many_committed(f->conn, messages, 5, ids);
    assert_int_equal(ids[0], first);      /* an existing key returns its row */
    assert_int_equal(ids[3], ids[1]);     /* a repeat inside the call returns the first */
    assert_int_not_equal(ids[4], ids[2]); /* the key "NULL" is a key like any other */
    payload = row_payload(f->conn, ids[1]);
    assert_string_equal(payload, "\"b\"");
    free(payload);
    payload = row_payload(f->conn, first);
    assert_string_equal(payload, "\"earlier\"");
    free(payload);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 4);

    /* again: every keyed row is found, the keyless one goes in anew */
    enqueue_many_committed(f->conn, messages, 5, again);
    assert_int_equal(again[0], ids[0]);
    assert_int_equal(again[1], ids[1]);
    assert_int_equal(again[3], ids[1]);
    assert_int_equal(again[4], ids[4]);
    assert_true(again[2] > ids[4]);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 5);

    /* a key of another queue is another row */
    messages[0].queue = "receipts";
    enqueue_many_committed(f->conn, messages, 1, again);
    assert_int_not_equal(again[0], first);
}

static void
test_enqueue_many_waits_for_a_concurrent_key(void **state)
{
    struct fixture *f = *state;
    PGconn *other = harness_connect(f->url);
    PGresult *result;
    long long first;

    harness_exec(f->conn, "BEGIN");
    first = harness_query_ll(f->conn, "SELECT (outbox.enqueue_batch('q', '{1}', '{k}'))[1]");
    /* the second producer's insert of the same key waits for the first transaction */
    assert_int_equal(PQsendQuery(other, "SELECT (outbox.enqueue_batch('q', '{2,3}', '{x,k}'))[2]"),
                     1);
    usleep(200 * 1000);
    harness_exec(f->conn, "COMMIT");
    result = PQgetResult(other);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    assert_int_equal(strtoll(PQgetvalue(result, 0, 0), NULL, 10), first);
    PQclear(result);
    assert_null(PQgetResult(other));
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 2);
    PQfinish(other);
}

static void
test_enqueue_many_keeps_key_order(void **state)
{
    struct fixture *f = *state;
    struct outbox_message unfinished = {.queue = "q", .payload_json = "0", .ordering_key = "b"};
    struct outbox_message messages[5] = {
        {.queue = "q", .payload_json = "1", .ordering_key = "a"},
        {.queue = "q", .payload_json = "2", .ordering_key = "a"},
        {.queue = "q", .payload_json = "3"},
        {.queue = "q", .payload_json = "4", .ordering_key = "b"},
        {.queue = "q", .payload_json = "5", .ordering_key = "a"},
    };
    int64_t head_b = enqueue_committed(f->conn, &unfinished);
    int64_t ids[5], claimed[10];
    struct outbox_lease lease;
    struct outbox_error err;
    bool done;
    size_t changed;

    enqueue_many_committed(f->conn, messages, 5, ids);
    assert_false(is_held(f->conn, ids[0]));
    assert_true(is_held(f->conn, ids[1]));
    assert_false(is_held(f->conn, ids[2]));
    assert_true(is_held(f->conn, ids[3])); /* behind head_b, in the table */
    assert_true(is_held(f->conn, ids[4]));

    /* each key hands out its rows one at a time, in array order */
    assert_int_equal(claim_ids(f->a, claimed, 10), 3);
    assert_int_equal(claimed[0], head_b);
    assert_int_equal(claimed[1], ids[0]);
    assert_int_equal(claimed[2], ids[2]);
    for (int step = 0; step < 2; step++) {
        lease = (struct outbox_lease){.job_id = claimed[1], .generation = 1};
        assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
        assert_true(done);
        assert_int_equal(claim_ids(f->a, claimed + 1, 1), 1);
        assert_int_equal(claimed[1], step == 0 ? ids[1] : ids[4]);
    }
    lease = (struct outbox_lease){.job_id = head_b, .generation = 1};
    assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_int_equal(claim_ids(f->a, claimed, 10), 1);
    assert_int_equal(claimed[0], ids[3]);
}

static void
test_enqueue_many_rejects_bad_input(void **state)
{
    struct fixture *f = *state;
    struct outbox_message messages[2] = {{.queue = "ok", .payload_json = "{}"},
                                         {.queue = "bad queue", .payload_json = "{}"}};
    struct outbox_error err;
    int64_t ids[2];

    /* outside a transaction, like outbox_enqueue() */
    assert_int_equal(outbox_enqueue_many(f->conn, messages, 1, ids, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_STATE);

    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue_many(f->conn, messages, 2, ids, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_non_null(strstr(err.message, "invalid outbox queue name 'bad queue'"));
    harness_exec(f->conn, "ROLLBACK");

    messages[1].queue = "ok";
    messages[1].headers_json = "{\"n\": 1}";
    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue_many(f->conn, messages, 2, ids, &err), -1);
    assert_non_null(strstr(err.message, "outbox headers must be a JSON object of string values"));
    harness_exec(f->conn, "ROLLBACK");

    messages[1].headers_json = NULL;
    messages[1].payload_json = "{not json";
    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue_many(f->conn, messages, 2, ids, &err), -1);
    assert_string_equal(err.sqlstate, "22P02");
    harness_exec(f->conn, "ROLLBACK");

    messages[1].payload_json = NULL;
    harness_exec(f->conn, "BEGIN");
    assert_int_equal(outbox_enqueue_many(f->conn, messages, 2, ids, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    harness_exec(f->conn, "ROLLBACK");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 0);

    /* the SQL function gives enqueue()'s errors, and its own for mismatched arrays */
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SAVEPOINT s");
    {
        static const struct {
            const char *sql;
            const char *sqlstate;
            const char *message;
        } cases[] = {
            {"SELECT outbox.enqueue_batch('q', ARRAY['1', NULL]::jsonb[])", "22004",
             "outbox payload must not be NULL"},
            {"SELECT outbox.enqueue_batch('q', NULL)", "22004", "outbox payload must not be NULL"},
            {"SELECT outbox.enqueue_batch('q', '{1}', max_attempts => 0)", "22023",
             "outbox max_attempts must be positive, got 0"},
            {"SELECT outbox.enqueue_batch('q', '{1}', '{a,b}')", "22023",
             "outbox enqueue_batch got 2 idempotency keys for 1 payloads"},
            {"SELECT outbox.enqueue_batch('q', '{1,2}', ordering_keys => '{a}')", "22023",
             "outbox enqueue_batch got 1 ordering keys for 2 payloads"},
            {"SELECT outbox.enqueue_batch('q', '{{1},{2}}')", "22023",
             "outbox enqueue_batch takes one-dimensional arrays"},
            {"SELECT outbox.enqueue_batch('', '{1}')", "22023", "invalid outbox queue name ''"},
            {"SELECT outbox.enqueue_batch('q', '{1}', headers => '{\"a\": [\"x\"]}')", "22023",
             "outbox headers must be a JSON object of string values"},
            {"SELECT outbox.enqueue_batch('q', '{1}', run_at => 'infinity')", "22023",
             "outbox run_at must be a finite time, got infinity"},
        };

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            PGresult *result = PQexec(f->conn, cases[i].sql);

            assert_int_equal(PQresultStatus(result), PGRES_FATAL_ERROR);
            assert_string_equal(PQresultErrorField(result, PG_DIAG_SQLSTATE), cases[i].sqlstate);
            assert_string_equal(PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY),
                                cases[i].message);
            PQclear(result);
            harness_exec(f->conn, "ROLLBACK TO SAVEPOINT s");
        }
    }
    harness_exec(f->conn, "ROLLBACK");
}

static void
test_delete_on_success_is_fenced_and_keeps_key_order(void **state)
{
    struct fixture *f = *state;
    struct outbox_message keyed = {
        .queue = "q", .payload_json = "{}", .ordering_key = "k", .idempotency_key = "once"};
    struct outbox_message next = {.queue = "q", .payload_json = "{}", .ordering_key = "k"};
    int64_t head = enqueue_committed(f->conn, &keyed);
    int64_t second = enqueue_committed(f->conn, &next);
    int64_t ids[10];
    struct outbox_lease lease = {.job_id = head, .generation = 1}, stale;
    struct outbox_error err;
    bool done;
    size_t changed;

    outbox_store_set_delete_on_success(f->a, true);
    outbox_store_set_delete_on_success(f->b, true);
    assert_int_equal(claim_ids(f->a, ids, 10), 1);
    assert_int_equal(ids[0], head);

    /* the fence of the mark holds for the delete: wrong generation, worker or expired lease */
    stale = (struct outbox_lease){.job_id = head, .generation = 2};
    assert_int_equal(outbox_complete(f->a, &stale, 1, &done, &changed, &err), 0);
    assert_false(done);
    assert_int_equal(outbox_complete(f->b, &lease, 1, &done, &changed, &err), 0);
    assert_false(done);
    expire_lease(f->conn, head);
    assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_false(done);
    assert_state(f->conn, head, "running");
    harness_exec(f->conn, "UPDATE outbox.job SET lease_until = now() + interval '1 minute'"
                          " WHERE state = 'running'");

    /* the owner's complete deletes the row and releases the next row of its key */
    assert_true(is_held(f->conn, second));
    assert_int_equal(outbox_complete_send(f->a, &lease, 1, &err), 0);
    assert_int_equal(outbox_complete_receive(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_int_equal(changed, 1);
    assert_state(f->conn, head, "gone");
    assert_false(is_held(f->conn, second));
    assert_int_equal(claim_ids(f->b, ids, 10), 1);
    assert_int_equal(ids[0], second);
    lease = (struct outbox_lease){.job_id = second, .generation = 1};
    assert_int_equal(outbox_complete(f->b, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 0);

    /* what it gives up: the idempotency key went with its row */
    assert_true(enqueue_committed(f->conn, &keyed) > second);

    /* mark again: rows stay as succeeded */
    outbox_store_set_delete_on_success(f->a, false);
    assert_int_equal(claim_ids(f->a, ids, 10), 1);
    lease = (struct outbox_lease){.job_id = ids[0], .generation = 1};
    assert_int_equal(outbox_complete(f->a, &lease, 1, &done, &changed, &err), 0);
    assert_true(done);
    assert_state(f->conn, ids[0], "succeeded");
}

static void
test_connect_without_schema_is_a_clear_error(void **state)
{
    char *url = harness_database_new_empty();
    struct outbox_error err;
    outbox_store *store = outbox_store_connect(url, "w", &err);

    (void)state;
    assert_null(store);
    assert_int_equal(err.code, OUTBOX_ERR_SCHEMA);
    assert_non_null(strstr(err.message, "outboxctl migrate"));
    harness_database_drop(url);
}

static void
test_connect_refused_is_transient(void **state)
{
    struct outbox_error err;
    outbox_store *store = outbox_store_connect(
        "postgresql://nobody:hunter2@127.0.0.1:1/x?connect_timeout=2", "w", &err);

    (void)state;
    assert_null(store);
    assert_int_equal(err.code, OUTBOX_ERR_CONNECTION);
    assert_true(outbox_error_is_transient(&err));
    assert_null(strstr(err.message, "hunter2"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_enqueue_needs_a_transaction_and_rolls_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_is_idempotent_on_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_rejects_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_many_returns_ids_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_many_is_idempotent_on_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_many_waits_for_a_concurrent_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_many_keeps_key_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_many_rejects_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_on_success_is_fenced_and_keeps_key_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_claim_then_complete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_sent_ahead_keeps_the_attempt, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_backlog_counts_held_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backlog_survives_infinite_run_at, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_order_and_queue_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_honours_a_pause_its_copy_misses, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_expired_lease_is_fenced_reaped_and_reclaimed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_reap_kills_rows_without_attempts_left, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_failures_retry_then_die_with_last_error, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fail_backs_off_and_permanent_is_dead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marks_and_next_claim_sent_ahead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_keeps_the_attempt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_claimers_get_disjoint_rows, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_cleanup_batches_take_turns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_sample, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cleanup_on_a_stalled_server_ends_at_the_deadline,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_cleanup_removes_only_old_succeeded_rows, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ordering_key_one_at_a_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordering_dead_head_policy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordering_later_rows_wait_out_of_the_ready_index, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sweep_releases_a_row_stranded_by_a_race, setup,
                                        teardown),
        cmocka_unit_test(test_connect_without_schema_is_a_clear_error),
        cmocka_unit_test(test_connect_refused_is_transient),
    };

    return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
