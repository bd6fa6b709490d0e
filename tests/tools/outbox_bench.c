/*
 * outbox_bench - the measurements behind tests/bench/run.sh that need C.
 *
 *   outbox_bench claim-ceiling --database-url URL [--threads 2] [--batch 500]
 *                              [--on-success mark|delete]
 *       claims and completes ready rows with the store library until none is
 *       left (threads each with their own store); prints rows, seconds, rate
 *   outbox_bench claim-latency --database-url URL [--batch 500] [--repeat 7]
 *       times single claims of --batch rows (each completed afterwards, not
 *       timed); prints the median and every sample in milliseconds
 *   outbox_bench amqp-confirm --broker URL [--count N] [--window 1000]
 *                             [--payload-bytes 200]
 *       publishes persistent messages with publisher confirms to a fresh
 *       durable queue, at most --window unconfirmed; prints the rate, then
 *       deletes the queue
 *   outbox_bench redis-xadd --broker URL [--count N] [--window 4096]
 *                           [--payload-bytes 200]
 *       pipelined XADD with the relay's fields to a fresh stream; prints the
 *       rate, then deletes the stream
 *   outbox_bench amqp-count --broker URL --queue Q [--purge yes]
 *       prints the message count of queue Q (passive queue.declare), then
 *       with --purge yes empties the queue
 *   outbox_bench stream-times --broker URL --stream S
 *       prints "job_id receive_epoch_ms" for every entry of stream S, the
 *       receive time being the millisecond part of the entry id Redis chose
 *
 * Output lines are "key=value" pairs for the script to read. A measuring
 * tool, not a test: it asserts nothing about speed. Exit status 0 on
 * success, 1 on a runtime error, 2 on a usage error.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <hiredis/hiredis.h>

#include "outbox.h"
#include "sink.h"
#include "url.h"
#include "sink_amqp.h"
#include "sink_redis.h"

struct options {
    const char *database_url;
    const char *broker;
    const char *queue;
    const char *stream;
    long count;
    int threads;
    int batch;
    int repeat;
    int window;
    int payload_bytes;
    bool purge;
    bool delete_on_success;
};

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A JSON payload of about bytes bytes (at least the fixed part); caller frees. */
static char *
make_payload(int bytes, long id)
{
    char *payload = malloc((size_t)bytes + 128);
    int n;

    if (payload == NULL)
        return NULL;
    n = snprintf(payload, 128, "{\"order_id\": %ld, \"event\": \"order.created\", \"pad\": \"", id);
    if (bytes > n + 2) {
        memset(payload + n, 'x', (size_t)(bytes - n - 2));
        n = bytes - 2;
    }
    snprintf(payload + n, 8, "\"}");
    return payload;
}

/* ---- claim ceiling --------------------------------------------------------- */

struct claim_worker {
    const struct options *options;
    int index;
    long rows;
    int failed;
};

static void *
claim_worker_run(void *arg)
{
    struct claim_worker *w = arg;
    struct outbox_error err;
    char worker_id[64];
    outbox_store *store;
    struct outbox_lease *leases = calloc((size_t)w->options->batch, sizeof(*leases));
    bool *done = calloc((size_t)w->options->batch, sizeof(*done));

    snprintf(worker_id, sizeof(worker_id), "bench-%d-%d", (int)getpid(), w->index);
    store = outbox_store_connect(w->options->database_url, worker_id, &err);
    if (store == NULL || leases == NULL || done == NULL) {
        fprintf(stderr, "outbox_bench: %s\n", store == NULL ? err.message : "out of memory");
        w->failed = 1;
        goto out;
    }
    outbox_store_set_delete_on_success(store, w->options->delete_on_success);
    for (;;) {
        struct outbox_batch batch = {0};
        size_t changed = 0;

        if (outbox_claim(store, NULL, 0, w->options->batch, 60, &batch, &err) != 0) {
            fprintf(stderr, "outbox_bench: %s\n", err.message);
            w->failed = 1;
            break;
        }
        if (batch.count == 0) {
            outbox_batch_release_memory(&batch);
            break;
        }
        for (size_t i = 0; i < batch.count; i++)
            leases[i] = (struct outbox_lease){batch.jobs[i].job_id, batch.jobs[i].generation};
        if (outbox_complete(store, leases, batch.count, done, &changed, &err) != 0) {
            fprintf(stderr, "outbox_bench: %s\n", err.message);
            w->failed = 1;
            outbox_batch_release_memory(&batch);
            break;
        }
        w->rows += (long)changed;
        outbox_batch_release_memory(&batch);
    }
out:
    outbox_store_free(store);
    free(leases);
    free(done);
    return NULL;
}

static int
claim_ceiling(const struct options *o)
{
    struct claim_worker *workers = calloc((size_t)o->threads, sizeof(*workers));
    pthread_t *threads = calloc((size_t)o->threads, sizeof(*threads));
    long rows = 0;
    int failed = 0;
    double start, seconds;

    if (workers == NULL || threads == NULL) {
        free(workers);
        free(threads);
        return 1;
    }
    start = now_seconds();
    for (int i = 0; i < o->threads; i++) {
        workers[i] = (struct claim_worker){.options = o, .index = i};
        pthread_create(&threads[i], NULL, claim_worker_run, &workers[i]);
    }
    for (int i = 0; i < o->threads; i++) {
        pthread_join(threads[i], NULL);
        rows += workers[i].rows;
        failed |= workers[i].failed;
    }
    seconds = now_seconds() - start;
    printf("rows=%ld seconds=%.3f rate=%.0f\n", rows, seconds, (double)rows / seconds);
    free(workers);
    free(threads);
    return failed ? 1 : 0;
}

/* ---- claim latency ----------------------------------------------------------- */

static int
compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static int
claim_latency(const struct options *o)
{
    struct outbox_error err;
    outbox_store *store = outbox_store_connect(o->database_url, "bench-latency", &err);
    double *samples = calloc((size_t)o->repeat, sizeof(*samples));
    struct outbox_lease *leases = calloc((size_t)o->batch, sizeof(*leases));
    bool *done = calloc((size_t)o->batch, sizeof(*done));
    size_t claimed = 0;
    int rc = 1;

    if (store == NULL || samples == NULL || leases == NULL || done == NULL) {
        fprintf(stderr, "outbox_bench: %s\n", store == NULL ? err.message : "out of memory");
        goto out;
    }
    for (int r = 0; r < o->repeat; r++) {
        struct outbox_batch batch = {0};
        double start = now_seconds();

        if (outbox_claim(store, NULL, 0, o->batch, 60, &batch, &err) != 0) {
            fprintf(stderr, "outbox_bench: %s\n", err.message);
            goto out;
        }
        samples[r] = (now_seconds() - start) * 1000.0;
        claimed = batch.count;
        for (size_t i = 0; i < batch.count; i++)
            leases[i] = (struct outbox_lease){batch.jobs[i].job_id, batch.jobs[i].generation};
        if (outbox_complete(store, leases, batch.count, done, NULL, &err) != 0) {
            fprintf(stderr, "outbox_bench: %s\n", err.message);
            outbox_batch_release_memory(&batch);
            goto out;
        }
        outbox_batch_release_memory(&batch);
    }
    printf("claimed=%zu samples_ms=", claimed);
    for (int r = 0; r < o->repeat; r++)
        printf("%s%.2f", r ? "," : "", samples[r]);
    qsort(samples, (size_t)o->repeat, sizeof(*samples), compare_doubles);
    printf(" median_ms=%.2f\n", samples[o->repeat / 2]);
    rc = 0;
out:
    outbox_store_free(store);
    free(samples);
    free(leases);
    free(done);
    return rc;
}

/* ---- RabbitMQ ------------------------------------------------------------------ */

static bool
amqp_reply_ok(amqp_rpc_reply_t reply, const char *what)
{
    if (reply.reply_type == AMQP_RESPONSE_NORMAL)
        return true;
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *close = reply.reply.decoded;

        fprintf(stderr, "outbox_bench: %s: %.*s\n", what, (int)close->reply_text.len,
                (const char *)close->reply_text.bytes);
    } else if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
        fprintf(stderr, "outbox_bench: %s: %s\n", what, amqp_error_string2(reply.library_error));
    } else {
        fprintf(stderr, "outbox_bench: %s failed\n", what);
    }
    return false;
}

/* A logged-in connection with channel 1 open, or NULL. */
static amqp_connection_state_t
amqp_open(const char *broker)
{
    struct broker_url url;
    struct outbox_error err;
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    bool ok = false;

    if (sink_url_parse(broker, &url, &err) != 0) {
        fprintf(stderr, "outbox_bench: %s\n", err.message);
        amqp_destroy_connection(conn);
        return NULL;
    }
    if (socket == NULL || amqp_socket_open(socket, url.host, url.port) != AMQP_STATUS_OK) {
        fprintf(stderr, "outbox_bench: cannot reach %s:%d\n", url.host, url.port);
        goto out;
    }
    if (!amqp_reply_ok(amqp_login(conn, sink_amqp_url_vhost(&url), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                                  url.user, url.password),
                       "login"))
        goto out;
    amqp_channel_open(conn, 1);
    ok = amqp_reply_ok(amqp_get_rpc_reply(conn), "channel.open");
out:
    url_clear(&url);
    if (!ok) {
        amqp_destroy_connection(conn);
        return NULL;
    }
    return conn;
}

static void
amqp_close(amqp_connection_state_t conn)
{
    if (conn == NULL)
        return;
    amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
}

/*
 * Waits for one frame and settles confirms: every ack (or nack) up to its
 * delivery tag. Returns -1 on an error, a nack or a returned message.
 */
static int
amqp_settle(amqp_connection_state_t conn, uint64_t *confirmed, long *nacked)
{
    amqp_frame_t frame;
    int status = amqp_simple_wait_frame(conn, &frame);

    if (status != AMQP_STATUS_OK) {
        fprintf(stderr, "outbox_bench: waiting for confirms: %s\n", amqp_error_string2(status));
        return -1;
    }
    if (frame.frame_type != AMQP_FRAME_METHOD)
        return 0;
    if (frame.payload.method.id == AMQP_BASIC_ACK_METHOD) {
        amqp_basic_ack_t *ack = frame.payload.method.decoded;

        /* a multiple ack confirms every tag up to its own; tags count from 1 */
        *confirmed = ack->multiple ? ack->delivery_tag : *confirmed + 1;
        return 0;
    }
    if (frame.payload.method.id == AMQP_BASIC_NACK_METHOD) {
        (*nacked)++;
        return -1;
    }
    fprintf(stderr, "outbox_bench: unexpected method 0x%08x while publishing\n",
            (unsigned)frame.payload.method.id);
    return -1;
}

static int
amqp_confirm(const struct options *o)
{
    amqp_connection_state_t conn = amqp_open(o->broker);
    char queue_name[64];
    amqp_bytes_t queue;
    char *payload = make_payload(o->payload_bytes, 1);
    amqp_basic_properties_t props = {0};
    uint64_t published = 0, confirmed = 0;
    long nacked = 0;
    double start, seconds;
    int rc = 1;

    if (conn == NULL || payload == NULL)
        goto out;
    snprintf(queue_name, sizeof(queue_name), "outbox-bench-confirm-%d", (int)getpid());
    queue = amqp_cstring_bytes(queue_name);
    amqp_queue_declare(conn, 1, queue, 0, 1, 0, 0, amqp_empty_table);
    if (!amqp_reply_ok(amqp_get_rpc_reply(conn), "queue.declare"))
        goto out;
    amqp_confirm_select(conn, 1);
    if (!amqp_reply_ok(amqp_get_rpc_reply(conn), "confirm.select"))
        goto out;
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG;
    props.delivery_mode = 2;
    props.content_type = amqp_cstring_bytes("application/json");

    start = now_seconds();
    while (published < (uint64_t)o->count) {
        char id[32];

        snprintf(id, sizeof(id), "%" PRIu64, published + 1);
        props.message_id = amqp_cstring_bytes(id);
        if (amqp_basic_publish(conn, 1, amqp_empty_bytes, queue, 1, 0, &props,
                               amqp_cstring_bytes(payload)) != AMQP_STATUS_OK) {
            fprintf(stderr, "outbox_bench: basic.publish failed\n");
            goto out;
        }
        published++;
        while (published - confirmed >= (uint64_t)o->window)
            if (amqp_settle(conn, &confirmed, &nacked) != 0)
                goto out;
    }
    while (confirmed < published)
        if (amqp_settle(conn, &confirmed, &nacked) != 0)
            goto out;
    seconds = now_seconds() - start;
    printf("messages=%" PRIu64 " seconds=%.3f rate=%.0f\n", published, seconds,
           (double)published / seconds);
    amqp_queue_delete(conn, 1, queue, 0, 0);
    rc = amqp_reply_ok(amqp_get_rpc_reply(conn), "queue.delete") ? 0 : 1;
out:
    if (nacked > 0)
        fprintf(stderr, "outbox_bench: the broker nacked %ld messages\n", nacked);
    amqp_close(conn);
    free(payload);
    return rc;
}

static int
amqp_count(const struct options *o)
{
    amqp_connection_state_t conn = amqp_open(o->broker);
    amqp_queue_declare_ok_t *ok;
    int rc = 1;

    if (conn == NULL)
        return 1;
    ok = amqp_queue_declare(conn, 1, amqp_cstring_bytes(o->queue), 1, 0, 0, 0, amqp_empty_table);
    if (amqp_reply_ok(amqp_get_rpc_reply(conn), "passive queue.declare") && ok != NULL) {
        printf("messages=%u consumers=%u\n", ok->message_count, ok->consumer_count);
        rc = 0;
    }
    if (rc == 0 && o->purge) {
        amqp_queue_purge(conn, 1, amqp_cstring_bytes(o->queue));
        rc = amqp_reply_ok(amqp_get_rpc_reply(conn), "queue.purge") ? 0 : 1;
    }
    amqp_close(conn);
    return rc;
}

/* ---- Redis ---------------------------------------------------------------------- */

/* A connected, authenticated context for broker, or NULL. */
static redisContext *
redis_open(const char *broker)
{
    struct broker_url url;
    struct outbox_error err;
    redisContext *context;
    redisReply *reply;
    bool ok = true;

    if (sink_url_parse(broker, &url, &err) != 0) {
        fprintf(stderr, "outbox_bench: %s\n", err.message);
        return NULL;
    }
    context = redisConnect(url.host, url.port);
    if (context == NULL || context->err != 0) {
        fprintf(stderr, "outbox_bench: cannot reach %s:%d\n", url.host, url.port);
        ok = false;
    }
    if (ok && url.password != NULL) {
        reply = url.user != NULL ? redisCommand(context, "AUTH %s %s", url.user, url.password)
                                 : redisCommand(context, "AUTH %s", url.password);
        ok = reply != NULL && reply->type != REDIS_REPLY_ERROR;
        if (!ok)
            fprintf(stderr, "outbox_bench: redis authentication failed\n");
        freeReplyObject(reply);
    }
    if (ok && sink_redis_url_db(&url) != 0) {
        reply = redisCommand(context, "SELECT %d", sink_redis_url_db(&url));
        ok = reply != NULL && reply->type != REDIS_REPLY_ERROR;
        freeReplyObject(reply);
    }
    url_clear(&url);
    if (!ok && context != NULL) {
        redisFree(context);
        context = NULL;
    }
    return context;
}

/* Reads one pipelined reply; -1 on an error or an error reply. */
static int
redis_read_reply(redisContext *context)
{
    void *reply = NULL;
    int rc = 0;

    if (redisGetReply(context, &reply) != REDIS_OK) {
        fprintf(stderr, "outbox_bench: redis: %s\n", context->errstr);
        return -1;
    }
    if (((redisReply *)reply)->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "outbox_bench: redis: %s\n", ((redisReply *)reply)->str);
        rc = -1;
    }
    freeReplyObject(reply);
    return rc;
}

static int
redis_xadd(const struct options *o)
{
    redisContext *context = redis_open(o->broker);
    char stream[64];
    char *payload = make_payload(o->payload_bytes, 1);
    long sent = 0, received = 0;
    double start, seconds;
    int rc = 1;

    if (context == NULL || payload == NULL)
        goto out;
    snprintf(stream, sizeof(stream), "outbox-bench-xadd:%d", (int)getpid());
    start = now_seconds();
    while (sent < o->count) {
        char id[32];

        snprintf(id, sizeof(id), "%ld", sent + 1);
        redisAppendCommand(context, "XADD %s * job_id %s queue bench payload %s headers {} attempt 1",
                           stream, id, payload);
        sent++;
        while (sent - received >= o->window) {
            if (redis_read_reply(context) != 0)
                goto out;
            received++;
        }
    }
    while (received < sent) {
        if (redis_read_reply(context) != 0)
            goto out;
        received++;
    }
    seconds = now_seconds() - start;
    printf("messages=%ld seconds=%.3f rate=%.0f\n", sent, seconds, (double)sent / seconds);
    freeReplyObject(redisCommand(context, "DEL %s", stream));
    rc = 0;
out:
    if (context != NULL)
        redisFree(context);
    free(payload);
    return rc;
}

/* The value of field name in a flat [field, value, ...] reply, or NULL. */
static const char *
field_value(const redisReply *fields, const char *name)
{
    for (size_t i = 0; i + 1 < fields->elements; i += 2)
        if (fields->element[i]->type == REDIS_REPLY_STRING &&
            strcmp(fields->element[i]->str, name) == 0 &&
            fields->element[i + 1]->type == REDIS_REPLY_STRING)
            return fields->element[i + 1]->str;
    return NULL;
}

static int
stream_times(const struct options *o)
{
    redisContext *context = redis_open(o->broker);
    char from[64] = "-";
    long entries = 0;
    int rc = 1;

    if (context == NULL)
        return 1;
    for (;;) {
        redisReply *reply = redisCommand(context, "XRANGE %s %s + COUNT 5000", o->stream, from);
        size_t n;

        if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) {
            fprintf(stderr, "outbox_bench: XRANGE failed\n");
            freeReplyObject(reply);
            goto out;
        }
        n = reply->elements;
        for (size_t i = 0; i < n; i++) {
            const redisReply *entry = reply->element[i];
            const char *job_id;

            if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2)
                continue;
            job_id = field_value(entry->element[1], "job_id");
            if (job_id != NULL)
                printf("%s %lld\n", job_id, strtoll(entry->element[0]->str, NULL, 10));
            entries++;
            if (i + 1 == n)
                snprintf(from, sizeof(from), "(%s", entry->element[0]->str);
        }
        freeReplyObject(reply);
        if (n < 5000)
            break;
    }
    fprintf(stderr, "outbox_bench: %ld entries in %s\n", entries, o->stream);
    rc = 0;
out:
    redisFree(context);
    return rc;
}

/* ---- main ------------------------------------------------------------------------- */

static void
usage(void)
{
    fputs("usage: outbox_bench claim-ceiling|claim-latency --database-url URL [--threads N]\n"
          "                    [--batch N] [--repeat N] [--on-success mark|delete]\n"
          "       outbox_bench amqp-confirm|redis-xadd --broker URL [--count N] [--window N]\n"
          "                    [--payload-bytes N]\n"
          "       outbox_bench amqp-count --broker URL --queue Q [--purge yes]\n"
          "       outbox_bench stream-times --broker URL --stream S\n",
          stderr);
    exit(2);
}

int
main(int argc, char **argv)
{
    struct options o = {.count = 100000,
                        .threads = 2,
                        .batch = 500,
                        .repeat = 7,
                        .window = 0,
                        .payload_bytes = 200};
    const char *command;

    if (argc < 2)
        usage();
    command = argv[1];
    for (int i = 2; i < argc; i += 2) {
        const char *name = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;

        if (value == NULL)
            usage();
        if (strcmp(name, "--database-url") == 0)
            o.database_url = value;
        else if (strcmp(name, "--broker") == 0)
            o.broker = value;
        else if (strcmp(name, "--queue") == 0)
            o.queue = value;
        else if (strcmp(name, "--stream") == 0)
            o.stream = value;
        else if (strcmp(name, "--count") == 0)
            o.count = atol(value);
        else if (strcmp(name, "--threads") == 0)
            o.threads = atoi(value);
        else if (strcmp(name, "--batch") == 0)
            o.batch = atoi(value);
        else if (strcmp(name, "--repeat") == 0)
            o.repeat = atoi(value);
        else if (strcmp(name, "--window") == 0)
            o.window = atoi(value);
        else if (strcmp(name, "--payload-bytes") == 0)
            o.payload_bytes = atoi(value);
        else if (strcmp(name, "--purge") == 0 && strcmp(value, "yes") == 0)
            o.purge = true;
        else if (strcmp(name, "--on-success") == 0 && strcmp(value, "mark") == 0)
            o.delete_on_success = false;
        else if (strcmp(name, "--on-success") == 0 && strcmp(value, "delete") == 0)
            o.delete_on_success = true;
        else
            usage();
    }
    if (o.threads < 1 || o.batch < 1 || o.repeat < 1 || o.count < 0 || o.window < 0 ||
        o.payload_bytes < 0 || o.payload_bytes > 1000000)
        usage();
    if (strcmp(command, "claim-ceiling") == 0 && o.database_url != NULL)
        return claim_ceiling(&o);
    if (strcmp(command, "claim-latency") == 0 && o.database_url != NULL)
        return claim_latency(&o);
    if (strcmp(command, "amqp-confirm") == 0 && o.broker != NULL) {
        if (o.window == 0)
            o.window = 1000;
        return amqp_confirm(&o);
    }
    if (strcmp(command, "redis-xadd") == 0 && o.broker != NULL) {
        if (o.window == 0)
            o.window = 4096;
        return redis_xadd(&o);
    }
    if (strcmp(command, "amqp-count") == 0 && o.broker != NULL && o.queue != NULL)
        return amqp_count(&o);
    if (strcmp(command, "stream-times") == 0 && o.broker != NULL && o.stream != NULL)
        return stream_times(&o);
    usage();
}
