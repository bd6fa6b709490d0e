/*
 * test_relay_brokers.c - the relay scenarios every broker must pass, written
 * once and run per broker through a table of consumer functions: a
 * rolled-back producer transaction is never published, a bad row among good
 * ones dies alone, so does a row naming what the broker reserves, a broker restart mid-run and a broker outage lose no row
 * and cost no row an attempt, a relay killed mid-batch loses nothing,
 * SIGTERM and SIGHUP leave nothing running, a relay stopped past its lease
 * keeps the order of keys. What only one broker does (AMQP properties and
 * exchanges, Redis dedup and BUSY, NATS subjects and TLS, ...) stays in
 * test_relay_amqp.c, test_relay_redis.c, test_relay_nats.c and
 * test_relay_kafka.c.
 *
 * Adding a broker to the suite is one row of BROKERS: its name, the
 * harness's environment variable holding its URL, its tests/harness/stack.sh
 * service, and the consumer functions below. Every scenario runs on a fresh
 * database and, through open(), a fresh destination; the rows a scenario
 * enqueues all go to queue f->queue.
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

#include "amqp_consumer.h"
#include "broker_matrix.h"
#include "outbox.h"
#include "harness.h"
#include "nats_consumer.h"
#include "kafka_consumer.h"
#include "redis_consumer.h"
#include "relay_runner.h"

struct fixture;

/*
 * One broker of the table. The functions fail the current test (cmocka
 * asserts) instead of returning errors.
 */
struct broker {
    /* the test names' prefix, "rabbitmq: ..." */
    const char *name;
    /* the environment variable tests/run.sh sets to the broker's URL (f->broker_url) */
    const char *url_variable;
    /* its tests/harness/stack.sh service: stop-service, start-service, restart-service */
    const char *service;
    /*
     * Connects a consumer and makes the place where the relay's messages of
     * rows of f->queue end up, empty (a queue, a stream, a prefix of
     * streams); stores the relay's broker arguments that send them there
     * in f->extra (NULL-terminated, at most 6).
     */
    void (*open)(struct fixture *f);
    /* Deletes what open() made and disconnects; must not fail when the broker is gone. */
    void (*close)(struct fixture *f);
    /* Replaces the consumer's connection after a broker restart; keeps what open() made. */
    void (*reconnect)(struct fixture *f);
    /*
     * Stores in *ids (malloc'd, freed by the caller) the job id of every
     * message the broker holds for f->queue, a repeat as often as it was
     * stored, and returns how many; with message_ids not NULL, their
     * message ids too, in the same order (each malloc'd, freed with
     * free_message_ids()). May consume them (a second call may return none).
     */
    size_t (*delivered)(struct fixture *f, int64_t **ids, char ***message_ids);
    /* a job reaches it once even when a relay dies or a broker restarts (dedup by job id) */
    bool exactly_once;
    /* a row's headers (JSON) naming what the broker obeys or the relay keeps; NULL: none */
    const char *reserved_header;
    /* a row's routing key naming a place the broker or the relay keeps; NULL: none */
    const char *reserved_route;
};

struct fixture {
    const struct broker *broker;
    char *url;
    PGconn *conn;
    const char *broker_url;
    char queue[64];       /* the rows' queue (and the AMQP queue) */
    char prefix[64];      /* Redis stream prefix, NATS subject prefix */
    const char *extra[8]; /* the relay's broker arguments, NULL-terminated */
    bool broker_stopped;  /* a scenario stopped the broker: teardown starts it again */
    queue_consumer *mq;
    redisContext *redis;
    nats_consumer *nats;
};

static int test_counter;

/* ---- AMQP: rows go to the default exchange, routed to a queue of their name ---- */

static void
amqp_open(struct fixture *f)
{
    f->mq = queue_consumer_connect(f->broker_url);
    assert_non_null(f->mq);
    assert_int_equal(queue_consumer_declare_queue(f->mq, f->queue), 0);
}

static void
amqp_close(struct fixture *f)
{
    queue_consumer_delete_queue(f->mq, f->queue);
    queue_consumer_free(f->mq);
}

static void
amqp_reconnect(struct fixture *f)
{
    queue_consumer_free(f->mq);
    f->mq = queue_consumer_connect(f->broker_url);
    assert_non_null(f->mq);
}

/* Makes room for one more delivered message in *ids (and *message_ids when asked). */
static void
delivered_grow(size_t count, size_t *capacity, int64_t **ids, char ***message_ids)
{
    if (count < *capacity)
        return;
    *capacity = *capacity ? *capacity * 2 : 1024;
    *ids = realloc(*ids, *capacity * sizeof(**ids));
    assert_non_null(*ids);
    if (message_ids != NULL) {
        *message_ids = realloc(*message_ids, *capacity * sizeof(**message_ids));
        assert_non_null(*message_ids);
    }
}

static void
free_message_ids(char **message_ids, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(message_ids[i]);
    free(message_ids);
}

static size_t
amqp_delivered(struct fixture *f, int64_t **ids, char ***message_ids)
{
    struct queue_consumer_message messages[500];
    size_t count = 0, capacity = 0, fetched;

    *ids = NULL;
    if (message_ids != NULL)
        *message_ids = NULL;
    do {
        assert_int_equal(queue_consumer_fetch(f->mq, f->queue, messages, 500, 1000, &fetched), 0);
        for (size_t i = 0; i < fetched; i++) {
            delivered_grow(count, &capacity, ids, message_ids);
            assert_non_null(messages[i].message_id);
            if (message_ids != NULL)
                (*message_ids)[count] = strdup(messages[i].message_id);
            (*ids)[count++] = messages[i].job_id;
            queue_consumer_message_clear(&messages[i]);
        }
    } while (fetched > 0);
    return count;
}

/* ---- Redis: rows go to the stream prefix + queue ---- */

static void
redis_stream_open(struct fixture *f)
{
    f->redis = stream_consumer_connect(f->broker_url);
    assert_non_null(f->redis);
    f->extra[0] = "--stream-prefix";
    f->extra[1] = f->prefix;
}

static void
redis_stream_close(struct fixture *f)
{
    stream_consumer_delete_prefix(f->redis, f->prefix);
    redisFree(f->redis);
}

static void
redis_stream_reconnect(struct fixture *f)
{
    redisFree(f->redis);
    f->redis = stream_consumer_connect(f->broker_url);
    assert_non_null(f->redis);
}

static size_t
redis_stream_delivered(struct fixture *f, int64_t **ids, char ***message_ids)
{
    struct stream_consumer_stream stream = {0};
    char key[160];
    size_t count;

    snprintf(key, sizeof(key), "%s%s", f->prefix, f->queue);
    assert_int_equal(stream_consumer_read_stream(f->redis, key, &stream), 0);
    *ids = calloc(stream.count > 0 ? stream.count : 1, sizeof(**ids));
    assert_non_null(*ids);
    if (message_ids != NULL)
        *message_ids = calloc(stream.count > 0 ? stream.count : 1, sizeof(**message_ids));
    for (size_t i = 0; i < stream.count; i++) {
        (*ids)[i] = stream.entries[i].job_id;
        if (message_ids != NULL) {
            assert_non_null(stream.entries[i].message_id);
            (*message_ids)[i] = strdup(stream.entries[i].message_id);
        }
    }
    count = stream.count;
    stream_consumer_stream_clear(&stream);
    return count;
}

/* ---- NATS: rows go to subject prefix + queue, in a stream the test makes over "prefix.>" ---- */

static void
nats_stream_open(struct fixture *f)
{
    f->nats = broker_nats_stream_open(f->broker_url, f->prefix); /* "brokers-<pid>-<n>." */
    f->extra[0] = "--subject-prefix";
    f->extra[1] = f->prefix;
}

static void
nats_stream_close(struct fixture *f)
{
    broker_nats_stream_close(f->nats, f->prefix);
}

static void
nats_stream_reconnect(struct fixture *f)
{
    nats_consumer_free(f->nats);
    f->nats = nats_consumer_connect(f->broker_url);
    assert_non_null(f->nats);
}

static size_t
nats_stream_delivered(struct fixture *f, int64_t **ids, char ***message_ids)
{
    struct nats_consumer_message *messages;
    char name[64];
    size_t count;

    broker_nats_stream_name(f->prefix, name, sizeof(name));
    assert_int_equal(nats_consumer_read(f->nats, name, &messages, &count), 0);
    *ids = calloc(count > 0 ? count : 1, sizeof(**ids));
    assert_non_null(*ids);
    if (message_ids != NULL)
        *message_ids = calloc(count > 0 ? count : 1, sizeof(**message_ids));
    for (size_t i = 0; i < count; i++) {
        (*ids)[i] = messages[i].job_id;
        if (message_ids != NULL) {
            assert_non_null(messages[i].msg_id);
            (*message_ids)[i] = strdup(messages[i].msg_id);
        }
    }
    nats_consumer_messages_free(messages, count);
    return count;
}

/* ---- Kafka: rows go to the topic of their queue's name, three partitions ---- */

static void
kafka_open(struct fixture *f)
{
    char why[512];

    if (kafka_consumer_create_topic(f->broker_url, f->queue, 3, 1, NULL, 30000, why,
                                    sizeof(why)) != 0)
        fail_msg("kafka: unable to create topic %s: %s", f->queue, why);
}

static void
kafka_close(struct fixture *f)
{
    kafka_consumer_delete_topic(f->broker_url, f->queue);
}

/* Every read of the topic makes its own connection: nothing to renew after a restart. */
static void
kafka_reconnect(struct fixture *f)
{
    (void)f;
}

/* The job ids of the topic's records, each of which names its queue. */
static size_t
kafka_delivered(struct fixture *f, int64_t **ids, char ***message_ids)
{
    struct kafka_consumer_topic topic;
    char why[512];
    size_t count;

    if (kafka_consumer_read_topic(f->broker_url, f->queue, 60000, &topic, why, sizeof(why)) != 0)
        fail_msg("kafka: unable to read topic %s: %s", f->queue, why);
    *ids = calloc(topic.count > 0 ? topic.count : 1, sizeof(**ids));
    assert_non_null(*ids);
    if (message_ids != NULL)
        *message_ids = calloc(topic.count > 0 ? topic.count : 1, sizeof(**message_ids));
    for (size_t i = 0; i < topic.count; i++) {
        if (message_ids != NULL) {
            assert_non_null(topic.records[i].message_id);
            (*message_ids)[i] = strdup(topic.records[i].message_id);
        }
        assert_true(topic.records[i].job_id > 0);
        assert_non_null(topic.records[i].queue);
        assert_string_equal(topic.records[i].queue, f->queue);
        (*ids)[i] = topic.records[i].job_id;
    }
    count = topic.count;
    kafka_consumer_topic_clear(&topic);
    return count;
}

static const struct broker BROKERS[] = {
    {"rabbitmq", "OUTBOX_TEST_AMQP_URL", "rabbitmq", amqp_open, amqp_close, amqp_reconnect,
     amqp_delivered, false, "{\"BCC\": \"elsewhere\"}", NULL},
    {"redis", "OUTBOX_TEST_REDIS_URL", "redis", redis_stream_open, redis_stream_close,
     redis_stream_reconnect, redis_stream_delivered, true, NULL, "x:outbox-dedup:1"},
    {"nats", "OUTBOX_TEST_NATS_URL", "nats", nats_stream_open, nats_stream_close,
     nats_stream_reconnect, nats_stream_delivered, true, "{\"Nats-Rollup\": \"all\"}", NULL},
    {"kafka", "OUTBOX_TEST_KAFKA_URL", "kafka", kafka_open, kafka_close, kafka_reconnect,
     kafka_delivered, false, NULL, "__consumer_offsets"},
};

/* ---- fixture ---- */

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->broker = *state;
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->broker_url = harness_env(f->broker->url_variable);
    snprintf(f->queue, sizeof(f->queue), "brokers-%d-%d", (int)getpid(), test_counter);
    snprintf(f->prefix, sizeof(f->prefix), "brokers-%d-%d:", (int)getpid(), test_counter++);
    f->broker->open(f);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    if (f->broker_stopped)
        harness_stack("start-service", f->broker->service);
    f->broker->close(f);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* The relay's extra arguments: the broker's, then the scenario's (NULL-terminated). */
static const char **
arguments(struct fixture *f, const char **out, size_t size, const char *const *scenario)
{
    size_t n = 0;

    for (size_t i = 0; f->extra[i] != NULL && n + 1 < size; i++)
        out[n++] = f->extra[i];
    for (size_t i = 0; scenario != NULL && scenario[i] != NULL && n + 1 < size; i++)
        out[n++] = scenario[i];
    out[n] = NULL;
    return out;
}

static int
compare_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/*
 * Every committed row of the queue is among ids (count of them, sorted
 * here, then freed), nothing else is; returns how many arrived more than
 * once (0 for an exactly-once broker).
 */
static size_t
assert_these_rows_delivered(struct fixture *f, int64_t *ids, size_t count)
{
    size_t unique = 0;
    char sql[256];
    PGresult *rows;

    snprintf(sql, sizeof(sql), "SELECT job_id FROM outbox.job WHERE queue = '%s' ORDER BY 1",
             f->queue);
    rows = PQexec(f->conn, sql);
    qsort(ids, count, sizeof(*ids), compare_id);
    for (size_t i = 0; i < count; i++) {
        if (i > 0 && ids[i] == ids[i - 1])
            continue;
        if ((int)unique >= PQntuples(rows) ||
            ids[i] != strtoll(PQgetvalue(rows, (int)unique, 0), NULL, 10))
            fail_msg("%s: message %lld is not a committed row, or a row is missing",
                     f->broker->name, (long long)ids[i]);
        unique++;
    }
    assert_int_equal(unique, PQntuples(rows));
    PQclear(rows);
    free(ids);
    if (f->broker->exactly_once)
        assert_int_equal(count, unique);
    return count - unique;
}

/* assert_these_rows_delivered() of what the broker holds, which it takes. */
static size_t
assert_every_row_delivered(struct fixture *f)
{
    int64_t *ids;
    size_t count = f->broker->delivered(f, &ids, NULL);

    return assert_these_rows_delivered(f, ids, count);
}

/* ---- scenarios ---- */

static long long
count_where(struct fixture *f, const char *condition)
{
    char sql[512];

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM outbox.job WHERE queue = '%s' AND (%s)",
             f->queue, condition);
    return harness_query_ll(f->conn, sql);
}

/* Enqueues count rows of a single attempt each: one spent on no fault of theirs kills them. */
static void
enqueue_single_attempt_rows(struct fixture *f, int count)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g), max_attempts => 1))"
             " FROM generate_series(1, %d) AS g",
             f->queue, count);
    harness_query_ll(f->conn, sql);
}

/*
 * Runs stack.sh command (stop-service, start-service, restart-service) for
 * the broker's server. Until it is through, teardown counts the broker as
 * stopped, so that a failure leaves the next test a running broker.
 */
static void
broker_service(struct fixture *f, const char *command)
{
    f->broker_stopped = true;
    if (harness_stack(command, f->broker->service) != 0)
        fail_msg("%s: stack.sh %s %s failed", f->broker->name, command, f->broker->service);
    f->broker_stopped = strcmp(command, "stop-service") == 0;
}

/*
 * After the broker went away under a running relay: every row of the queue
 * succeeded with the one attempt it was given (none spent an attempt on the
 * outage, none died of it), the relay stops cleanly, and the broker holds
 * every committed row. The relay's log is printed when that fails.
 */
static void
assert_outage_cost_nothing(struct fixture *f, struct relay_process *relay, long long rows)
{
    long long unsettled = wait_for_value(f->conn,
                                         "SELECT count(*) FROM outbox.job"
                                         " WHERE state NOT IN ('succeeded', 'dead')",
                                         0, 90000);

    relay_signal(relay, SIGTERM);
    if (relay_wait(relay, 15000) != 0 || unsettled != 0 ||
        count_where(f, "state = 'succeeded' AND attempts = 1") != rows) {
        relay_dump_log(relay);
        fail_msg("%s: of %lld rows, %lld succeeded at their first attempt, %lld are dead,"
                 " %lld not settled",
                 f->broker->name, rows, count_where(f, "state = 'succeeded' AND attempts = 1"),
                 count_where(f, "state = 'dead'"), unsettled);
    }
    unlink(relay->log_path);
    f->broker->reconnect(f);
    assert_every_row_delivered(f);
}

/* A producer's rolled-back transaction: its row never reaches the broker, the committed one does. */
static void
test_rolled_back_row_is_never_published(void **state)
{
    struct fixture *f = *state;
    const char *extra[16];
    char sql[256];
    long long committed, rolled_back;
    int64_t *ids;
    size_t count;

    snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s', '{\"order\": 1}')", f->queue);
    harness_exec(f->conn, "BEGIN");
    committed = harness_query_ll(f->conn, sql);
    harness_exec(f->conn, "COMMIT");
    harness_exec(f->conn, "BEGIN");
    rolled_back = harness_query_ll(f->conn, sql);
    harness_exec(f->conn, "ROLLBACK");
    assert_true(rolled_back != committed);

    assert_int_equal(relay_run_once(f->url, f->broker_url, arguments(f, extra, 16, NULL)), 0);
    assert_int_equal(count_where(f, "state = 'succeeded'"), 1);
    count = f->broker->delivered(f, &ids, NULL);
    if (count != 1 || ids[0] != committed)
        fail_msg("%s: expected job %lld alone at the broker, found %zu messages (the first %lld)",
                 f->broker->name, committed, count, count > 0 ? (long long)ids[0] : -1LL);
    free(ids);
}

/*
 * A row over --max-message-bytes among ten good ones: dead at its first
 * attempt, with the reason; the ten are published, and only they.
 */
static void
test_oversized_row_dies_alone(void **state)
{
    struct fixture *f = *state;
    const char *const scenario[] = {"--max-message-bytes", "500", NULL};
    const char *extra[16];
    char sql[256];

    enqueue_rows(f->conn, f->queue, 5);
    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue('%s', jsonb_build_object('pad', repeat('x', 600)))", f->queue);
    harness_exec(f->conn, sql);
    enqueue_rows(f->conn, f->queue, 5);

    assert_int_equal(relay_run_once(f->url, f->broker_url, arguments(f, extra, 16, scenario)), 0);
    assert_int_equal(count_where(f, "state = 'dead' AND attempts = 1"
                                    " AND last_error LIKE '%exceeds the limit of 500%'"),
                     1);
    assert_int_equal(count_where(f, "state = 'succeeded' AND attempts = 1"), 10);
    harness_exec(f->conn, "DELETE FROM outbox.job WHERE state = 'dead'");
    assert_int_equal(assert_every_row_delivered(f), 0);
}

/*
 * A row with a header the broker obeys (NATS Nats-Rollup, RabbitMQ BCC) or
 * a routing key into a place it or the relay keeps (a Redis dedup record,
 * a Kafka internal topic), among ten good ones: dead at its first attempt,
 * saying what is reserved; the ten are published, and only they.
 */
static void
test_reserved_names_die_alone(void **state)
{
    struct fixture *f = *state;
    const char *extra[16];
    char sql[512];
    long long reserved = 0;

    enqueue_rows(f->conn, f->queue, 5);
    if (f->broker->reserved_header != NULL) {
        snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('%s', '{}', NULL, '%s', max_attempts => 5)",
                 f->queue, f->broker->reserved_header);
        harness_exec(f->conn, sql);
        reserved++;
    }
    if (f->broker->reserved_route != NULL) {
        snprintf(sql, sizeof(sql),
                 "SELECT outbox.enqueue('%s', '{}', routing_key => '%s', max_attempts => 5)",
                 f->queue, f->broker->reserved_route);
        harness_exec(f->conn, sql);
        reserved++;
    }
    enqueue_rows(f->conn, f->queue, 5);

    assert_int_equal(relay_run_once(f->url, f->broker_url, arguments(f, extra, 16, NULL)), 0);
    assert_int_equal(count_where(f, "state = 'dead' AND attempts = 1"
                                    " AND last_error LIKE '%is reserved%'"),
                     reserved);
    assert_int_equal(count_where(f, "state = 'succeeded' AND attempts = 1"), 10);
    harness_exec(f->conn, "DELETE FROM outbox.job WHERE state = 'dead'");
    assert_int_equal(assert_every_row_delivered(f), 0);
}

/*
 * The broker restarted while the relay publishes 20 000 rows of a single
 * attempt each: afterwards every row succeeded at its first attempt and is
 * at the broker. The relay is held (SIGSTOP) while the broker goes down, so
 * the restart falls mid-run however fast the relay drains and however slow
 * the broker stops; it then meets the stopped broker with a batch in hand.
 */
static void
test_restart_mid_run_costs_no_attempt(void **state)
{
    struct fixture *f = *state;
    const char *const scenario[] = {"--batch-size", "100", "--lease", "60", NULL};
    const char *extra[16];
    struct relay_process relay;

    enqueue_single_attempt_rows(f, 20000);
    relay_start_process(&relay, f->url, f->broker_url, arguments(f, extra, 16, scenario));
    wait_for_value(f->conn,
                   "SELECT least(count(*), 1000) FROM outbox.job WHERE state = 'succeeded'", 1000,
                   60000);
    relay_signal(&relay, SIGSTOP);
    broker_service(f, "stop-service");
    /* rows were still to go when the server went down */
    assert_true(count_where(f, "state = 'succeeded'") < 20000);
    relay_signal(&relay, SIGCONT);
    sleep(2); /* the relay meets the stopped broker */
    broker_service(f, "start-service");
    assert_outage_cost_nothing(f, &relay, 20000);
}

/*
 * The relay logged the broker going down: rows in hand given back, or the
 * connection lost (a batch whose reports had all come before the outage is
 * marked, and nothing is in hand to give back: Kafka's reports can be in
 * the client's buffers while the relay is stopped).
 */
static bool
noticed_outage(const struct relay_process *relay)
{
    const char *const given_back[] = {"given back", NULL};
    const char *const lost[] = {"broker connection lost", NULL};

    return relay_log_find(relay, 0, false, given_back, NULL, 0) >= 0 ||
           relay_log_find(relay, 0, false, lost, NULL, 0) >= 0;
}

/*
 * A broker that is down: at the start the relay waits for it (it neither
 * exits nor claims a row away); when the broker goes away for a few seconds
 * in the middle of a run, the rows in flight are given back, not failed.
 * Every row, of a single attempt each, succeeds at its first attempt.
 */
static void
test_outage_costs_no_attempt(void **state)
{
    struct fixture *f = *state;
    const char *const scenario[] = {"--batch-size", "100", "--lease", "60", NULL};
    const char *extra[16];
    struct relay_process relay;

    enqueue_single_attempt_rows(f, 20000);
    broker_service(f, "stop-service");
    relay_start_process(&relay, f->url, f->broker_url, arguments(f, extra, 16, scenario));
    sleep(2);
    assert_int_equal(kill(relay.pid, 0), 0); /* waiting for the broker, not exited */
    assert_int_equal(count_where(f, "state <> 'ready' OR attempts <> 0"), 0);
    broker_service(f, "start-service");

    wait_for_value(f->conn,
                   "SELECT least(count(*), 1000) FROM outbox.job WHERE state = 'succeeded'", 1000,
                   60000);
    /* held while the broker stops, so the outage meets it mid-run with a batch in hand */
    relay_signal(&relay, SIGSTOP);
    broker_service(f, "stop-service");
    relay_signal(&relay, SIGCONT);
    /* the relay noticed the outage */
    for (int i = 0; i < 100 && !noticed_outage(&relay); i++)
        usleep(100 * 1000);
    if (!noticed_outage(&relay)) {
        relay_dump_log(&relay);
        fail_msg("%s: the relay did not notice the broker going down", f->broker->name);
    }
    sleep(2); /* reconnects keep failing meanwhile */
    assert_int_equal(kill(relay.pid, 0), 0);
    assert_true(count_where(f, "state = 'succeeded'") < 20000);
    broker_service(f, "start-service");
    assert_outage_cost_nothing(f, &relay, 20000);
}


/* kill -9 mid-batch, then a --once run: every row delivered, none left behind. */
static void
test_kill_mid_batch_then_restart(void **state)
{
    struct fixture *f = *state;
    const char *const scenario[] = {"--batch-size", "500", NULL};
    const char *extra[16];
    struct relay_process relay;
    size_t duplicates;

    enqueue_rows(f->conn, f->queue, 20000);
    relay_start_process(&relay, f->url, f->broker_url, arguments(f, extra, 16, scenario));
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT least(count(*), 2000) FROM outbox.job"
                                    " WHERE state = 'succeeded'",
                                    2000, 60000),
                     2000);
    relay_signal(&relay, SIGKILL);
    assert_int_equal(relay_wait(&relay, 5000), 128 + SIGKILL);
    unlink(relay.log_path);

    /* the dead relay's rows come back after its 5 s lease; --once reaps them */
    wait_for_value(f->conn,
                   "SELECT count(*) FROM outbox.job WHERE state = 'running'"
                   " AND lease_until > now()",
                   0, 10000);
    /*
     * Reaped rows wait out a short retry delay, and --once publishes only
     * what is claimable now: a few runs, a second apart, finish the job.
     */
    for (int run = 0; run < 10; run++) {
        assert_int_equal(relay_run_once(f->url, f->broker_url, extra), 0);
        if (harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                      " WHERE state <> 'succeeded'") == 0)
            break;
        sleep(1);
    }
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state <> 'succeeded'"),
                     0);
    duplicates = assert_every_row_delivered(f);
    /* at most the killed relay's batches in flight (two pipelines, two batches each) */
    assert_true(duplicates <= 2 * 2 * 500);
    print_message("%s: duplicates after kill -9: %zu\n", f->broker->name, duplicates);
}

/*
 * A stop signal (SIGTERM, and SIGHUP alike, which a lost terminal sends):
 * exit 0 with a log line naming it, no row left running, exactly the
 * succeeded rows delivered.
 */
static void
stop_leaves_nothing_running(struct fixture *f, int signo, const char *name)
{
    const char *const scenario[] = {"--batch-size", "100", NULL};
    const char *needles[] = {"stopping", name, NULL};
    const char *extra[16];
    struct relay_process relay;
    long long succeeded;

    enqueue_rows(f->conn, f->queue, 20000);
    relay_start_process(&relay, f->url, f->broker_url, arguments(f, extra, 16, scenario));
    wait_for_value(f->conn, "SELECT least(count(*), 500) FROM outbox.job WHERE state = 'succeeded'",
                   500, 60000);
    relay_signal(&relay, signo);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    if (relay_log_find(&relay, 0, false, needles, NULL, 0) < 0) {
        relay_dump_log(&relay);
        fail_msg("no log line says the relay is stopping on %s", name);
    }
    unlink(relay.log_path);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'running'"),
                     0);
    succeeded = harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                          " WHERE state = 'succeeded'");
    assert_true(succeeded < 20000); /* stopped mid-run, not after the end */
    {
        int64_t *ids;
        size_t count = f->broker->delivered(f, &ids, NULL);

        /* what was marked succeeded is at the broker, and nothing else */
        assert_int_equal((long long)count, succeeded);
        free(ids);
    }
}

static void
test_sigterm_leaves_nothing_running(void **state)
{
    stop_leaves_nothing_running(*state, SIGTERM, "SIGTERM");
}

static void
test_sighup_leaves_nothing_running(void **state)
{
    stop_leaves_nothing_running(*state, SIGHUP, "SIGHUP");
}

/*
 * Fails when a message of an ordering key (ids: job ids in the order they
 * arrived) came after a later row of the same key; a repeat of the same row
 * is allowed (at least once).
 */
static void
assert_key_order_kept(struct fixture *f, const int64_t *ids, size_t count)
{
    size_t late = 0;
    char sql[256];
    PGresult *rows;
    int64_t *key_of, *highest, first_id, last_id;
    int n;

    snprintf(sql, sizeof(sql),
             "SELECT job_id, dense_rank() OVER (ORDER BY ordering_key) - 1 FROM outbox.job"
             " WHERE queue = '%s' ORDER BY 1",
             f->queue);
    rows = PQexec(f->conn, sql);
    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    n = PQntuples(rows);
    assert_true(n > 0);
    first_id = strtoll(PQgetvalue(rows, 0, 0), NULL, 10);
    last_id = strtoll(PQgetvalue(rows, n - 1, 0), NULL, 10);
    key_of = calloc((size_t)(last_id - first_id + 1), sizeof(*key_of));
    highest = calloc((size_t)n, sizeof(*highest));
    assert_true(key_of != NULL && highest != NULL);
    for (int i = 0; i < n; i++)
        key_of[strtoll(PQgetvalue(rows, i, 0), NULL, 10) - first_id] =
            strtoll(PQgetvalue(rows, i, 1), NULL, 10);
    PQclear(rows);
    for (size_t i = 0; i < count; i++) {
        int64_t key;

        assert_true(ids[i] >= first_id && ids[i] <= last_id);
        key = key_of[ids[i] - first_id];
        if (ids[i] < highest[key]) {
            if (late++ == 0)
                print_message("%s: job %lld arrived after job %lld of its key\n", f->broker->name,
                              (long long)ids[i], (long long)highest[key]);
        } else {
            highest[key] = ids[i];
        }
    }
    free(key_of);
    free(highest);
    if (late > 0)
        fail_msg("%s: %zu messages arrived after a later row of their key", f->broker->name, late);
}

/*
 * A relay stopped (SIGSTOP) past its lease while holding rows: another
 * relay reaps them and publishes the whole queue; when the first one goes
 * on, it must not publish what it held, or those rows arrive after later
 * rows of their keys. The first relay is stopped while its claim of the
 * next batch waits behind a table lock, so that it holds a batch claimed
 * ahead (the claim commits while the process is stopped) and nothing is
 * half written to the broker.
 */
static void
test_stopped_relay_keeps_key_order(void **state)
{
    struct fixture *f = *state;
    const char *const scenario[] = {"--batch-size", "50", "--concurrency", "1", "--lease", "5",
                                    NULL};
    const char *extra[16];
    struct relay_process first, second;
    PGconn *locker = harness_connect(f->url);
    int64_t *ids;
    size_t count;
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g),"
             " ordering_key => 'k' || (g %% 100))) FROM generate_series(1, 3000) AS g",
             f->queue);
    harness_query_ll(f->conn, sql);
    relay_start_process(&first, f->url, f->broker_url, arguments(f, extra, 16, scenario));
    wait_for_value(f->conn, "SELECT least(count(*), 300) FROM outbox.job WHERE state = 'succeeded'",
                   300, 60000);
    harness_exec(locker, "BEGIN; LOCK TABLE outbox.job IN SHARE MODE");
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT least(count(*), 1) FROM pg_stat_activity"
                                    " WHERE datname = current_database()"
                                    " AND wait_event_type = 'Lock'",
                                    1, 10000),
                     1);
    usleep(300 * 1000); /* the pipeline, not only the maintenance thread, waits on the lock */
    relay_signal(&first, SIGSTOP);
    harness_exec(locker, "COMMIT");
    PQfinish(locker);

    /* the stopped relay's leases run out; a second relay reaps its rows and does the rest */
    wait_for_value(f->conn,
                   "SELECT count(*) FROM outbox.job WHERE state = 'running'"
                   " AND lease_until > now()",
                   0, 15000);
    relay_start_process(&second, f->url, f->broker_url, extra);
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'",
                                    0, 60000),
                     0);
    relay_signal(&first, SIGCONT);
    sleep(2); /* the first relay's turns with what it held */
    relay_signal(&first, SIGTERM);
    relay_signal(&second, SIGTERM);
    assert_int_equal(relay_wait(&second, 15000), 0);
    if (relay_wait(&first, 15000) != 0)
        relay_dump_log(&first);
    unlink(first.log_path);
    unlink(second.log_path);
    count = f->broker->delivered(f, &ids, NULL);
    assert_key_order_kept(f, ids, count);
    assert_these_rows_delivered(f, ids, count);
}

static int
compare_text(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A database migrated on its own, as a team with a database per tenant has them. */
static char *
database_migrated_alone(void)
{
    char *url = harness_database_new_empty();
    PGconn *conn = harness_connect(url);
    struct outbox_error err;
    int applied = 0;

    if (outbox_migrate(conn, &applied, &err) != 0)
        fail_msg("unable to migrate a second database: %s", err.message);
    PQfinish(conn);
    return url;
}

/*
 * Two databases, each numbering its rows from 1, each with its relay, one
 * destination: the broker holds every row of both, under as many distinct
 * message ids, and each database's rows are all there by job id.
 */
static void
test_two_databases_into_one_destination(void **state)
{
    struct fixture *f = *state;
    char *other_url = database_migrated_alone();
    PGconn *other = harness_connect(other_url);
    const char *extra[16];
    char **message_ids;
    int64_t *ids;
    size_t count, distinct = 0;
    enum { ROWS = 300 };

    /* f->conn's database is a copy of the template: give it an identity of its own */
    harness_exec(f->conn, "SELECT outbox.identity_set('tenant-a')");
    enqueue_rows(f->conn, f->queue, ROWS);
    enqueue_rows(other, f->queue, ROWS);
    assert_int_equal(harness_query_ll(other, "SELECT max(job_id) FROM outbox.job"),
                     harness_query_ll(f->conn, "SELECT max(job_id) FROM outbox.job"));
    arguments(f, extra, 16, NULL);
    assert_int_equal(relay_run_once(f->url, f->broker_url, extra), 0);
    assert_int_equal(relay_run_once(other_url, f->broker_url, extra), 0);

    count = f->broker->delivered(f, &ids, &message_ids);
    qsort(message_ids, count, sizeof(*message_ids), compare_text);
    for (size_t i = 0; i < count; i++)
        if (i == 0 || strcmp(message_ids[i], message_ids[i - 1]) != 0)
            distinct++;
    if (distinct != 2 * ROWS)
        fail_msg("%s: %zu messages under %zu distinct message ids, expected %d (first %s)",
                 f->broker->name, count, distinct, 2 * ROWS, count > 0 ? message_ids[0] : "none");
    if (f->broker->exactly_once)
        assert_int_equal(count, 2 * ROWS);
    free_message_ids(message_ids, count);
    free(ids);
    PQfinish(other);
    harness_database_drop(other_url);
}

/*
 * What an asynchronous standby's promotion does to job ids, without a
 * standby: the relay published rows the new primary never received, so
 * its sequence hands the same job ids out again, on a new timeline. Here
 * the rows are deleted, the sequence set back and the recorded timeline
 * made older than the server's. The rows committed after the switch are
 * new messages: every one reaches the broker, none is taken for a
 * duplicate of the lost rows that had the same job ids.
 */
static void
test_reused_job_ids_after_a_history_change(void **state)
{
    struct fixture *f = *state;
    const char *extra[16];
    char **message_ids;
    int64_t *ids;
    size_t count, distinct = 0;
    enum { ROWS = 200 };

    arguments(f, extra, 16, NULL);
    enqueue_rows(f->conn, f->queue, ROWS);
    assert_int_equal(relay_run_once(f->url, f->broker_url, extra), 0);
    harness_exec(f->conn, "DELETE FROM outbox.job;"
                          " SELECT setval(pg_get_serial_sequence('outbox.job', 'job_id'), 1, false);"
                          " UPDATE outbox.identity SET timeline = timeline - 1");
    enqueue_rows(f->conn, f->queue, ROWS);
    assert_int_equal(harness_query_ll(f->conn, "SELECT max(job_id) FROM outbox.job"), ROWS);
    assert_int_equal(relay_run_once(f->url, f->broker_url, extra), 0);

    count = f->broker->delivered(f, &ids, &message_ids);
    qsort(message_ids, count, sizeof(*message_ids), compare_text);
    for (size_t i = 0; i < count; i++)
        if (i == 0 || strcmp(message_ids[i], message_ids[i - 1]) != 0)
            distinct++;
    if (distinct != 2 * ROWS)
        fail_msg("%s: %zu messages under %zu distinct message ids, expected %d",
                 f->broker->name, count, distinct, 2 * ROWS);
    if (f->broker->exactly_once)
        assert_int_equal(count, 2 * ROWS);
    /* the relay saw the new timeline: the history's epoch moved on */
    assert_int_equal(harness_query_ll(f->conn, "SELECT epoch FROM outbox.identity"), 2);
    free_message_ids(message_ids, count);
    free(ids);
}

static const struct broker_scenario SCENARIOS[] = {
    {"rolled_back_row_is_never_published", test_rolled_back_row_is_never_published},
    {"oversized_row_dies_alone", test_oversized_row_dies_alone},
    {"reserved_names_die_alone", test_reserved_names_die_alone},
    {"restart_mid_run_costs_no_attempt", test_restart_mid_run_costs_no_attempt},
    {"outage_costs_no_attempt", test_outage_costs_no_attempt},
    {"kill_mid_batch_then_restart", test_kill_mid_batch_then_restart},
    {"sigterm_leaves_nothing_running", test_sigterm_leaves_nothing_running},
    {"sighup_leaves_nothing_running", test_sighup_leaves_nothing_running},
    {"stopped_relay_keeps_key_order", test_stopped_relay_keeps_key_order},
    {"two_databases_into_one_destination", test_two_databases_into_one_destination},
    {"reused_job_ids_after_a_history_change", test_reused_job_ids_after_a_history_change},
};

/* Every scenario for every broker, "broker: scenario"; OUTBOX_TEST_FILTER picks some. */
int
main(void)
{
    return broker_matrix_run("relay_brokers", BROKERS, sizeof(BROKERS) / sizeof(BROKERS[0]),
                             sizeof(BROKERS[0]), SCENARIOS, sizeof(SCENARIOS) / sizeof(SCENARIOS[0]),
                             setup, teardown);
}
