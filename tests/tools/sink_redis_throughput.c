/*
 * sink_redis_throughput.c - appends/s of the Redis sink next to raw XADD.
 *
 *   sink_redis_throughput [URL [COUNT [PAYLOAD_BYTES [BATCH [WAIT [STREAMS]]]]]]
 *
 * URL defaults to $OUTBOX_TEST_REDIS_URL. Publishes COUNT messages (default
 * 100000) of about PAYLOAD_BYTES (200) through sink_publish() in batches of
 * BATCH (default COUNT: one pipelined call) with --redis-wait WAIT (default
 * 0), spread over STREAMS streams (default 1), then, for a redis:// URL, the
 * same number as raw pipelined XADD commands with the same fields on one
 * hiredis connection, and prints both rates. Uses streams named outbox-throughput:<pid>:* and
 * deletes them (and the dedup records) afterwards. A measuring tool, not a
 * test: it asserts nothing about speed.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "sink.h"
#include "sink_redis.h"
#include "url.h"

#define RAW_WINDOW 4096

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A connected, authenticated hiredis context for url, or NULL. */
static redisContext *
connect_raw(const char *url)
{
    struct broker_url parsed;
    struct outbox_error err;
    redisContext *context;
    redisReply *reply;

    if (sink_url_parse(url, &parsed, &err) != 0)
        return NULL;
    context = redisConnect(parsed.host, parsed.port);
    if (context != NULL && context->err == 0 && parsed.password != NULL) {
        reply = parsed.user != NULL
                    ? redisCommand(context, "AUTH %s %s", parsed.user, parsed.password)
                    : redisCommand(context, "AUTH %s", parsed.password);
        freeReplyObject(reply);
    }
    if (context != NULL && context->err == 0 && sink_redis_url_db(&parsed) != 0)
        freeReplyObject(redisCommand(context, "SELECT %d", sink_redis_url_db(&parsed)));
    url_clear(&parsed);
    if (context != NULL && context->err != 0) {
        redisFree(context);
        return NULL;
    }
    return context;
}

/* Deletes every key starting with prefix. */
static void
delete_prefix(redisContext *context, const char *prefix)
{
    char cursor[32] = "0";

    do {
        redisReply *reply = redisCommand(context, "SCAN %s MATCH %s* COUNT 10000", cursor, prefix);

        if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) {
            freeReplyObject(reply);
            return;
        }
        snprintf(cursor, sizeof(cursor), "%s", reply->element[0]->str);
        for (size_t i = 0; i < reply->element[1]->elements; i++)
            redisAppendCommand(context, "UNLINK %s", reply->element[1]->element[i]->str);
        for (size_t i = 0; i < reply->element[1]->elements; i++) {
            redisReply *unlinked = NULL;

            if (redisGetReply(context, (void **)&unlinked) != REDIS_OK)
                break;
            freeReplyObject(unlinked);
        }
        freeReplyObject(reply);
    } while (strcmp(cursor, "0") != 0);
}

int
main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : getenv("OUTBOX_TEST_REDIS_URL");
    size_t count = argc > 2 ? strtoul(argv[2], NULL, 10) : 100000;
    size_t payload_bytes = argc > 3 ? strtoul(argv[3], NULL, 10) : 200;
    size_t batch = argc > 4 ? strtoul(argv[4], NULL, 10) : 0;
    int wait_replicas = argc > 5 ? atoi(argv[5]) : 0;
    size_t streams = argc > 6 ? strtoul(argv[6], NULL, 10) : 1;
    char (*queues)[16] = NULL;
    bool raw_possible;
    struct sink_options options = {0};
    struct sink_redis_config redis = {.wait_replicas = SINK_REDIS_WAIT_BY_TOPOLOGY};
    struct sink_message *messages = NULL;
    struct sink_outcome *outcomes = NULL;
    struct outbox_error err;
    char prefix[64], stream[96], *payload = NULL;
    redisContext *raw = NULL;
    size_t accepted = 0, sent = 0, received = 0, raw_ok = 0;
    double started, sink_seconds, raw_seconds;
    int status = 1;
    sink *s = NULL;

    if (url == NULL || count == 0 || payload_bytes < 16 || streams == 0 || streams > 1000) {
        fprintf(stderr, "usage: %s [URL [COUNT [PAYLOAD_BYTES [BATCH [WAIT [STREAMS]]]]]]\n",
                argv[0]);
        return 2;
    }
    raw_possible = strncmp(url, "redis://", 8) == 0;
    if (batch == 0 || batch > count)
        batch = count;
    signal(SIGPIPE, SIG_IGN);
    snprintf(prefix, sizeof(prefix), "outbox-throughput:%ld:", (long)getpid());
    payload = malloc(payload_bytes + 1);
    messages = calloc(count, sizeof(*messages));
    outcomes = calloc(count, sizeof(*outcomes));
    queues = calloc(streams, sizeof(*queues));
    if (payload == NULL || messages == NULL || outcomes == NULL || queues == NULL)
        goto cleanup;
    for (size_t i = 0; i < streams; i++)
        snprintf(queues[i], sizeof(queues[i]), streams == 1 ? "bench" : "bench%zu", i);
    memset(payload, 'x', payload_bytes);
    memcpy(payload, "{\"pad\":\"", 8);
    memcpy(payload + payload_bytes - 2, "\"}", 2);
    payload[payload_bytes] = '\0';
    for (size_t i = 0; i < count; i++) {
        messages[i].job_id = (int64_t)i + 1;
        messages[i].history = "bench:1";
        snprintf(messages[i].message_id, sizeof(messages[i].message_id), "%zu", i + 1);
        snprintf(messages[i].dedup_id, sizeof(messages[i].dedup_id), "bench:1:%zu", i + 1);
        messages[i].attempt = 1;
        messages[i].queue = queues[i % streams];
        messages[i].payload = payload;
        messages[i].payload_len = payload_bytes;
        messages[i].headers = "{}";
    }

    options.url = url;
    redis.stream_prefix = prefix;
    redis.wait_replicas = wait_replicas;
    *sink_options_broker(&options, "redis") = &redis;
    s = sink_new(&options, &err);
    if (s == NULL || sink_connect(s, &err) != 0) {
        fprintf(stderr, "sink: %s\n", err.message);
        goto cleanup;
    }
    started = now_seconds();
    for (size_t at = 0; at < count; at += batch) {
        size_t n = count - at < batch ? count - at : batch;

        if (sink_publish(s, messages + at, n, outcomes + at, &err) != 0) {
            fprintf(stderr, "sink: %s\n", err.message);
            goto cleanup;
        }
    }
    sink_seconds = now_seconds() - started;
    for (size_t i = 0; i < count; i++)
        accepted += outcomes[i].status == SINK_ACCEPTED;

    if (!raw_possible) {
        printf("messages %zu, payload %zu bytes, sink batch %zu, wait %d, streams %zu\n", count,
               payload_bytes, batch, wait_replicas, streams);
        printf("sink (EVALSHA dedup + XADD, pipelined): %zu accepted in %.3f s = %.0f msg/s\n",
               accepted, sink_seconds, (double)count / sink_seconds);
        status = accepted == count ? 0 : 1;
        goto cleanup;
    }
    raw = connect_raw(url);
    if (raw == NULL) {
        fprintf(stderr, "raw: cannot connect\n");
        goto cleanup;
    }
    snprintf(stream, sizeof(stream), "%sraw", prefix);
    started = now_seconds();
    while (received < count) {
        redisReply *reply = NULL;

        while (sent < count && sent - received < RAW_WINDOW) {
            redisAppendCommand(
                raw, "XADD %s * job_id %" PRId64 " queue %s payload %b headers %s attempt %d",
                stream, messages[sent].job_id, "bench", payload, payload_bytes, "{}", 1);
            sent++;
        }
        if (redisGetReply(raw, (void **)&reply) != REDIS_OK) {
            fprintf(stderr, "raw: %s\n", raw->errstr);
            goto cleanup;
        }
        raw_ok += reply->type == REDIS_REPLY_STRING;
        freeReplyObject(reply);
        received++;
    }
    raw_seconds = now_seconds() - started;

    printf("messages %zu, payload %zu bytes, sink batch %zu, wait %d, streams %zu\n", count,
           payload_bytes, batch, wait_replicas, streams);
    printf("sink (EVALSHA dedup + XADD, pipelined): %zu accepted in %.3f s = %.0f msg/s\n",
           accepted, sink_seconds, (double)count / sink_seconds);
    printf("raw pipelined XADD:                     %zu appended in %.3f s = %.0f msg/s\n", raw_ok,
           raw_seconds, (double)count / raw_seconds);
    printf("ratio sink/raw: %.2f\n", raw_seconds / sink_seconds);
    status = accepted == count && raw_ok == count ? 0 : 1;

cleanup:
    if (raw == NULL && raw_possible)
        raw = connect_raw(url);
    if (raw != NULL) {
        delete_prefix(raw, prefix);
        redisFree(raw);
    }
    sink_free(s);
    free(payload);
    free(messages);
    free(queues);
    free(outcomes);
    return status;
}
