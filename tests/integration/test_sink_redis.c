/*
 * test_sink_redis.c - the Redis Streams sink against a real Redis 7.
 *
 * Needs OUTBOX_TEST_REDIS_URL (redis://:password@127.0.0.1:port/db); every
 * test is skipped without it. Each test works on its own key prefix and
 * deletes its keys afterwards. The restart test uses
 * OUTBOX_TEST_STACK_DIR + tests/harness/stack.sh when set, else starts and
 * restarts a private redis-server of its own (skipped when there is none).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "redis_consumer.h"
#include "sink.h"
#include "sink_redis.h"
#include "url.h"

#define TEST_PASSWORD "outbox-test-secret"

/* Per-test state: a consumer connection and a key prefix of its own. */
struct fixture {
    const char *url;
    redisContext *consumer;
    char prefix[96];
    char stream[160];
    bool memory_limited;       /* a test set maxmemory: teardown lifts it */
    bool busy_threshold;       /* a test lowered busy-reply-threshold: teardown restores it */
    redisContext *busy_client; /* runs a long script; teardown waits for its end */
};

/* A batch of messages with owned payload texts. */
struct batch {
    struct sink_message *messages;
    struct sink_outcome *outcomes;
    char **payloads;
    size_t count;
};

static void
sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Builds count messages for queue, job ids first_job_id.., ~payload_size bytes each. */
static void
batch_init(struct batch *b, const char *queue, int64_t first_job_id, size_t count,
           size_t payload_size)
{
    b->count = count;
    b->messages = calloc(count, sizeof(*b->messages));
    b->outcomes = calloc(count, sizeof(*b->outcomes));
    b->payloads = calloc(count, sizeof(*b->payloads));
    assert_non_null(b->messages);
    assert_non_null(b->outcomes);
    assert_non_null(b->payloads);
    for (size_t i = 0; i < count; i++) {
        size_t pad = payload_size > 40 ? payload_size - 40 : 1;
        char *text = malloc(pad + 64);
        int n;

        assert_non_null(text);
        n = snprintf(text, 64, "{\"order\":%zu,\"pad\":\"", i);
        memset(text + n, 'x', pad);
        strcpy(text + n + pad, "\"}");
        b->payloads[i] = text;
        b->messages[i].job_id = first_job_id + (int64_t)i;
        b->messages[i].history = "test:1";
        snprintf(b->messages[i].message_id, sizeof(b->messages[i].message_id), "%lld",
                 (long long)b->messages[i].job_id);
        snprintf(b->messages[i].dedup_id, sizeof(b->messages[i].dedup_id), "test:1:%lld",
                 (long long)b->messages[i].job_id);
        b->messages[i].attempt = 1;
        b->messages[i].queue = queue;
        b->messages[i].payload = text;
        b->messages[i].payload_len = strlen(text);
        b->messages[i].headers = "{\"source\":\"test\"}";
        b->messages[i].created_at = 1764474000.5;
    }
}

static void
batch_clear(struct batch *b)
{
    for (size_t i = 0; i < b->count; i++)
        free(b->payloads[i]);
    free(b->payloads);
    free(b->messages);
    free(b->outcomes);
    memset(b, 0, sizeof(*b));
}

/* Number of outcomes with the given status. */
static size_t
count_status(const struct batch *b, enum sink_status status)
{
    size_t n = 0;

    for (size_t i = 0; i < b->count; i++)
        if (b->outcomes[i].status == status)
            n++;
    return n;
}

/* A connected sink on url with the fixture's prefix. */
static sink *
open_sink(const char *url, const char *prefix, int64_t dedup_window_ms, int64_t maxlen,
          int io_timeout_ms)
{
    struct sink_options options = {0};
    /* read at sink_new(), not kept: a local is enough */
    struct sink_redis_config redis = {.stream_prefix = prefix,
                                      .dedup_window_ms = dedup_window_ms,
                                      .stream_maxlen = maxlen,
                                      .wait_replicas = SINK_REDIS_WAIT_BY_TOPOLOGY};
    struct outbox_error err;
    sink *s;

    options.url = url;
    *sink_options_broker(&options, "redis") = &redis;
    options.connect_timeout_ms = 2000;
    options.io_timeout_ms = io_timeout_ms;
    s = sink_new(&options, &err);
    if (s == NULL)
        fail_msg("sink_new: %s", err.message);
    if (sink_connect(s, &err) != 0)
        fail_msg("sink_connect: %s", err.message);
    assert_true(sink_is_connected(s));
    assert_string_equal(sink_kind(s), "redis");
    return s;
}

/* Runs a command on the consumer connection, given as NULL-terminated strings. */
static redisReply *
run(redisContext *context, const char *first, ...)
{
    const char *argv[16];
    int argc = 0;
    va_list ap;

    va_start(ap, first);
    for (const char *arg = first; arg != NULL && argc < 16; arg = va_arg(ap, const char *))
        argv[argc++] = arg;
    va_end(ap);
    return stream_consumer_command(context, argc, argv);
}

/* Runs a command and checks its reply is not an error. */
static void
run_ok(redisContext *context, const char *first, const char *second, const char *third,
       const char *fourth)
{
    redisReply *reply = run(context, first, second, third, fourth, (const char *)NULL);

    assert_non_null(reply);
    if (reply->type == REDIS_REPLY_ERROR)
        fail_msg("%s: %s", first, reply->str);
    freeReplyObject(reply);
}

static int
setup(void **state)
{
    static unsigned sequence;
    const char *url = getenv("OUTBOX_TEST_REDIS_URL");
    struct fixture *f;

    if (url == NULL || url[0] == '\0') {
        *state = NULL;
        return 0;
    }
    f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->url = url;
    f->consumer = stream_consumer_connect(url);
    if (f->consumer == NULL) {
        free(f);
        fail_msg("cannot connect to OUTBOX_TEST_REDIS_URL");
    }
    snprintf(f->prefix, sizeof(f->prefix), "outbox-test:%ld:%u:", (long)getpid(), ++sequence);
    snprintf(f->stream, sizeof(f->stream), "%sorders", f->prefix);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    char user[64];

    if (f == NULL)
        return 0;
    if (f->memory_limited)
        freeReplyObject(run(f->consumer, "CONFIG", "SET", "maxmemory", "0", (const char *)NULL));
    if (f->busy_client != NULL) {
        redisReply *reply = NULL;

        if (redisGetReply(f->busy_client, (void **)&reply) == REDIS_OK)
            freeReplyObject(reply);
        redisFree(f->busy_client);
    }
    if (f->busy_threshold)
        freeReplyObject(
            run(f->consumer, "CONFIG", "SET", "busy-reply-threshold", "5000", (const char *)NULL));
    stream_consumer_delete_test_keys(f->consumer, f->prefix);
    snprintf(user, sizeof(user), "outbox-test-%ld", (long)getpid());
    freeReplyObject(run(f->consumer, "ACL", "DELUSER", user, (const char *)NULL));
    redisFree(f->consumer);
    free(f);
    return 0;
}

#define NEED_REDIS(f)                                                                              \
    do {                                                                                           \
        if ((f) == NULL) {                                                                         \
            print_message("OUTBOX_TEST_REDIS_URL is not set: skipped\n");                          \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* One append: the exact fields, in order, of the entry. */
static void
test_entry_has_exact_fields(void **state)
{
    struct fixture *f = *state;
    struct sink_message message = {0};
    struct sink_outcome outcome;
    struct outbox_error err;
    redisReply *reply;
    const redisReply *fields;
    static const char *const expected[] = {
        "job_id",         "42",      "queue", "orders", "payload", "{\"total\": 12.5}", "headers",
        "{\"k\": \"v\"}", "attempt", "3", "message_id", "test:1:42"};
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    message.job_id = 42;
    message.history = "test:1";
    snprintf(message.message_id, sizeof(message.message_id), "test:1:42");
    snprintf(message.dedup_id, sizeof(message.dedup_id), "test:1:42");
    message.attempt = 3;
    message.queue = "orders";
    message.payload = "{\"total\": 12.5}";
    message.payload_len = strlen(message.payload);
    message.headers = "{\"k\": \"v\"}";
    assert_int_equal(sink_publish(s, &message, 1, &outcome, &err), 0);
    assert_int_equal(outcome.status, SINK_ACCEPTED);
    assert_string_equal(outcome.reason, "");

    reply = run(f->consumer, "XRANGE", f->stream, "-", "+", (const char *)NULL);
    assert_non_null(reply);
    assert_int_equal(reply->type, REDIS_REPLY_ARRAY);
    assert_int_equal(reply->elements, 1);
    fields = reply->element[0]->element[1];
    assert_int_equal(fields->elements, 12);
    for (size_t i = 0; i < 12; i++)
        assert_string_equal(fields->element[i]->str, expected[i]);
    freeReplyObject(reply);
    sink_free(s);
}

/* A consumer group reads every message of a 5 000-message batch exactly once. */
static void
test_consumer_group_reads_batch_once(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    redisReply *reply;
    bool *seen;
    size_t total = 0;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    batch_init(&b, "orders", 1000, 5000, 200);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 5000);

    reply = run(f->consumer, "XGROUP", "CREATE", f->stream, "workers", "0", (const char *)NULL);
    assert_non_null(reply);
    assert_int_equal(reply->type, REDIS_REPLY_STATUS);
    freeReplyObject(reply);
    seen = calloc(5000, sizeof(*seen));
    assert_non_null(seen);
    for (int round = 0; round < 100; round++) {
        reply = run(f->consumer, "XREADGROUP", "GROUP", "workers", "consumer-1", "COUNT", "700",
                    "STREAMS", f->stream, ">", (const char *)NULL);
        const redisReply *entries;

        assert_non_null(reply);
        if (reply->type == REDIS_REPLY_NIL) {
            freeReplyObject(reply);
            break;
        }
        assert_int_equal(reply->type, REDIS_REPLY_ARRAY);
        entries = reply->element[0]->element[1];
        for (size_t i = 0; i < entries->elements; i++) {
            const redisReply *fields = entries->element[i]->element[1];
            long long job_id;

            assert_string_equal(fields->element[0]->str, "job_id");
            job_id = strtoll(fields->element[1]->str, NULL, 10);
            assert_in_range(job_id, 1000, 5999);
            assert_false(seen[job_id - 1000]);
            seen[job_id - 1000] = true;
            total++;
        }
        freeReplyObject(reply);
    }
    assert_int_equal(total, 5000);
    free(seen);
    batch_clear(&b);
    sink_free(s);
}

/*
 * Rows reset to ready after a crash between the append and the mark are
 * published again: accepted, and nothing is appended a second time.
 */
static void
test_republish_is_deduplicated(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct stream_consumer_stream entries;
    struct batch b;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    batch_init(&b, "orders", 1, 300, 100);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 300);

    for (size_t i = 0; i < b.count; i++)
        b.messages[i].attempt = 2;
    memset(b.outcomes, 0xff, b.count * sizeof(*b.outcomes));
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 300);
    assert_string_equal(b.outcomes[0].reason, "");

    /* a new sink (another relay) sees the same records */
    sink_free(s);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 300);

    assert_int_equal(stream_consumer_read_stream(f->consumer, f->stream, &entries), 0);
    assert_int_equal(entries.count, 300);
    for (size_t i = 0; i < entries.count; i++) {
        assert_int_equal(entries.entries[i].job_id, (int64_t)i + 1);
        assert_int_equal(entries.entries[i].attempt, 1);
        assert_int_equal(entries.entries[i].field_count, 6);
    }
    stream_consumer_stream_clear(&entries);
    batch_clear(&b);
    sink_free(s);
}

/*
 * The dedup window is a promise with an end: with a 200 ms window the same
 * job is appended again once its record expired.
 */
static void
test_dedup_window_expires(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    char dedup_key[256];
    int waited = 0;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 200, 0, 5000);
    batch_init(&b, "orders", 77, 10, 100);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 10);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 10);

    /* the documented record: {<stream>}:outbox-dedup:<dedup id> = entry id, expiring */
    snprintf(dedup_key, sizeof(dedup_key), "{%s}:outbox-dedup:test:1:77", f->stream);
    for (;;) {
        redisReply *reply = run(f->consumer, "PTTL", dedup_key, (const char *)NULL);
        long long ttl;

        assert_non_null(reply);
        ttl = reply->integer;
        freeReplyObject(reply);
        if (ttl == -2)
            break;
        assert_in_range(ttl, 0, 200);
        assert_true(waited < 3000);
        sleep_ms(50);
        waited += 50;
    }
    sleep_ms(50); /* the other records were written in the same round trip */
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 10);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 20);
    batch_clear(&b);
    sink_free(s);
}

/* A key that is not a stream fails only its message; the dedup record is not written. */
static void
test_wrong_type_fails_only_its_message(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    char bad_stream[200];
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    snprintf(bad_stream, sizeof(bad_stream), "%sbilling", f->prefix);
    run_ok(f->consumer, "SET", bad_stream, "not a stream", NULL);
    batch_init(&b, "orders", 500, 3, 100);
    b.messages[1].queue = "billing";
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(b.outcomes[0].status, SINK_ACCEPTED);
    assert_int_equal(b.outcomes[1].status, SINK_FAILED);
    assert_non_null(strstr(b.outcomes[1].reason, "WRONGTYPE"));
    assert_null(strstr(b.outcomes[1].reason, "script:"));
    assert_int_equal(b.outcomes[2].status, SINK_ACCEPTED);
    assert_true(sink_is_connected(s));
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 2);

    /* once the key is fixed, the failed message is appended on its retry */
    run_ok(f->consumer, "DEL", bad_stream, NULL, NULL);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 3);
    assert_int_equal(stream_consumer_stream_length(f->consumer, bad_stream), 1);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 2);
    batch_clear(&b);
    sink_free(s);
}

/*
 * A batch larger than one script call, over two streams, with an oversized
 * message and a refused stream in it: every outcome lands on its own
 * message, whichever call carried it.
 */
static void
test_large_mixed_batch_keeps_each_outcome(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    char bad_stream[200], payments_stream[200];
    sink *s;
    size_t accepted = 0;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    snprintf(bad_stream, sizeof(bad_stream), "%sbilling", f->prefix);
    snprintf(payments_stream, sizeof(payments_stream), "%spayments", f->prefix);
    run_ok(f->consumer, "SET", bad_stream, "not a stream", NULL);
    batch_init(&b, "orders", 9000, 333, 100);
    for (size_t i = 0; i < b.count; i++) {
        if (i % 3 == 1)
            b.messages[i].queue = "payments";
        if (i % 50 == 7)
            b.messages[i].queue = "billing";
    }
    b.messages[150].payload_len = 1u << 30; /* over the default limit: never sent */

    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    for (size_t i = 0; i < b.count; i++) {
        if (i == 150) {
            assert_int_equal(b.outcomes[i].status, SINK_REJECTED);
        } else if (i % 50 == 7) {
            assert_int_equal(b.outcomes[i].status, SINK_FAILED);
            assert_non_null(strstr(b.outcomes[i].reason, "WRONGTYPE"));
            assert_non_null(strstr(b.outcomes[i].reason, "billing"));
        } else {
            assert_int_equal(b.outcomes[i].status, SINK_ACCEPTED);
            accepted++;
        }
    }
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream) +
                         stream_consumer_stream_length(f->consumer, payments_stream),
                     (long long)accepted);

    /* published again, nothing is appended twice */
    b.messages[150].payload_len = strlen(b.messages[150].payload);
    run_ok(f->consumer, "DEL", bad_stream, NULL, NULL);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), b.count);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream) +
                         stream_consumer_stream_length(f->consumer, payments_stream) +
                         stream_consumer_stream_length(f->consumer, bad_stream),
                     (long long)b.count);
    run_ok(f->consumer, "DEL", payments_stream, NULL, NULL);
    run_ok(f->consumer, "DEL", bad_stream, NULL, NULL);
    batch_clear(&b);
    sink_free(s);
}

/* MAXLEN ~ N keeps the stream near N entries. */
static void
test_maxlen_trims(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    long long length;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 100, 5000);
    batch_init(&b, "orders", 1, 3000, 50);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 3000);
    length = stream_consumer_stream_length(f->consumer, f->stream);
    /* approximate trimming works on whole radix-tree nodes (100 entries by default) */
    assert_in_range(length, 100, 300);
    batch_clear(&b);
    sink_free(s);
}

/* A flushed script cache (SCRIPT FLUSH, failover) is recovered within the same publish. */
static void
test_noscript_falls_back_to_eval(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    run_ok(f->consumer, "SCRIPT", "FLUSH", NULL, NULL);
    batch_init(&b, "orders", 1, 50, 100);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 50);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 50);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 50);
    batch_clear(&b);
    sink_free(s);
}

/*
 * Redis over its memory limit refuses writes (OOM): every message of the
 * batch fails with that text, nothing is appended or recorded, the
 * connection stays up, and the same batch goes through once memory is back.
 */
static void
test_out_of_memory_fails_then_recovers(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    batch_init(&b, "orders", 1, 150, 100);
    f->memory_limited = true;
    run_ok(f->consumer, "CONFIG", "SET", "maxmemory", "1");
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_FAILED), 150);
    for (size_t i = 0; i < b.count; i++)
        assert_non_null(strstr(b.outcomes[i].reason, "OOM"));
    assert_true(sink_is_connected(s));
    run_ok(f->consumer, "CONFIG", "SET", "maxmemory", "0");
    f->memory_limited = false;
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 0);

    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 150);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 150);
    batch_clear(&b);
    sink_free(s);
}

/*
 * Redis busy with another client's long script answers every call BUSY: the
 * whole call fails, each of its messages with that text, and the batch goes
 * through once the script is done.
 */
static void
test_busy_server_fails_whole_calls_then_recovers(void **state)
{
    static const char busy_script[] =
        "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2]"
        " repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > 3000000"
        " return 1";
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    redisReply *reply = NULL;
    bool busy = false;
    int done = 0;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 5000);
    batch_init(&b, "orders", 1, 150, 100);
    f->busy_threshold = true;
    run_ok(f->consumer, "CONFIG", "SET", "busy-reply-threshold", "100");
    f->busy_client = stream_consumer_connect(f->url);
    assert_non_null(f->busy_client);
    /* start the script without waiting for its reply */
    redisAppendCommand(f->busy_client, "EVAL %s 0", busy_script);
    while (!done)
        assert_int_equal(redisBufferWrite(f->busy_client, &done), REDIS_OK);
    /* wait until the server answers BUSY (the script ran past the threshold), at most 2 s */
    for (int i = 0; i < 40 && !busy; i++) {
        reply = run(f->consumer, "PING", (const char *)NULL);
        busy = reply != NULL && reply->type == REDIS_REPLY_ERROR &&
               strncmp(reply->str, "BUSY", 4) == 0;
        freeReplyObject(reply);
        reply = NULL;
        if (!busy)
            usleep(50 * 1000);
    }
    assert_true(busy);

    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    /* the call as a whole was refused: no message's fault, so no attempt spent */
    assert_int_equal(count_status(&b, SINK_DEFERRED), 150);
    for (size_t i = 0; i < b.count; i++)
        assert_non_null(strstr(b.outcomes[i].reason, "BUSY"));
    assert_true(sink_is_connected(s));

    assert_int_equal(redisGetReply(f->busy_client, (void **)&reply), REDIS_OK);
    freeReplyObject(reply);
    redisFree(f->busy_client);
    f->busy_client = NULL;
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 150);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 150);
    batch_clear(&b);
    sink_free(s);
}

/* Builds redis://[:password@]host:port[/db] from the test URL's host and port. */
static void
make_url(char *out, size_t size, const char *test_url, const char *password, int db)
{
    struct broker_url parsed;
    struct outbox_error err;

    assert_int_equal(sink_url_parse(test_url, &parsed, &err), 0);
    if (password != NULL)
        snprintf(out, size, "redis://:%s@%s:%d/%d", password, parsed.host, parsed.port, db);
    else
        snprintf(out, size, "redis://%s:%d/%d", parsed.host, parsed.port, db);
    url_clear(&parsed);
}

/* Connect must fail with code; returns nothing, checks the message hides secrets. */
static void
expect_connect_failure(const char *url, enum outbox_error_code code, const char *secret)
{
    struct sink_options options = {0};
    struct outbox_error err;
    sink *s;

    options.url = url;
    options.connect_timeout_ms = 2000;
    s = sink_new(&options, &err);
    if (s == NULL)
        fail_msg("sink_new: %s", err.message);
    assert_int_equal(sink_connect(s, &err), -1);
    if (err.code != code)
        fail_msg("expected %s, got %s: %s", outbox_error_code_name(code),
                 outbox_error_code_name(err.code), err.message);
    assert_false(sink_is_connected(s));
    assert_true(err.message[0] != '\0');
    if (secret != NULL) {
        assert_null(strstr(err.message, secret));
        assert_non_null(strstr(err.message, "***"));
    }
    assert_null(strstr(err.message, TEST_PASSWORD));
    sink_free(s);
}

static void
test_wrong_password_is_config_error(void **state)
{
    struct fixture *f = *state;
    char url[512];

    NEED_REDIS(f);
    make_url(url, sizeof(url), f->url, "not-the-secret-4711", 0);
    expect_connect_failure(url, OUTBOX_ERR_CONFIG, "not-the-secret-4711");
    /* no password at all against a server that requires one */
    make_url(url, sizeof(url), f->url, NULL, 0);
    expect_connect_failure(url, OUTBOX_ERR_CONFIG, NULL);
}

static void
test_db_out_of_range_is_config_error(void **state)
{
    struct fixture *f = *state;
    char url[512];

    NEED_REDIS(f);
    make_url(url, sizeof(url), f->url, TEST_PASSWORD, 99999);
    expect_connect_failure(url, OUTBOX_ERR_CONFIG, NULL);
}

/* redis://user:password@... authenticates an ACL user (AUTH user password). */
static void
test_acl_user_can_publish(void **state)
{
    struct fixture *f = *state;
    struct broker_url parsed;
    struct outbox_error err;
    struct batch b;
    char user[64], url[512];
    redisReply *reply;
    sink *s;

    NEED_REDIS(f);
    snprintf(user, sizeof(user), "outbox-test-%ld", (long)getpid());
    reply = run(f->consumer, "ACL", "SETUSER", user, "reset", "on", ">acl-secret-99", "~*", "&*",
                "+@all", (const char *)NULL);
    assert_non_null(reply);
    assert_int_equal(reply->type, REDIS_REPLY_STATUS);
    freeReplyObject(reply);
    assert_int_equal(sink_url_parse(f->url, &parsed, &err), 0);
    snprintf(url, sizeof(url), "redis://%s:acl-secret-99@%s:%d/%d", user, parsed.host, parsed.port,
             sink_redis_url_db(&parsed));
    url_clear(&parsed);

    s = open_sink(url, f->prefix, 0, 0, 5000);
    assert_null(strstr(sink_display_url(s), "acl-secret-99"));
    batch_init(&b, "orders", 1, 5, 100);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 5);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 5);
    sink_free(s);

    assert_int_equal(sink_url_parse(f->url, &parsed, &err), 0);
    snprintf(url, sizeof(url), "redis://%s:wrong-acl-secret@%s:%d/%d", user, parsed.host,
             parsed.port, sink_redis_url_db(&parsed));
    url_clear(&parsed);
    expect_connect_failure(url, OUTBOX_ERR_CONFIG, "wrong-acl-secret");
    batch_clear(&b);
}

/* A loopback port nobody listens on (bound, read, closed). */
static int
unused_port(void)
{
    struct sockaddr_in address = {0};
    socklen_t length = sizeof(address);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    assert_true(fd >= 0);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&address, sizeof(address)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&address, &length), 0);
    port = ntohs(address.sin_port);
    close(fd);
    return port;
}

static void
test_refused_port_is_connection_error(void **state)
{
    struct fixture *f = *state;
    char url[128];

    NEED_REDIS(f);
    snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d/0", TEST_PASSWORD, unused_port());
    expect_connect_failure(url, OUTBOX_ERR_CONNECTION, NULL);
}

/*
 * The server stops answering mid-publish (CLIENT PAUSE WRITE): publish
 * returns -1 with OUTBOX_ERR_TIMEOUT, every message failed, the sink
 * disconnected; after reconnecting the retry appends each job once.
 */
static void
test_timeout_fails_batch_and_retry_dedups(void **state)
{
    struct fixture *f = *state;
    struct outbox_error err;
    struct batch b;
    long long length;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f->url, f->prefix, 0, 0, 300);
    batch_init(&b, "orders", 1, 40, 100);
    run_ok(f->consumer, "CLIENT", "PAUSE", "1500", "WRITE");
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_TIMEOUT);
    assert_true(outbox_error_is_transient(&err));
    assert_int_equal(count_status(&b, SINK_DEFERRED), 40);
    assert_false(sink_is_connected(s));
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONNECTION);

    /* the paused appends died with the connection or ran: either way none is doubled */
    run_ok(f->consumer, "CLIENT", "UNPAUSE", NULL, NULL);
    length = stream_consumer_stream_length(f->consumer, f->stream);
    assert_true(length == 0 || length == 40);
    assert_int_equal(sink_connect(s, &err), 0);
    assert_int_equal(sink_publish(s, b.messages, b.count, b.outcomes, &err), 0);
    assert_int_equal(count_status(&b, SINK_ACCEPTED), 40);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 40);
    batch_clear(&b);
    sink_free(s);
}

/* ---- restart ---------------------------------------------------------- */

/* A redis-server of the test's own, used when no stack dir is given. */
struct private_server {
    pid_t pid;
    int port;
    char dir[64];
    char url[128];
};

static int
private_server_start(struct private_server *server)
{
    char port[16];

    snprintf(port, sizeof(port), "%d", server->port);
    server->pid = fork();
    if (server->pid < 0)
        return -1;
    if (server->pid == 0) {
        int null = open("/dev/null", O_WRONLY);

        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
               "--requirepass", TEST_PASSWORD, "--dir", server->dir, "--appendonly", "yes",
               "--appendfsync", "always", "--save", "", "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) {
        redisContext *context = stream_consumer_connect(server->url);

        if (context != NULL) {
            redisReply *reply = run(context, "PING", (const char *)NULL);
            bool ready = reply != NULL && reply->type == REDIS_REPLY_STATUS;

            freeReplyObject(reply);
            redisFree(context);
            if (ready)
                return 0;
        }
        if (waitpid(server->pid, NULL, WNOHANG) == server->pid) {
            server->pid = 0;
            return -1;
        }
        sleep_ms(50);
    }
    return -1;
}

static void
private_server_stop(struct private_server *server)
{
    if (server->pid <= 0)
        return;
    kill(server->pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(server->pid, NULL, WNOHANG) == server->pid) {
            server->pid = 0;
            return;
        }
        sleep_ms(50);
    }
    kill(server->pid, SIGKILL);
    waitpid(server->pid, NULL, 0);
    server->pid = 0;
}

static void
private_server_remove_dir(struct private_server *server)
{
    char command[128];

    if (server->dir[0] == '\0')
        return;
    snprintf(command, sizeof(command), "rm -rf '%s'", server->dir);
    if (system(command) != 0)
        print_message("could not remove %s\n", server->dir);
}

/* Restarts the server behind url; 0 or -1. */
static int
restart_server(const char *stack_dir, struct private_server *server)
{
    if (stack_dir != NULL) {
        char command[1024];

        snprintf(command, sizeof(command),
                 "tests/harness/stack.sh restart-service '%s' redis >/dev/null", stack_dir);
        return system(command) == 0 ? 0 : -1;
    }
    private_server_stop(server);
    return private_server_start(server);
}

/*
 * Redis restarts between two publishes: the publish on the dead connection
 * returns -1 with every message failed and the sink disconnected; after the
 * restart connect + publish work, and republishing everything leaves each
 * job exactly once in the stream (whether or not the server kept its data).
 * sink_idle() then pings a quiet connection and notices the next restart.
 */
static void
test_restart_fails_batch_then_recovers(void **state)
{
    struct fixture *f = *state;
    const char *stack_dir = getenv("OUTBOX_TEST_STACK_DIR");
    struct private_server server = {0};
    struct stream_consumer_stream entries = {0};
    struct outbox_error err;
    struct batch first, second;
    const char *url;
    redisContext *consumer = NULL;
    bool *seen = NULL;
    sink *s = NULL;
    int connected = -1;

    NEED_REDIS(f);
    if (stack_dir != NULL && stack_dir[0] != '\0') {
        if (access("tests/harness/stack.sh", X_OK) != 0) {
            print_message("tests/harness/stack.sh not found from the working directory\n");
            skip();
        }
        url = f->url;
    } else {
        stack_dir = NULL;
        strcpy(server.dir, "/tmp/outbox-redis-XXXXXX");
        if (mkdtemp(server.dir) == NULL) {
            print_message("no temp dir for a private redis-server: skipped\n");
            skip();
        }
        server.port = unused_port();
        snprintf(server.url, sizeof(server.url), "redis://:%s@127.0.0.1:%d/0", TEST_PASSWORD,
                 server.port);
        if (private_server_start(&server) != 0) {
            private_server_stop(&server);
            private_server_remove_dir(&server);
            print_message("could not start a private redis-server: skipped\n");
            skip();
        }
        url = server.url;
    }

    batch_init(&first, "orders", 1, 200, 150);
    batch_init(&second, "orders", 201, 200, 150);
    s = open_sink(url, f->prefix, 0, 0, 2000);
    if (sink_publish(s, first.messages, first.count, first.outcomes, &err) != 0 ||
        count_status(&first, SINK_ACCEPTED) != 200) {
        print_message("first publish failed: %s\n", err.message);
        goto cleanup;
    }
    if (restart_server(stack_dir, &server) != 0) {
        print_message("restart failed\n");
        goto cleanup;
    }
    if (sink_publish(s, second.messages, second.count, second.outcomes, &err) != -1 ||
        err.code != OUTBOX_ERR_CONNECTION || count_status(&second, SINK_DEFERRED) != 200 ||
        sink_is_connected(s)) {
        print_message("publish on the dead connection did not fail the batch: %s\n", err.message);
        goto cleanup;
    }
    for (int i = 0; i < 100 && (connected = sink_connect(s, &err)) != 0; i++)
        sleep_ms(50); /* bounded: a restarted server may still be loading */
    if (connected != 0) {
        print_message("reconnect failed: %s\n", err.message);
        goto cleanup;
    }
    if (sink_publish(s, second.messages, second.count, second.outcomes, &err) != 0 ||
        count_status(&second, SINK_ACCEPTED) != 200 ||
        sink_publish(s, first.messages, first.count, first.outcomes, &err) != 0 ||
        count_status(&first, SINK_ACCEPTED) != 200) {
        print_message("publish after restart failed: %s\n", err.message);
        connected = -1;
        goto cleanup;
    }
    consumer = stream_consumer_connect(url);
    if (consumer == NULL || stream_consumer_read_stream(consumer, f->stream, &entries) != 0) {
        connected = -1;
        goto cleanup;
    }
    seen = calloc(400, sizeof(*seen));
    for (size_t i = 0; seen != NULL && i < entries.count; i++) {
        int64_t job_id = entries.entries[i].job_id;

        if (job_id < 1 || job_id > 400 || seen[job_id - 1]) {
            print_message("job %lld appended twice or unknown\n", (long long)job_id);
            connected = -1;
            break;
        }
        seen[job_id - 1] = true;
    }
    if (entries.count != 400) {
        print_message("expected 400 entries, found %zu\n", entries.count);
        connected = -1;
        goto cleanup;
    }

    /* idle: a ping after a quiet second keeps a healthy connection, finds a dead one */
    sleep_ms(1100);
    if (sink_idle(s, &err) != 0 || !sink_is_connected(s)) {
        print_message("idle on a healthy connection failed: %s\n", err.message);
        connected = -1;
        goto cleanup;
    }
    if (restart_server(stack_dir, &server) != 0) {
        print_message("second restart failed\n");
        connected = -1;
        goto cleanup;
    }
    sleep_ms(1100);
    if (sink_idle(s, &err) != -1 || sink_is_connected(s) || !outbox_error_is_transient(&err)) {
        print_message("idle did not notice the dead connection\n");
        connected = -1;
    }

cleanup:
    free(seen);
    stream_consumer_stream_clear(&entries);
    if (consumer != NULL)
        redisFree(consumer);
    consumer = stream_consumer_connect(url); /* afresh: the server may have restarted since */
    if (consumer != NULL) {
        stream_consumer_delete_prefix(consumer, f->prefix);
        redisFree(consumer);
    }
    sink_free(s);
    batch_clear(&first);
    batch_clear(&second);
    if (stack_dir == NULL) {
        private_server_stop(&server);
        private_server_remove_dir(&server);
    }
    assert_int_equal(connected, 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_entry_has_exact_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consumer_group_reads_batch_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_republish_is_deduplicated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dedup_window_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_type_fails_only_its_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_mixed_batch_keeps_each_outcome, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxlen_trims, setup, teardown),
        cmocka_unit_test_setup_teardown(test_noscript_falls_back_to_eval, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_memory_fails_then_recovers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_server_fails_whole_calls_then_recovers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_wrong_password_is_config_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_out_of_range_is_config_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_acl_user_can_publish, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_port_is_connection_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_fails_batch_and_retry_dedups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_fails_batch_then_recovers, setup, teardown),
    };

    /* a write to a connection the server closed must be an error, not a signal */
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests_name("sink_redis", tests, NULL, NULL);
}
