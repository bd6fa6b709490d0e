/*
 * sink_amqp_throughput.c - msgs/s of the RabbitMQ sink alone, as the relay's
 * pipelines drive it but without a database.
 *
 *   sink_amqp_throughput URL QUEUE [COUNT [THREADS [BATCH [PAYLOAD_BYTES]]]]
 *
 * THREADS threads (default 2, the relay's --concurrency), each with its own
 * sink, publish COUNT messages (default 100000) in all to the existing queue
 * QUEUE through sink_publish(), in batches of BATCH (default 500, the
 * relay's --batch-size), each batch waiting for its confirms as the relay
 * does. Prints the rate; the messages stay in the queue. Compared with
 * outbox_bench amqp-confirm, it shows what the relay's publishing pattern
 * costs before PostgreSQL shares the machine. A measuring tool, not a test.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sink_load.h"

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

static void *
publisher_run(void *arg)
{
    struct publisher *p = arg;
    struct sink_options options = {.url = p->url}; /* the default exchange */

    p->accepted = sink_load_publish(&options, p->queue, p->first_job_id, p->count, p->batch,
                                    p->payload, p->payload_len);
    return NULL;
}

int
main(int argc, char **argv)
{
    const char *url = argc > 2 ? argv[1] : NULL;
    const char *queue = argc > 2 ? argv[2] : NULL;
    size_t count = argc > 3 ? strtoul(argv[3], NULL, 10) : 100000;
    int threads = argc > 4 ? atoi(argv[4]) : 2;
    size_t batch = argc > 5 ? strtoul(argv[5], NULL, 10) : 500;
    size_t payload_bytes = argc > 6 ? strtoul(argv[6], NULL, 10) : 200;
    struct publisher publishers[MAX_THREADS] = {{0}};
    size_t accepted = 0, assigned = 0;
    double started, seconds;
    char *payload;

    if (url == NULL || count == 0 || threads < 1 || threads > MAX_THREADS || batch == 0 ||
        payload_bytes < 16) {
        fprintf(stderr, "usage: %s URL QUEUE [COUNT [THREADS (1-%d) [BATCH [PAYLOAD_BYTES]]]]\n",
                argv[0], MAX_THREADS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    payload = malloc(payload_bytes + 1);
    if (payload == NULL)
        return 1;
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
    free(payload);
    if (accepted != count) {
        fprintf(stderr, "%zu of %zu messages were not accepted (does queue %s exist?)\n",
                count - accepted, count, queue);
        return 1;
    }
    return 0;
}
