/*
 * test_sink_amqp.c - the RabbitMQ sink against a real broker.
 *
 * Needs OUTBOX_TEST_AMQP_URL (a throwaway RabbitMQ started by the suite,
 * configured with max_message_size = 1048576); every test is skipped
 * without it. The broker restart test also needs OUTBOX_TEST_STACK_DIR and
 * tests/harness/stack.sh, and is skipped without them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "amqp_consumer.h"
#include "harness.h"
#include "sink.h"
#include "sink_amqp.h"

#define BROKER_MAX_MESSAGE_BYTES 1048576

static const char *broker_url;

/* Per-test names, unique per run so reruns against one broker do not mix. */
static void
test_name(char *buffer, size_t size, const char *what)
{
    snprintf(buffer, size, "outbox-test-amqp-%ld-%s", (long)getpid(), what);
}

static struct sink_options
default_options(const char *url)
{
    struct sink_options options = {
        .url = url, /* the AMQP options stay the broker's defaults: the default exchange, verify,
                       30 s heartbeats */
        .connect_timeout_ms = 5000,
        .io_timeout_ms = 10000,
    };

    return options;
}

/* A connected sink for options, failing the test when that does not work. */
static sink *
connected_sink(const struct sink_options *options)
{
    struct outbox_error err = {0};
    sink *s = sink_new(options, &err);

    if (s == NULL)
        fail_msg("sink_new: %s", err.message);
    if (sink_connect(s, &err) != 0)
        fail_msg("sink_connect: %s", err.message);
    assert_true(sink_is_connected(s));
    return s;
}

static queue_consumer *
connected_consumer(void)
{
    queue_consumer *c = queue_consumer_connect(broker_url);

    if (c == NULL)
        fail_msg("unable to connect the test consumer to the broker");
    return c;
}

static void
must(queue_consumer *c, int rc)
{
    if (rc != 0)
        fail_msg("broker setup: %s", queue_consumer_error(c));
}

static struct sink_message
simple_message(int64_t job_id, const char *queue)
{
    struct sink_message message = {
        .job_id = job_id,
        .attempt = 1,
        .queue = queue,
        .payload = "{\"ok\":true}",
        .payload_len = strlen("{\"ok\":true}"),
        .headers = "{}",
        .created_at = 1700000000.0,
        .history = "test:1",
    };

    snprintf(message.message_id, sizeof(message.message_id), "%lld", (long long)job_id);
    snprintf(message.dedup_id, sizeof(message.dedup_id), "test:1:%lld", (long long)job_id);
    return message;
}

static void
assert_reason_contains(const struct sink_outcome *outcome, const char *fragment)
{
    if (strstr(outcome->reason, fragment) == NULL)
        fail_msg("reason '%s' lacks '%s'", outcome->reason, fragment);
}

/* Skips the calling test when no broker was given (cmocka 1.1 counts a skip in setup as an error). */
#define NEED_BROKER()                                                                    \
    do {                                                                                 \
        if (broker_url == NULL) {                                                        \
            print_message("OUTBOX_TEST_AMQP_URL not set: skipping\n");                    \
            skip();                                                                      \
        }                                                                                \
    } while (0)

static void
test_contract_properties_arrive(void **state)
{
    char queue[128];
    struct sink_options options = default_options(broker_url);
    struct sink_message message = simple_message(4242, NULL);
    struct sink_outcome outcome;
    struct outbox_error err = {0};
    struct queue_consumer_message got;
    const struct queue_consumer_header *header;
    const char *payload = "{\"order\":17,\"note\":\"caf\\u00e9\"}";
    size_t fetched = 0;
    queue_consumer *c;
    sink *s;

    (void)state;
    NEED_BROKER();
    test_name(queue, sizeof(queue), "props");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    s = connected_sink(&options);

    message.queue = queue;
    message.attempt = 3;
    message.payload = payload;
    message.payload_len = strlen(payload);
    message.headers = "{\"trace-id\": \"t-1\", \"greeting\": \"gr\\u00fc\\u00dfe \\ud83d\\ude00\"}";
    message.created_at = 1700000123.75;
    assert_int_equal(sink_publish(s, &message, 1, &outcome, &err), 0);
    assert_int_equal(outcome.status, SINK_ACCEPTED);
    assert_string_equal(outcome.reason, "");

    must(c, queue_consumer_fetch(c, queue, &got, 1, 5000, &fetched));
    assert_int_equal(fetched, 1);
    assert_string_equal(got.exchange, "");
    assert_string_equal(got.routing_key, queue);
    assert_string_equal(got.message_id, "4242");
    assert_string_equal(got.content_type, "application/json");
    assert_int_equal(got.delivery_mode, 2);
    assert_true(got.has_timestamp);
    assert_int_equal(got.timestamp, 1700000123);
    assert_string_equal(got.type, queue);
    assert_int_equal(got.body_len, strlen(payload));
    assert_memory_equal(got.body, payload, strlen(payload));
    assert_int_equal(got.header_count, 4);
    assert_int_equal(got.job_id, 4242);
    header = queue_consumer_message_header(&got, "trace-id");
    assert_non_null(header);
    assert_string_equal(header->text, "t-1");
    header = queue_consumer_message_header(&got, "greeting");
    assert_non_null(header);
    assert_string_equal(header->text, "gr\xc3\xbc\xc3\x9f" "e \xf0\x9f\x98\x80");
    header = queue_consumer_message_header(&got, "x-outbox-attempt");
    assert_non_null(header);
    assert_true(header->is_int);
    assert_int_equal(header->int_value, 3);

    queue_consumer_message_clear(&got);
    sink_free(s);
    must(c, queue_consumer_delete_queue(c, queue));
    queue_consumer_free(c);
}

static void
test_batch_of_2000_all_arrive(void **state)
{
    enum { COUNT = 2000 };
    char queue[128];
    struct sink_options options = default_options(broker_url);
    struct sink_message *messages;
    struct sink_outcome *outcomes;
    struct queue_consumer_message *got;
    struct outbox_error err = {0};
    unsigned char *seen;
    uint32_t count = 0;
    size_t fetched = 0;
    queue_consumer *c;
    sink *s;

    (void)state;
    NEED_BROKER();
    messages = calloc(COUNT, sizeof(*messages));
    outcomes = calloc(COUNT, sizeof(*outcomes));
    got = calloc(COUNT, sizeof(*got));
    seen = calloc(COUNT, 1);
    assert_non_null(messages);
    assert_non_null(outcomes);
    assert_non_null(got);
    assert_non_null(seen);
    test_name(queue, sizeof(queue), "batch");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    s = connected_sink(&options);

    for (int i = 0; i < COUNT; i++)
        messages[i] = simple_message(100000 + i, queue);
    assert_int_equal(sink_publish(s, messages, COUNT, outcomes, &err), 0);
    for (int i = 0; i < COUNT; i++)
        if (outcomes[i].status != SINK_ACCEPTED)
            fail_msg("message %d: status %d '%s'", i, outcomes[i].status, outcomes[i].reason);

    must(c, queue_consumer_count(c, queue, &count));
    assert_int_equal(count, COUNT);
    must(c, queue_consumer_fetch(c, queue, got, COUNT, 5000, &fetched));
    assert_int_equal(fetched, COUNT);
    for (size_t i = 0; i < fetched; i++) {
        long id = strtol(got[i].message_id, NULL, 10);

        assert_in_range(id, 100000, 100000 + COUNT - 1);
        assert_int_equal(seen[id - 100000], 0);
        seen[id - 100000] = 1;
        queue_consumer_message_clear(&got[i]);
    }

    sink_free(s);
    must(c, queue_consumer_delete_queue(c, queue));
    queue_consumer_free(c);
    free(messages);
    free(outcomes);
    free(got);
    free(seen);
}

static void
test_unroutable_fails_only_that_message(void **state)
{
    char queue[128], nowhere[128];
    struct sink_options options = default_options(broker_url);
    struct sink_message messages[5];
    struct sink_outcome outcomes[5];
    struct outbox_error err = {0};
    uint32_t count = 0;
    queue_consumer *c;
    sink *s;

    (void)state;
    NEED_BROKER();
    test_name(queue, sizeof(queue), "routable");
    test_name(nowhere, sizeof(nowhere), "nowhere");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    s = connected_sink(&options);

    for (int i = 0; i < 5; i++)
        messages[i] = simple_message(500 + i, i == 2 ? nowhere : queue);
    assert_int_equal(sink_publish(s, messages, 5, outcomes, &err), 0);
    for (int i = 0; i < 5; i++) {
        if (i == 2) {
            assert_int_equal(outcomes[i].status, SINK_FAILED);
            assert_reason_contains(&outcomes[i], "unroutable: 312 NO_ROUTE");
        } else if (outcomes[i].status != SINK_ACCEPTED) {
            fail_msg("message %d: '%s'", i, outcomes[i].reason);
        }
    }
    must(c, queue_consumer_count(c, queue, &count));
    assert_int_equal(count, 4);

    /* The sink stays usable: a routable message right after is accepted. */
    messages[0] = simple_message(510, queue);
    assert_int_equal(sink_publish(s, messages, 1, outcomes, &err), 0);
    assert_int_equal(outcomes[0].status, SINK_ACCEPTED);

    /* Idle keeps it alive; a polite disconnect and a reconnect work too. */
    assert_int_equal(sink_idle(s, &err), 0);
    sink_disconnect(s);
    assert_false(sink_is_connected(s));
    assert_int_equal(sink_connect(s, &err), 0);
    messages[0] = simple_message(511, queue);
    assert_int_equal(sink_publish(s, messages, 1, outcomes, &err), 0);
    assert_int_equal(outcomes[0].status, SINK_ACCEPTED);
    must(c, queue_consumer_count(c, queue, &count));
    assert_int_equal(count, 6);

    sink_free(s);
    must(c, queue_consumer_delete_queue(c, queue));
    queue_consumer_free(c);
}

static void
test_missing_exchange_fails_batch_then_recovers(void **state)
{
    char queue[128], exchange[128];
    struct sink_options options = default_options(broker_url);
    struct sink_amqp_config amqp = {.tls_verify = true};
    struct sink_message messages[3];
    struct sink_outcome outcomes[3];
    struct outbox_error err = {0};
    struct queue_consumer_message got;
    size_t fetched = 0;
    queue_consumer *c;
    sink *s;

    (void)state;
    NEED_BROKER();
    test_name(queue, sizeof(queue), "late-queue");
    test_name(exchange, sizeof(exchange), "late-exchange");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    amqp.exchange = exchange;
    *sink_options_broker(&options, "amqp") = &amqp;
    s = connected_sink(&options);

    for (int i = 0; i < 3; i++)
        messages[i] = simple_message(700 + i, queue);
    assert_int_equal(sink_publish(s, messages, 3, outcomes, &err), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(outcomes[i].status, SINK_FAILED);
        assert_reason_contains(&outcomes[i], "404 NOT_FOUND - no exchange");
    }
    assert_true(sink_is_connected(s));
    assert_int_equal(sink_idle(s, &err), 0);

    /* Once the exchange exists, the same sink publishes without a reconnect. */
    must(c, queue_consumer_declare_exchange(c, exchange, "direct"));
    must(c, queue_consumer_bind(c, queue, exchange, queue));
    assert_int_equal(sink_publish(s, messages, 3, outcomes, &err), 0);
    for (int i = 0; i < 3; i++)
        if (outcomes[i].status != SINK_ACCEPTED)
            fail_msg("message %d after recovery: '%s'", i, outcomes[i].reason);
    must(c, queue_consumer_fetch(c, queue, &got, 1, 5000, &fetched));
    assert_int_equal(fetched, 1);
    assert_string_equal(got.exchange, exchange);
    assert_string_equal(got.message_id, "700");
    queue_consumer_message_clear(&got);

    sink_free(s);
    must(c, queue_consumer_delete_queue(c, queue));
    must(c, queue_consumer_delete_exchange(c, exchange));
    queue_consumer_free(c);
}

static void
test_oversized_and_bad_headers_rejected_locally(void **state)
{
    char queue[128];
    struct sink_options options = default_options(broker_url);
    struct sink_message messages[4];
    struct sink_outcome outcomes[4];
    struct outbox_error err = {0};
    size_t big_len = BROKER_MAX_MESSAGE_BYTES + 1;
    char *big;
    uint32_t count = 0;
    queue_consumer *c;
    sink *s;

    (void)state;
    NEED_BROKER();
    big = malloc(big_len);
    assert_non_null(big);
    memset(big, 'x', big_len);
    big[0] = '"';
    big[big_len - 1] = '"';
    test_name(queue, sizeof(queue), "sizes");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    options.max_message_bytes = BROKER_MAX_MESSAGE_BYTES;
    s = connected_sink(&options);

    for (int i = 0; i < 4; i++)
        messages[i] = simple_message(900 + i, queue);
    messages[1].payload = big;
    messages[1].payload_len = big_len;
    messages[2].headers = "{\"retries\": 3}";
    assert_int_equal(sink_publish(s, messages, 4, outcomes, &err), 0);
    assert_int_equal(outcomes[0].status, SINK_ACCEPTED);
    assert_int_equal(outcomes[1].status, SINK_REJECTED);
    assert_reason_contains(&outcomes[1], "exceeds the limit of 1048576 bytes");
    assert_int_equal(outcomes[2].status, SINK_REJECTED);
    assert_reason_contains(&outcomes[2], "invalid headers: value of 'retries' is a number");
    assert_int_equal(outcomes[3].status, SINK_ACCEPTED);
    assert_true(sink_is_connected(s));
    must(c, queue_consumer_count(c, queue, &count));
    assert_int_equal(count, 2);

    /* Headers too large for the one frame that carries the properties. */
    {
        size_t value_len = 200000;
        char *headers = malloc(value_len + 16);

        assert_non_null(headers);
        memcpy(headers, "{\"big\":\"", 8);
        memset(headers + 8, 'h', value_len);
        memcpy(headers + 8 + value_len, "\"}", 3);
        messages[3].headers = headers;
        assert_int_equal(sink_publish(s, &messages[3], 1, outcomes, &err), 0);
        assert_int_equal(outcomes[0].status, SINK_REJECTED);
        assert_reason_contains(&outcomes[0], "do not fit in an amqp frame");
        assert_true(sink_is_connected(s));
        messages[3].headers = "{}";
        free(headers);
    }

    /* A payload right at the limit goes through (and through several frames). */
    messages[1].payload_len = BROKER_MAX_MESSAGE_BYTES;
    big[BROKER_MAX_MESSAGE_BYTES - 1] = '"';
    assert_int_equal(sink_publish(s, &messages[1], 1, outcomes, &err), 0);
    if (outcomes[0].status != SINK_ACCEPTED)
        fail_msg("payload at the limit: '%s'", outcomes[0].reason);

    sink_free(s);
    must(c, queue_consumer_delete_queue(c, queue));
    queue_consumer_free(c);
    free(big);
}

/*
 * A message over the broker's max_message_size, which the sink was not told
 * about: RabbitMQ closes the channel. Only that message fails, rejected with
 * the broker's text; the channel is reopened and every other message of the
 * batch is published in the same call. The sink keeps the limit it learned
 * and refuses the next oversized message before publishing it.
 */
static void
test_broker_size_limit_fails_only_that_message(void **state)
{
    enum { COUNT = 101, BIG = 40 };
    char queue[128];
    struct sink_options options = default_options(broker_url);
    struct sink_message messages[COUNT];
    struct sink_outcome outcomes[COUNT];
    struct outbox_error err = {0};
    size_t big_len = 2 * BROKER_MAX_MESSAGE_BYTES;
    char *big;
    uint32_t count = 0;
    queue_consumer *c;
    sink *s;

    (void)state;
    NEED_BROKER();
    big = malloc(big_len);
    assert_non_null(big);
    memset(big, 'x', big_len);
    big[0] = '"';
    big[big_len - 1] = '"';
    test_name(queue, sizeof(queue), "broker-limit");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    s = connected_sink(&options);

    for (int i = 0; i < COUNT; i++)
        messages[i] = simple_message(5000 + i, queue);
    messages[BIG].payload = big;
    messages[BIG].payload_len = big_len;
    assert_int_equal(sink_publish(s, messages, COUNT, outcomes, &err), 0);
    for (int i = 0; i < COUNT; i++)
        if (i != BIG && outcomes[i].status != SINK_ACCEPTED)
            fail_msg("innocent message %d: status %d '%s'", i, outcomes[i].status,
                     outcomes[i].reason);
    assert_int_equal(outcomes[BIG].status, SINK_REJECTED);
    assert_reason_contains(&outcomes[BIG], "PRECONDITION_FAILED - message size 2097152 is larger"
                                           " than configured max size 1048576");
    assert_true(sink_is_connected(s));
    must(c, queue_consumer_count(c, queue, &count));
    assert_true(count >= COUNT - 1);

    /* learned: refused before publishing, the others go through */
    assert_int_equal(sink_publish(s, &messages[BIG - 1], 3, outcomes, &err), 0);
    assert_int_equal(outcomes[0].status, SINK_ACCEPTED);
    assert_int_equal(outcomes[1].status, SINK_REJECTED);
    assert_reason_contains(&outcomes[1], "exceeds the broker's limit of 1048576 bytes");
    assert_int_equal(outcomes[2].status, SINK_ACCEPTED);

    sink_free(s);
    must(c, queue_consumer_delete_queue(c, queue));
    queue_consumer_free(c);
    free(big);
}

/* broker_url with the password replaced; the caller frees it. */
static char *
url_with_password(const char *password, const char *vhost)
{
    const char *scheme_end = strstr(broker_url, "://");
    const char *at = strrchr(broker_url, '@');
    const char *host = at != NULL ? at + 1 : scheme_end + 3;
    const char *slash = strchr(host, '/');
    int host_len = slash != NULL ? (int)(slash - host) : (int)strlen(host);
    char *url = malloc(512);

    assert_non_null(url);
    snprintf(url, 512, "amqp://guest:%s@%.*s/%s", password, host_len, host, vhost);
    return url;
}

static void
test_wrong_password_is_config_error_without_password(void **state)
{
    char *url;
    struct sink_options options;
    struct outbox_error err = {0};
    sink *s;

    (void)state;
    NEED_BROKER();
    url = url_with_password("not-the-Secret-42", "");
    options = default_options(url);
    s = sink_new(&options, &err);
    assert_non_null(s);
    assert_int_equal(sink_connect(s, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_false(sink_is_connected(s));
    assert_null(strstr(err.message, "not-the-Secret-42"));
    if (strstr(err.message, "ACCESS_REFUSED") == NULL || strstr(err.message, "'guest'") == NULL)
        fail_msg("unexpected message '%s'", err.message);
    sink_free(s);
    free(url);

    /* A vhost that does not exist is a configuration error too. */
    url = url_with_password("guest", "no-such-vhost");
    options = default_options(url);
    s = sink_new(&options, &err);
    assert_non_null(s);
    assert_int_equal(sink_connect(s, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "no-such-vhost"));
    sink_free(s);
    free(url);
}

static void
test_refused_port_is_connection_error(void **state)
{
    char url[128];
    struct sink_options options;
    struct sink_message message = simple_message(1, "q");
    struct sink_outcome outcome;
    struct outbox_error err = {0};
    sink *s;

    (void)state;
    snprintf(url, sizeof(url), "amqp://guest:guest@127.0.0.1:%d/", harness_closed_port());
    options = default_options(url);
    s = sink_new(&options, &err);
    assert_non_null(s);
    assert_int_equal(sink_connect(s, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONNECTION);
    assert_true(outbox_error_is_transient(&err));
    assert_null(strstr(err.message, ":guest@"));
    assert_false(sink_is_connected(s));
    assert_int_equal(sink_publish(s, &message, 1, &outcome, &err), -1);
    assert_int_equal(outcome.status, SINK_DEFERRED); /* not the message's fault: no attempt spent */
    sink_free(s);
}

/* Runs tests/harness/stack.sh ACTION DIR rabbitmq; true when it exits 0. */
static bool
stack(const char *action, const char *dir)
{
    const char *source_dir = getenv("OUTBOX_SOURCE_DIR");
    char command[1024];

    snprintf(command, sizeof(command), "'%s/tests/harness/stack.sh' %s '%s' rabbitmq >/dev/null 2>&1",
             source_dir != NULL ? source_dir : ".", action, dir);
    return system(command) == 0;
}

static void
test_broker_restart(void **state)
{
    enum { COUNT = 50 };
    const char *stack_dir = getenv("OUTBOX_TEST_STACK_DIR");
    char queue[128];
    struct sink_options options = default_options(broker_url);
    struct sink_message messages[COUNT];
    struct sink_outcome outcomes[COUNT];
    struct outbox_error err = {0};
    uint32_t count = 0;
    queue_consumer *c;
    sink *s, *idle_sink;
    int rc = -1;

    (void)state;
    NEED_BROKER();
    char script[512];

    snprintf(script, sizeof(script), "%s/tests/harness/stack.sh",
             getenv("OUTBOX_SOURCE_DIR") != NULL ? getenv("OUTBOX_SOURCE_DIR") : ".");
    if (stack_dir == NULL || access(script, X_OK) != 0) {
        print_message("OUTBOX_TEST_STACK_DIR or tests/harness/stack.sh missing: skipping\n");
        skip();
    }
    test_name(queue, sizeof(queue), "restart");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    queue_consumer_free(c);
    s = connected_sink(&options);
    idle_sink = connected_sink(&options);
    for (int i = 0; i < COUNT; i++)
        messages[i] = simple_message(3000 + i, queue);

    assert_true(stack("stop-service", stack_dir));
    /* An idle sink notices the broker went away (bounded wait). */
    for (int attempt = 0; attempt < 50 && sink_idle(idle_sink, &err) == 0; attempt++) {
        struct timespec pause = {.tv_nsec = 100 * 1000000};

        nanosleep(&pause, NULL);
    }
    assert_false(sink_is_connected(idle_sink));
    assert_int_equal(err.code, OUTBOX_ERR_CONNECTION);
    sink_free(idle_sink);
    assert_int_equal(sink_publish(s, messages, COUNT, outcomes, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONNECTION);
    for (int i = 0; i < COUNT; i++)
        assert_int_equal(outcomes[i].status, SINK_DEFERRED);
    assert_false(sink_is_connected(s));

    assert_true(stack("start-service", stack_dir));
    /* The broker may take a moment to accept logins again: bounded retries. */
    for (int attempt = 0; attempt < 60 && rc != 0; attempt++) {
        struct timespec pause = {.tv_nsec = 500 * 1000000};

        rc = sink_connect(s, &err);
        if (rc != 0)
            nanosleep(&pause, NULL);
    }
    if (rc != 0)
        fail_msg("reconnect after restart: %s", err.message);
    assert_int_equal(sink_publish(s, messages, COUNT, outcomes, &err), 0);
    for (int i = 0; i < COUNT; i++)
        if (outcomes[i].status != SINK_ACCEPTED)
            fail_msg("message %d after restart: '%s'", i, outcomes[i].reason);

    c = connected_consumer();
    must(c, queue_consumer_count(c, queue, &count));
    assert_true(count >= COUNT);
    must(c, queue_consumer_delete_queue(c, queue));
    queue_consumer_free(c);
    sink_free(s);
}

static double
seconds_now(void)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/*
 * 20 000 messages of about 200 bytes to a durable queue, in relay-sized
 * batches of 500; prints the rate for information, asserts only delivery.
 */
static void
test_publish_rate_20000(void **state)
{
    enum { COUNT = 20000, BATCH = 500 };
    char queue[128];
    char payload[201];
    struct sink_options options = default_options(broker_url);
    struct sink_message *messages;
    struct sink_outcome *outcomes;
    struct outbox_error err = {0};
    uint32_t count = 0;
    double started, elapsed;
    queue_consumer *c;
    sink *s;

    (void)state;
    NEED_BROKER();
    messages = calloc(COUNT, sizeof(*messages));
    outcomes = calloc(COUNT, sizeof(*outcomes));
    assert_non_null(messages);
    assert_non_null(outcomes);
    memset(payload, 'p', sizeof(payload) - 1);
    payload[0] = '"';
    payload[sizeof(payload) - 2] = '"';
    payload[sizeof(payload) - 1] = '\0';
    test_name(queue, sizeof(queue), "rate");
    c = connected_consumer();
    must(c, queue_consumer_declare_queue(c, queue));
    s = connected_sink(&options);
    for (int i = 0; i < COUNT; i++) {
        messages[i] = simple_message(200000 + i, queue);
        messages[i].payload = payload;
        messages[i].payload_len = sizeof(payload) - 1;
        messages[i].headers = "{\"trace-id\":\"0123456789abcdef\"}";
    }

    started = seconds_now();
    for (int first = 0; first < COUNT; first += BATCH) {
        assert_int_equal(sink_publish(s, messages + first, BATCH, outcomes + first, &err), 0);
    }
    elapsed = seconds_now() - started;
    for (int i = 0; i < COUNT; i++)
        if (outcomes[i].status != SINK_ACCEPTED)
            fail_msg("message %d: '%s'", i, outcomes[i].reason);
    must(c, queue_consumer_count(c, queue, &count));
    assert_int_equal(count, COUNT);
    print_message("publish with confirms: %d messages of %zu bytes in batches of %d: %.0f msg/s\n",
                  COUNT, sizeof(payload) - 1, BATCH, COUNT / elapsed);

    must(c, queue_consumer_purge(c, queue));
    started = seconds_now();
    assert_int_equal(sink_publish(s, messages, COUNT, outcomes, &err), 0);
    elapsed = seconds_now() - started;
    for (int i = 0; i < COUNT; i++)
        assert_int_equal(outcomes[i].status, SINK_ACCEPTED);
    print_message("publish with confirms: %d messages in one batch: %.0f msg/s\n", COUNT,
                  COUNT / elapsed);

    sink_free(s);
    must(c, queue_consumer_delete_queue(c, queue));
    queue_consumer_free(c);
    free(messages);
    free(outcomes);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contract_properties_arrive),
        cmocka_unit_test(test_batch_of_2000_all_arrive),
        cmocka_unit_test(test_unroutable_fails_only_that_message),
        cmocka_unit_test(test_missing_exchange_fails_batch_then_recovers),
        cmocka_unit_test(test_oversized_and_bad_headers_rejected_locally),
        cmocka_unit_test(test_broker_size_limit_fails_only_that_message),
        cmocka_unit_test(test_wrong_password_is_config_error_without_password),
        cmocka_unit_test(test_refused_port_is_connection_error),
        cmocka_unit_test(test_publish_rate_20000),
        cmocka_unit_test(test_broker_restart),
    };

    broker_url = getenv("OUTBOX_TEST_AMQP_URL");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
