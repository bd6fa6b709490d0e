/*
 * sink_amqp_throughput.c - msgs/s of the RabbitMQ sink alone, as the relay's
 * pipelines drive it but without a database.
 *
 *   sink_amqp_throughput [URL [COUNT [THREADS [BATCH [PAYLOAD_BYTES]]]]]
 *
 * URL defaults to $OUTBOX_TEST_AMQP_URL. Declares a durable queue
 * outbox-throughput-<pid>, then THREADS threads (default 2, the relay's
 * --concurrency), each with its own sink, publish COUNT messages (default
 * 100000) in all through sink_publish() in batches of BATCH (default 500,
 * the relay's --batch-size), each batch waiting for its confirms as the
 * relay does. Prints the rate and deletes the queue. Compared with
 * outbox_bench amqp-confirm, it shows what the relay's publishing pattern
 * costs before PostgreSQL shares the machine. A measuring tool, not a test.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include "sink.h"
#include "url.h"

#define MAX_THREADS 16

struct publisher {
    const char *url;
    const char *queue;
    int64_t first_job_id;
    size_t count;
    size_t batch;
    const char *payload;
    size_t payload_len;
    size_t accepted;
    pthread_t thread;
};

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Declares (declare) or deletes the durable queue on a connection of its own. */
static int
manage_queue(const char *url, const char *queue, bool declare)
{
    struct broker_url parsed;
    struct outbox_error err;
    amqp_connection_state_t conn;
    amqp_socket_t *socket;
    amqp_rpc_reply_t reply;
    int rc = -1;

    if (url_parse(url, &parsed, &err) != 0) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    conn = amqp_new_connection();
    socket = amqp_tcp_socket_new(conn);
    if (socket != NULL && amqp_socket_open(socket, parsed.host, parsed.port) == AMQP_STATUS_OK &&
        amqp_login(conn, parsed.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, parsed.user,
                   parsed.password)
                .reply_type == AMQP_RESPONSE_NORMAL) {
        amqp_channel_open(conn, 1);
        if (declare)
            amqp_queue_declare(conn, 1, amqp_cstring_bytes(queue), 0, 1, 0, 0, amqp_empty_table);
        else
            amqp_queue_delete(conn, 1, amqp_cstring_bytes(queue), 0, 0);
        reply = amqp_get_rpc_reply(conn);
        rc = reply.reply_type == AMQP_RESPONSE_NORMAL ? 0 : -1;
        amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
        amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    }
    if (rc != 0)
        fprintf(stderr, "unable to %s queue %s\n", declare ? "declare" : "delete", queue);
    amqp_destroy_connection(conn);
    url_clear(&parsed);
    return rc;
}

static void *
publisher_run(void *arg)
{
    struct publisher *p = arg;
    struct sink_options options = {.url = p->url, .exchange = ""};
    struct sink_message *messages = calloc(p->batch, sizeof(*messages));
    struct sink_outcome *outcomes = calloc(p->batch, sizeof(*outcomes));
    struct outbox_error err;
    sink *s = sink_new(&options, &err);

    if (s == NULL || messages == NULL || outcomes == NULL || sink_connect(s, &err) != 0) {
        fprintf(stderr, "sink: %s\n", s == NULL || messages == NULL ? "setup failed" : err.message);
        goto out;
    }
    for (size_t at = 0; at < p->count; at += p->batch) {
        size_t n = p->count - at < p->batch ? p->count - at : p->batch;

        for (size_t i = 0; i < n; i++)
            messages[i] = (struct sink_message){.job_id = p->first_job_id + (int64_t)(at + i),
                                                .attempt = 1,
                                                .queue = p->queue,
                                                .payload = p->payload,
                                                .payload_len = p->payload_len,
                                                .headers = "{}",
                                                .created_at = 1.7e9};
        if (sink_publish(s, messages, n, outcomes, &err) != 0) {
            fprintf(stderr, "sink: %s\n", err.message);
            goto out;
        }
        for (size_t i = 0; i < n; i++)
            p->accepted += outcomes[i].status == SINK_ACCEPTED;
    }
    sink_disconnect(s);
out:
    sink_free(s);
    free(messages);
    free(outcomes);
    return NULL;
}

int
main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : getenv("OUTBOX_TEST_AMQP_URL");
    size_t count = argc > 2 ? strtoul(argv[2], NULL, 10) : 100000;
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    size_t batch = argc > 4 ? strtoul(argv[4], NULL, 10) : 500;
    size_t payload_bytes = argc > 5 ? strtoul(argv[5], NULL, 10) : 200;
    struct publisher publishers[MAX_THREADS] = {{0}};
    char queue[64], *payload;
    size_t accepted = 0, assigned = 0;
    double started, seconds;

    if (url == NULL || count == 0 || threads < 1 || threads > MAX_THREADS || batch == 0 ||
        payload_bytes < 16) {
        fprintf(stderr, "usage: %s [URL [COUNT [THREADS (1-%d) [BATCH [PAYLOAD_BYTES]]]]]\n",
                argv[0], MAX_THREADS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(queue, sizeof(queue), "outbox-throughput-%ld", (long)getpid());
    payload = malloc(payload_bytes + 1);
    if (payload == NULL || manage_queue(url, queue, true) != 0) {
        free(payload);
        return 1;
    }
    memset(payload, 'x', payload_bytes);
    memcpy(payload, "{\"pad\":\"", 8);
    memcpy(payload + payload_bytes - 2, "\"}", 2);
    payload[payload_bytes] = '\0';

    started = now_seconds();
    for (int t = 0; t < threads; t++) {
        size_t share = count / threads + ((size_t)t < count % threads);

        publishers[t] = (struct publisher){.url = url,
                                           .queue = queue,
                                           .first_job_id = 1 + (int64_t)assigned,
                                           .count = share,
                                           .batch = batch,
                                           .payload = payload,
                                           .payload_len = payload_bytes};
        assigned += share;
        pthread_create(&publishers[t].thread, NULL, publisher_run, &publishers[t]);
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(publishers[t].thread, NULL);
        accepted += publishers[t].accepted;
    }
    seconds = now_seconds() - started;
    printf("messages=%zu accepted=%zu threads=%d batch=%zu seconds=%.3f rate=%.0f\n", count,
           accepted, threads, batch, seconds, (double)count / seconds);
    manage_queue(url, queue, false);
    free(payload);
    return accepted == count ? 0 : 1;
}
