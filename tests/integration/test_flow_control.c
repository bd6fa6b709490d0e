/*
 * test_flow_control.c - pause and resume, replay, and the consumers' inbox,
 * against real PostgreSQL, Redis and RabbitMQ servers.
 *
 * Each test has its own database and its own stream prefix or AMQP queue
 * names. Relays run as processes; outboxctl runs as the operator would run
 * it. Redis entry ids carry the time Redis appended them, which is how the
 * pause test tells when each row was published.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "amqp_consumer.h"
#include "fixtures.h"
#include "harness.h"
#include "outbox.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define RELAYS_MAX 3
/* Contract: a pause or resume holds within --poll-interval + 1 s. */
#define POLL_INTERVAL "100ms"
#define TAKES_EFFECT_MS (100 + 1000)
/*
 * The claim a pipeline sent ahead just before a pause runs at the server when
 * the statements queued before it are done: on a loaded host that is one
 * slow turn later. The three-relay test allows that turn before it demands
 * that nothing more of the queue is claimed, and keeps the queue paused long
 * enough after it for an ignored pause to show.
 */
#define SLOW_TURN_MS 2000
#define PAUSED_FOR_MS 7000
/*
 * Under valgrind (make valgrind) every program runs tens of times slower:
 * the tests keep their checks with a tenth of the rows, and give the
 * resumed queue and the other queue's flow more time.
 */
static bool under_valgrind;
#define REPLAY_ROWS (under_valgrind ? 1000 : 10000)
#define REPLAY_KEYS 500
#define INBOX_MESSAGES (under_valgrind ? 1000 : 10000)

/* Rows committed by the producer thread of the pause test. */
struct producer {
    const char *url;
    pthread_t thread;
    bool started;
    atomic_int stop;
    int transactions; /* each commits one row to each of two queues */
    int errors;
};

struct fixture {
    struct fixture_redis base; /* database, Redis and this test's key prefix */
    struct relay_process relays[RELAYS_MAX];
    int relay_count;
    struct producer producer;
    queue_consumer *mq;
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    fixture_redis_open(&f->base, "flow-test", "");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    if (f->producer.started) {
        atomic_store(&f->producer.stop, 1);
        pthread_join(f->producer.thread, NULL);
    }
    for (int i = 0; i < f->relay_count; i++)
        if (f->relays[i].pid > 0) {
            relay_signal(&f->relays[i], SIGKILL);
            harness_wait_exit(f->relays[i].pid, 10000);
        }
    if (f->mq != NULL) {
        queue_consumer_delete_queue(f->mq, "replay");
        queue_consumer_delete_queue(f->mq, "other");
        queue_consumer_free(f->mq);
    }
    fixture_redis_close(&f->base);
    free(f);
    return 0;
}

static int64_t
wall_ms(void)
{
    struct timeval tv;

    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void
sleep_ms(int ms)
{
    usleep((useconds_t)ms * 1000);
}

/* Starts one more relay with the given extra arguments. */
static struct relay_process *
start_relay(struct fixture *f, const char *broker, const char *const *extra)
{
    struct relay_process *relay = &f->relays[f->relay_count++];

    assert_true(f->relay_count <= RELAYS_MAX);
    relay_start_process(relay, f->base.url, broker, extra);
    return relay;
}

/* Stops a relay with SIGTERM; it must exit 0. */
static void
stop_relay(struct relay_process *relay)
{
    relay_signal(relay, SIGTERM);
    assert_int_equal(relay_wait(relay, 30000), 0);
    relay->pid = 0;
}

/*
 * Runs outboxctl --database-url URL ARGS... (NULL-terminated) to the end and
 * returns its exit status; what it printed goes to output.
 */
static int
run_ctl(const struct fixture *f, char *output, size_t size, ...)
{
    const char *argv[FIXTURE_MAX_ARGS + 1];
    size_t n = 0;
    va_list ap;

    argv[n++] = "--database-url";
    argv[n++] = f->base.url;
    va_start(ap, size);
    for (const char *arg; n < FIXTURE_MAX_ARGS && (arg = va_arg(ap, const char *)) != NULL;)
        argv[n++] = arg;
    va_end(ap);
    argv[n] = NULL;
    return fixture_run_program("outboxctl", argv, output, size, 120000);
}

/* The millisecond part of a Redis entry id: when Redis appended it. */
static int64_t
entry_ms(const struct stream_consumer_entry *entry)
{
    return strtoll(entry->id, NULL, 10);
}

static void
read_stream(struct fixture *f, const char *queue, struct stream_consumer_stream *out)
{
    char stream[128];

    snprintf(stream, sizeof(stream), "%s%s", f->base.prefix, queue);
    assert_int_equal(stream_consumer_read_stream(f->base.redis, stream, out), 0);
}

/* Fails unless the stream of queue holds each of the queue's rows exactly times times. */
static void
assert_each_row_appended(struct fixture *f, const char *queue, int times)
{
    struct stream_consumer_stream stream;
    char sql[256];
    long long rows, max_id;
    int *seen;

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM outbox.job WHERE queue = '%s'", queue);
    rows = harness_query_ll(f->base.conn, sql);
    max_id = harness_query_ll(f->base.conn, "SELECT coalesce(max(job_id), 0) FROM outbox.job");
    read_stream(f, queue, &stream);
    seen = calloc((size_t)max_id + 1, sizeof(*seen));
    assert_non_null(seen);
    for (size_t i = 0; i < stream.count; i++) {
        int64_t id = stream.entries[i].job_id;

        if (id < 1 || id > max_id)
            fail_msg("stream %s%s holds unknown job id %" PRId64, f->base.prefix, queue, id);
        seen[id]++;
    }
    if ((long long)stream.count != rows * times)
        fail_msg("stream %s%s has %zu entries, want %lld rows x %d", f->base.prefix, queue,
                 stream.count, rows, times);
    snprintf(sql, sizeof(sql), "SELECT job_id FROM outbox.job WHERE queue = '%s'", queue);
    {
        PGresult *result = PQexec(f->base.conn, sql);

        assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
        for (int r = 0; r < PQntuples(result); r++) {
            long long id = strtoll(PQgetvalue(result, r, 0), NULL, 10);

            if (seen[id] != times)
                fail_msg("job %lld of %s appended %d times, want %d", id, queue, seen[id], times);
        }
        PQclear(result);
    }
    free(seen);
    stream_consumer_stream_clear(&stream);
}

/* ---- pause and resume ------------------------------------------------------------- */

/*
 * The rows of queue claimed so far (running, or already succeeded), as a
 * table indexed by job id up to *max_id; the caller frees it.
 */
static bool *
claimed_rows(struct fixture *f, const char *queue, int64_t *max_id)
{
    char sql[256];
    PGresult *result;
    bool *claimed;

    *max_id = harness_query_ll(f->base.conn, "SELECT coalesce(max(job_id), 0) FROM outbox.job");
    claimed = calloc((size_t)*max_id + 1, sizeof(*claimed));
    assert_non_null(claimed);
    snprintf(sql, sizeof(sql),
             "SELECT job_id FROM outbox.job WHERE queue = '%s' AND state IN ('running', 'succeeded')",
             queue);
    result = PQexec(f->base.conn, sql);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    for (int r = 0; r < PQntuples(result); r++) {
        long long id = strtoll(PQgetvalue(result, r, 0), NULL, 10);

        if (id >= 1 && id <= *max_id)
            claimed[id] = true;
    }
    PQclear(result);
    return claimed;
}

static void *
produce(void *arg)
{
    struct producer *p = arg;
    PGconn *conn = PQconnectdb(p->url);

    /* bounded: 20 000 transactions at most, about 100 s */
    while (PQstatus(conn) == CONNECTION_OK && !atomic_load(&p->stop) && p->transactions < 20000) {
        PGresult *result = PQexec(conn, "SELECT outbox.enqueue('paused', '{\"n\":1}'),"
                                        " outbox.enqueue('flowing', '{\"n\":2}')");

        if (PQresultStatus(result) == PGRES_TUPLES_OK)
            p->transactions++;
        else
            p->errors++;
        PQclear(result);
        sleep_ms(5);
    }
    if (PQstatus(conn) != CONNECTION_OK)
        p->errors++;
    PQfinish(conn);
    return NULL;
}

/* Waits up to timeout_ms until the stream of queue has at least count entries. */
static void
wait_for_entries(struct fixture *f, const char *queue, long long count, int timeout_ms)
{
    char stream[128];
    long long length = 0;

    snprintf(stream, sizeof(stream), "%s%s", f->base.prefix, queue);
    for (int waited = 0; waited <= timeout_ms; waited += 50) {
        length = stream_consumer_stream_length(f->base.redis, stream);
        if (length >= count)
            return;
        sleep_ms(50);
    }
    fail_msg("stream %s has %lld entries after %d ms, want %lld", stream, length, timeout_ms,
             count);
}

/*
 * Three relays and a producer committing to two queues; one queue is paused
 * while everything runs: from pause + poll interval + 1 s (plus one slow turn
 * for a claim sent ahead) on, nothing of it is claimed (Redis appends only
 * rows claimed before that moment), while the
 * other queue flows and the paused one's rows wait as ready; after resume
 * every row of both arrives exactly once.
 */
static void
test_pause_queue_with_three_relays(void **state)
{
    struct fixture *f = *state;
    /* batches of 100: the test times how a pause spreads, not how long a batch takes */
    const char *extra[] = {"--stream-prefix", f->base.prefix, "--poll-interval", POLL_INTERVAL,
                           "--batch-size",    "100",     NULL};
    struct stream_consumer_stream paused, flowing;
    char out[4096];
    int64_t paused_at, resumed_at, first_after_resume = 0, latest = 0, claimed_max = 0;
    size_t late = 0, flowing_late = 0;
    bool *claimed;

    for (int i = 0; i < 3; i++)
        start_relay(f, f->base.broker, extra);
    f->producer.url = f->base.url;
    assert_int_equal(pthread_create(&f->producer.thread, NULL, produce, &f->producer), 0);
    f->producer.started = true;
    wait_for_entries(f, "paused", 50, 20000);

    assert_int_equal(run_ctl(f, out, sizeof(out), "pause", "paused", "--reason", "test", NULL), 0);
    paused_at = wall_ms();
    /*
     * Rows claimed by then finish normally, however slowly (a loaded host,
     * a sanitizer build); what the pause forbids is a claim after it.
     */
    sleep_ms(TAKES_EFFECT_MS + SLOW_TURN_MS);
    claimed = claimed_rows(f, "paused", &claimed_max);
    sleep_ms(PAUSED_FOR_MS - TAKES_EFFECT_MS - SLOW_TURN_MS);
    assert_true(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job"
                                          " WHERE queue = 'paused' AND state = 'ready'") > 100);
    assert_int_equal(run_ctl(f, out, sizeof(out), "paused", NULL), 0);
    assert_non_null(strstr(out, "test"));
    /* taken before the resume: a relay may claim as soon as it commits, before outboxctl returns */
    resumed_at = wall_ms();
    assert_int_equal(run_ctl(f, out, sizeof(out), "resume", "paused", NULL), 0);
    sleep_ms(500);
    atomic_store(&f->producer.stop, 1);
    pthread_join(f->producer.thread, NULL);
    f->producer.started = false;
    assert_int_equal(f->producer.errors, 0);

    if (wait_for_value(f->base.conn, "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'", 0,
                       30000) != 0)
        fail_msg("rows left unpublished after resume");
    read_stream(f, "paused", &paused);
    read_stream(f, "flowing", &flowing);
    for (size_t i = 0; i < paused.count; i++) {
        int64_t at = entry_ms(&paused.entries[i]), id = paused.entries[i].job_id;

        if (at > paused_at + TAKES_EFFECT_MS + SLOW_TURN_MS && at < resumed_at &&
            (id < 1 || id > claimed_max || !claimed[id]))
            late++;
        if (at < resumed_at && at > latest)
            latest = at;
        if (at >= resumed_at && first_after_resume == 0)
            first_after_resume = at;
    }
    for (size_t i = 0; i < flowing.count; i++) {
        int64_t at = entry_ms(&flowing.entries[i]);

        if (at > paused_at + TAKES_EFFECT_MS && at < resumed_at)
            flowing_late++;
    }
    stream_consumer_stream_clear(&paused);
    stream_consumer_stream_clear(&flowing);
    free(claimed);
    if (late > 0)
        fail_msg("%zu rows of the paused queue claimed after the pause took effect were published"
                 " (the last %lld ms after the pause)",
                 late, (long long)(latest - paused_at));
    if (flowing_late < (under_valgrind ? 1 : 100))
        fail_msg("only %zu rows of the other queue flowed during the pause", flowing_late);
    if (first_after_resume == 0 ||
        first_after_resume > resumed_at + (under_valgrind ? 10 : 1) * TAKES_EFFECT_MS)
        fail_msg("the paused queue did not flow within %d ms of resume",
                 (under_valgrind ? 10 : 1) * TAKES_EFFECT_MS);
    assert_each_row_appended(f, "paused", 1);
    assert_each_row_appended(f, "flowing", 1);
}

/*
 * A paused ordering key waits while the other keys of its queue flow; on
 * resume its rows come out in job_id order.
 */
static void
test_pause_one_key(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->base.prefix, NULL};
    struct stream_consumer_stream stream;
    char out[4096];
    int64_t last = 0;
    size_t held_key = 0;

    assert_int_equal(run_ctl(f, out, sizeof(out), "pause", "orders", "--key", "k1", NULL), 0);
    assert_non_null(strstr(out, "paused ordering key 'k1'"));
    harness_exec(f->base.conn, "SELECT outbox.enqueue('orders', jsonb_build_object('n', g),"
                          " ordering_key => 'k' || (g % 3)) FROM generate_series(1, 300) AS g");
    assert_int_equal(relay_run_once(f->base.url, f->base.broker, extra), 0);
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE ordering_key = 'k1' AND state = 'ready'"),
                     100);
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE ordering_key <> 'k1' AND state = 'succeeded'"),
                     200);
    assert_int_equal(run_ctl(f, out, sizeof(out), "status", "--json", NULL), 0);
    assert_non_null(strstr(out, "\"paused_keys\":1"));

    assert_int_equal(run_ctl(f, out, sizeof(out), "resume", "orders", "--key", "k1", NULL), 0);
    assert_int_equal(relay_run_once(f->base.url, f->base.broker, extra), 0);
    assert_each_row_appended(f, "orders", 1);
    read_stream(f, "orders", &stream);
    for (size_t i = 0; i < stream.count; i++) {
        const struct stream_consumer_entry *e = &stream.entries[i];

        /* k1 is g % 3 == 1: job ids 1, 4, 7, ... in a fresh database */
        if (e->job_id % 3 != 1)
            continue;
        if (i < 200)
            fail_msg("row %" PRId64 " of the paused key was appended among the others", e->job_id);
        if (e->job_id <= last)
            fail_msg("key k1 out of order: %" PRId64 " after %" PRId64, e->job_id, last);
        last = e->job_id;
        held_key++;
    }
    stream_consumer_stream_clear(&stream);
    assert_int_equal(held_key, 100);
}

/* Bad input to pause is one clear line, and nothing is paused. */
static void
test_pause_bad_input(void **state)
{
    struct fixture *f = *state;
    char out[4096];

    /* a usage error, named before any connection */
    assert_int_equal(run_ctl(f, out, sizeof(out), "pause", "bad queue!", NULL), 2);
    assert_non_null(strstr(out, "invalid queue name 'bad queue!'"));
    assert_int_equal(run_ctl(f, out, sizeof(out), "pause", NULL), 2);
    assert_non_null(strstr(out, "'pause' needs a QUEUE"));
    assert_int_equal(run_ctl(f, out, sizeof(out), "resume", "orders", "--bogus", NULL), 2);
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.paused"), 0);
}

/* ---- replay ------------------------------------------------------------------------ */

/* Enqueues REPLAY_ROWS rows of queue 'replay' over REPLAY_KEYS keys, and 100 of 'other'. */
static void
enqueue_replay_rows(struct fixture *f)
{
    char sql[512];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('replay', jsonb_build_object('n', g),"
             " ordering_key => 'k' || (g %% %d))) FROM generate_series(1, %d) AS g",
             REPLAY_KEYS, REPLAY_ROWS);
    harness_query_ll(f->base.conn, sql);
    enqueue_rows(f->base.conn, "other", 100);
}

/*
 * Replays queue 'replay' by time range while a relay runs, kills that relay
 * with SIGKILL in the middle of it and lets a second one finish. published()
 * (may be NULL) looks at the broker after the first publish of every row.
 */
static void
replay_with_kill(struct fixture *f, const char *broker, const char *const *extra_slow,
                 const char *const *extra, void (*published)(struct fixture *f))
{
    char since[64], out[4096], want[128];
    long long replayed = 0;
    PGresult *result;
    struct relay_process *first;

    result = PQexec(f->base.conn, "SELECT (now() - interval '1 second')::text");
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    snprintf(since, sizeof(since), "%s", PQgetvalue(result, 0, 0));
    PQclear(result);
    enqueue_replay_rows(f);
    assert_int_equal(relay_run_once(f->base.url, broker, extra), 0);
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     REPLAY_ROWS + 100);
    if (published != NULL)
        published(f);

    /* dry run: a count, nothing changes */
    assert_int_equal(run_ctl(f, out, sizeof(out), "replay", "--queue", "replay", "--since", since,
                             "--dry-run", NULL),
                     0);
    snprintf(want, sizeof(want), "would replay %d succeeded jobs of queue 'replay'", REPLAY_ROWS);
    assert_non_null(strstr(out, want));
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job WHERE replays > 0"),
                     0);

    first = start_relay(f, broker, extra_slow);
    assert_int_equal(run_ctl(f, out, sizeof(out), "replay", "--queue", "replay", "--since", since,
                             NULL),
                     0);
    snprintf(want, sizeof(want), "replayed %d succeeded jobs of queue 'replay'", REPLAY_ROWS);
    if (strstr(out, want) == NULL)
        fail_msg("replay printed: %s", out);
    /* bounded: 30 s (150 s under valgrind) */
    for (int waited = 0; waited < (under_valgrind ? 150000 : 30000); waited += 5) {
        replayed = harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job"
                                             " WHERE replays = 1 AND state = 'succeeded'");
        if (replayed >= REPLAY_ROWS / 10)
            break;
        sleep_ms(5);
    }
    relay_signal(first, SIGKILL);
    harness_wait_exit(first->pid, 10000);
    first->pid = 0;
    if (replayed < REPLAY_ROWS / 10 || replayed >= REPLAY_ROWS)
        fail_msg("the relay was not killed in the middle of the replay (%lld of %d done)",
                 replayed, REPLAY_ROWS);

    start_relay(f, broker, extra);
    if (wait_for_value(f->base.conn, "SELECT count(*) FROM outbox.job"
                                " WHERE replays = 1 AND state = 'succeeded'",
                       REPLAY_ROWS, under_valgrind ? 300000 : 60000) != REPLAY_ROWS)
        fail_msg("replayed rows were not all published again");
    stop_relay(&f->relays[f->relay_count - 1]);
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'other' AND replays > 0"),
                     0);
}

/*
 * Redis: 10 000 rows replayed by time range with a relay killed mid-way:
 * each job is in the stream exactly twice, and the replayed copies of each
 * ordering key come in job_id order.
 */
static void
test_replay_redis(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->base.prefix, "--poll-interval", POLL_INTERVAL, NULL};
    const char *slow[] = {"--stream-prefix", f->base.prefix, "--batch-size", "5", "--concurrency", "1",
                          "--lease",         "5",       NULL};
    struct stream_consumer_stream stream;
    int64_t last[REPLAY_KEYS] = {0};
    char *seen;

    replay_with_kill(f, f->base.broker, slow, extra, NULL);
    assert_each_row_appended(f, "replay", 2);
    assert_each_row_appended(f, "other", 1);

    /* the second copy of each job, per key, in job_id order */
    read_stream(f, "replay", &stream);
    seen = calloc(REPLAY_ROWS + 200, 1);
    assert_non_null(seen);
    for (size_t i = 0; i < stream.count; i++) {
        int64_t id = stream.entries[i].job_id;
        int key = (int)(id % REPLAY_KEYS); /* job id g has key g % REPLAY_KEYS */

        if (!seen[id]) {
            seen[id] = 1;
            continue;
        }
        if (id <= last[key])
            fail_msg("replayed key k%d out of order: %" PRId64 " after %" PRId64, key, id,
                     last[key]);
        last[key] = id;
    }
    free(seen);
    stream_consumer_stream_clear(&stream);
}

/* After the first publish: RabbitMQ has every row once; emptied before the replay. */
static void
amqp_first_publish(struct fixture *f)
{
    uint32_t count = 0;

    assert_int_equal(queue_consumer_count(f->mq, "replay", &count), 0);
    assert_int_equal(count, REPLAY_ROWS);
    assert_int_equal(queue_consumer_purge(f->mq, "replay"), 0);
    assert_int_equal(queue_consumer_purge(f->mq, "other"), 0);
}

/*
 * RabbitMQ: 10 000 rows replayed by time range with a relay killed mid-way:
 * every replayed job arrives again with the same message_id and
 * x-outbox-attempt going on from the first publish; nothing of another queue.
 */
static void
test_replay_amqp(void **state)
{
    struct fixture *f = *state;
    const char *amqp = harness_env("OUTBOX_TEST_AMQP_URL");
    const char *extra[] = {"--poll-interval", POLL_INTERVAL, NULL};
    const char *slow[] = {"--batch-size", "5", "--concurrency", "1", NULL};
    struct queue_consumer_message *messages;
    char *seen;
    size_t fetched = 0, total = 0;
    uint32_t count = 0;

    f->mq = queue_consumer_connect(amqp);
    assert_non_null(f->mq);
    assert_int_equal(queue_consumer_declare_queue(f->mq, "replay"), 0);
    assert_int_equal(queue_consumer_declare_queue(f->mq, "other"), 0);
    replay_with_kill(f, amqp, slow, extra, amqp_first_publish);

    messages = calloc(500, sizeof(*messages));
    seen = calloc(REPLAY_ROWS + 200, 1);
    assert_non_null(messages);
    assert_non_null(seen);
    do {
        assert_int_equal(queue_consumer_fetch(f->mq, "replay", messages, 500, 1000, &fetched), 0);
        for (size_t i = 0; i < fetched; i++) {
            const struct queue_consumer_header *attempt =
                queue_consumer_message_header(&messages[i], "x-outbox-attempt");
            long long id = messages[i].job_id;
            const char *replay = messages[i].message_id ? strrchr(messages[i].message_id, '.') : NULL;

            if (id < 1 || id > REPLAY_ROWS)
                fail_msg("unexpected message id %s", messages[i].message_id);
            /* a replay is a message of its own: the rule of every broker */
            if (replay == NULL || strncmp(replay, ".r", 2) != 0)
                fail_msg("replayed message %s has no .r<n> in its id", messages[i].message_id);
            if (attempt == NULL || !attempt->is_int || attempt->int_value < 2)
                fail_msg("replayed message %lld has x-outbox-attempt %lld, want 2 or more", id,
                         attempt && attempt->is_int ? (long long)attempt->int_value : -1LL);
            seen[id] = 1;
            queue_consumer_message_clear(&messages[i]);
        }
        total += fetched;
    } while (fetched > 0 && total < 3 * REPLAY_ROWS);
    for (int id = 1; id <= REPLAY_ROWS; id++)
        if (!seen[id])
            fail_msg("replayed job %d never reached RabbitMQ again", id);
    assert_int_equal(queue_consumer_count(f->mq, "other", &count), 0);
    assert_int_equal(count, 0);
    free(seen);
    free(messages);
}

/* Replay by ids refuses rows that are not succeeded, and says how many. */
static void
test_replay_refuses_unfinished_rows(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->base.prefix, NULL};
    char out[4096];

    enqueue_rows(f->base.conn, "orders", 3); /* ids 1 2 3 */
    assert_int_equal(relay_run_once(f->base.url, f->base.broker, extra), 0);
    enqueue_rows(f->base.conn, "orders", 2); /* ids 4 5, ready */
    harness_exec(f->base.conn, "UPDATE outbox.job SET state = 'dead', finished_at = now(),"
                          " last_error = 'test' WHERE job_id = 5");
    assert_int_equal(run_ctl(f, out, sizeof(out), "replay", "--queue", "orders", "--job", "1",
                             "--job", "2", "--job", "4", "--job", "5", "--job", "99", NULL),
                     0);
    assert_non_null(strstr(out, "replayed 2 succeeded jobs of queue 'orders'"));
    assert_non_null(strstr(out, "refused 2 jobs not in state succeeded: 1 ready, 0 running, 1 dead"));
    assert_non_null(strstr(out, "not found in queue 'orders': 1 job id"));
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job WHERE replays = 1"
                                               " AND state = 'ready' AND job_id IN (1, 2)"),
                     2);
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.job WHERE replays > 0"),
                     2);
    assert_int_equal(run_ctl(f, out, sizeof(out), "replay", "--queue", "orders", NULL), 2);
    assert_non_null(strstr(out, "needs --since TIME or --job ID"));
    assert_int_equal(run_ctl(f, out, sizeof(out), "replay", "--queue", "orders", "--since",
                             "yesterday-ish", NULL),
                     2);
    assert_non_null(strstr(out, "neither a timestamp, a duration (10m) nor an interval"));
    /* a PostgreSQL interval is a time ago too, as a DURATION is */
    assert_int_equal(run_ctl(f, out, sizeof(out), "replay", "--queue", "orders", "--since",
                             "10 minutes", "--dry-run", NULL),
                     0);
    assert_non_null(strstr(out, "would replay 1 succeeded job of queue 'orders'"));
}

/* ---- inbox ------------------------------------------------------------------------- */

/* One consumer instance: takes the given message ids, each in its own transaction. */
struct consumer {
    const char *url;
    const char *name;  /* the inbox consumer name */
    const char *table; /* its side table */
    const int *ids;
    size_t count;
    pthread_t thread;
    int processed; /* accepted, side row inserted, committed */
    int skipped;   /* duplicates */
    int errors;
    char error[OUTBOX_ERROR_MESSAGE_MAX];
};

static void *
consume(void *arg)
{
    struct consumer *c = arg;
    PGconn *conn = PQconnectdb(c->url);

    for (size_t i = 0; i < c->count && PQstatus(conn) == CONNECTION_OK && c->errors == 0; i++) {
        char id[24], sql[128];
        struct outbox_error err;
        bool accepted = false;

        snprintf(id, sizeof(id), "%d", c->ids[i]);
        PQclear(PQexec(conn, "BEGIN"));
        if (outbox_inbox_accept(conn, c->name, id, &accepted, &err) != 0) {
            snprintf(c->error, sizeof(c->error), "%s", err.message);
            c->errors++;
            break;
        }
        if (accepted) {
            PGresult *result;

            snprintf(sql, sizeof(sql), "INSERT INTO %s (message_id) VALUES ('%s')", c->table, id);
            result = PQexec(conn, sql);
            if (PQresultStatus(result) != PGRES_COMMAND_OK)
                c->errors++;
            PQclear(result);
        }
        {
            PGresult *result = PQexec(conn, "COMMIT");

            if (PQresultStatus(result) != PGRES_COMMAND_OK)
                c->errors++;
            PQclear(result);
        }
        if (accepted)
            c->processed++;
        else
            c->skipped++;
    }
    if (PQstatus(conn) != CONNECTION_OK)
        c->errors++;
    PQfinish(conn);
    return NULL;
}

/*
 * Two consumers, each with two instances taking the same 10 000 messages
 * at the same time, duplicates interleaved: each
 * consumer's side table holds each id exactly once.
 */
static void
test_inbox_two_consumers(void **state)
{
    struct fixture *f = *state;
    const char *names[2] = {"billing", "shipping"};
    const char *tables[2] = {"side_billing", "side_shipping"};
    struct consumer consumers[4];
    int *first, *second;

    harness_exec(f->base.conn, "CREATE TABLE side_billing (message_id text NOT NULL);"
                          "CREATE TABLE side_shipping (message_id text NOT NULL)");
    /*
     * Every message twice: one instance takes 1 2 3 4 ..., the other 2 1 4 3 ...
     * at the same time, so copies of one id meet in flight and in turn.
     */
    first = calloc(INBOX_MESSAGES, sizeof(*first));
    second = calloc(INBOX_MESSAGES, sizeof(*second));
    assert_non_null(first);
    assert_non_null(second);
    for (int i = 0; i < INBOX_MESSAGES; i++) {
        first[i] = i + 1;
        second[i] = i % 2 == 0 ? i + 2 : i;
    }
    for (int i = 0; i < 4; i++) {
        consumers[i] = (struct consumer){.url = f->base.url,
                                         .name = names[i / 2],
                                         .table = tables[i / 2],
                                         .ids = i % 2 ? second : first,
                                         .count = INBOX_MESSAGES};
        assert_int_equal(pthread_create(&consumers[i].thread, NULL, consume, &consumers[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(consumers[i].thread, NULL);
    free(first);
    free(second);
    for (int c = 0; c < 2; c++) {
        char sql[160];

        for (int i = 2 * c; i < 2 * c + 2; i++)
            if (consumers[i].errors != 0)
                fail_msg("consumer %s failed: %s", consumers[i].name, consumers[i].error);
        assert_int_equal(consumers[2 * c].processed + consumers[2 * c + 1].processed,
                         INBOX_MESSAGES);
        assert_int_equal(consumers[2 * c].skipped + consumers[2 * c + 1].skipped, INBOX_MESSAGES);
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s", tables[c]);
        assert_int_equal(harness_query_ll(f->base.conn, sql), INBOX_MESSAGES);
        snprintf(sql, sizeof(sql), "SELECT count(DISTINCT message_id) FROM %s", tables[c]);
        assert_int_equal(harness_query_ll(f->base.conn, sql), INBOX_MESSAGES);
    }
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.inbox"),
                     2 * INBOX_MESSAGES);
}

/* A rolled-back transaction leaves the id unaccepted; outside a transaction is refused. */
static void
test_inbox_rollback_and_state(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    bool accepted = false;
    char out[4096];

    assert_int_equal(outbox_inbox_accept(f->base.conn, "billing", "m-1", &accepted, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_STATE);

    harness_exec(f->base.conn, "BEGIN");
    assert_int_equal(outbox_inbox_accept(f->base.conn, "billing", "m-1", &accepted, &err), 0);
    assert_true(accepted);
    assert_int_equal(outbox_inbox_accept(f->base.conn, "billing", "m-1", &accepted, &err), 0);
    assert_false(accepted);
    harness_exec(f->base.conn, "ROLLBACK");

    harness_exec(f->base.conn, "BEGIN");
    assert_int_equal(outbox_inbox_accept(f->base.conn, "billing", "m-1", &accepted, &err), 0);
    assert_true(accepted);
    assert_int_equal(outbox_inbox_accept(f->base.conn, "shipping", "m-1", &accepted, &err), 0);
    assert_true(accepted);
    harness_exec(f->base.conn, "COMMIT");
    harness_exec(f->base.conn, "BEGIN");
    assert_int_equal(outbox_inbox_accept(f->base.conn, "billing", "m-1", &accepted, &err), 0);
    assert_false(accepted);
    harness_exec(f->base.conn, "COMMIT");

    /* purge: only records older than the age go */
    harness_exec(f->base.conn, "INSERT INTO outbox.inbox (consumer, message_id, accepted_at)"
                          " SELECT 'old', g::text, now() - interval '2 days'"
                          " FROM generate_series(1, 12000) AS g");
    assert_int_equal(run_ctl(f, out, sizeof(out), "inbox", "purge", "--older-than", "1d", NULL),
                     0);
    assert_non_null(strstr(out, "purged 12000 inbox records"));
    assert_int_equal(harness_query_ll(f->base.conn, "SELECT count(*) FROM outbox.inbox"), 2);
    assert_int_equal(run_ctl(f, out, sizeof(out), "inbox", "purge", NULL), 2);
}

int
main(void)
{
    under_valgrind = getenv("OUTBOX_VALGRIND") != NULL && *getenv("OUTBOX_VALGRIND") != '\0';

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pause_queue_with_three_relays, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_one_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_redis, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_amqp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_refuses_unfinished_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inbox_two_consumers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inbox_rollback_and_state, setup, teardown),
    };

    return cmocka_run_group_tests_name("flow_control", tests, NULL, NULL);
}
