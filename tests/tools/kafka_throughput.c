/*
 * kafka_throughput.c - the Kafka producer ceiling, and the topic chores of the bench.
 *
 *   kafka_throughput create-topic URL TOPIC [PARTITIONS]    create it (1 replica), wait for leaders
 *   kafka_throughput delete-topic URL TOPIC
 *   kafka_throughput count URL TOPIC                        records=N (sum of high watermarks)
 *   kafka_throughput raw URL TOPIC COUNT PAYLOAD_BYTES [THREADS]   rate=N msgs/s
 *   kafka_throughput sink URL TOPIC COUNT PAYLOAD_BYTES [THREADS [BATCH]]
 *
 * raw is the ceiling the relay's Kafka drain is compared with: THREADS
 * (default 2, the relay's --concurrency) librdkafka producers configured
 * as the relay's (idempotent, acks=all, linger.ms 5, murmur2), COUNT records
 * of PAYLOAD_BYTES bytes without a key and with the three headers the
 * relay adds, produced as fast as the queue takes them, then flushed;
 * every delivery report must succeed. sink drives
 * the relay's Kafka sink as its pipelines do, without a database: THREADS
 * sinks (default 2, --concurrency) publish COUNT messages in all through
 * sink_publish() in batches of BATCH (default 500, --batch-size), each
 * batch waiting for its reports; between the two, what the relay's
 * publishing pattern costs before PostgreSQL shares the machine. URL is a
 * kafka://h1:p1[,h2:p2] of a broker without credentials. A measuring tool,
 * not a test: it asserts nothing about speed. Exit 1 on any failure.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/sink_load.h"
#include "sink.h"
#include "sink_kafka.h"

#define MAX_THREADS 16

static atomic_llong delivered, failed;

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
on_delivery(rd_kafka_t *producer, const rd_kafka_message_t *message, void *opaque)
{
    (void)producer;
    (void)opaque;
    if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR)
        delivered++;
    else if (failed++ == 0)
        fprintf(stderr, "kafka_throughput: delivery failed: %s\n", rd_kafka_err2str(message->err));
}

static bool
conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, char *errstr, size_t size)
{
    return rd_kafka_conf_set(conf, name, value, errstr, size) == RD_KAFKA_CONF_OK;
}

/* A client for url; the producer settings are the relay's. */
static rd_kafka_t *
client_new(rd_kafka_type_t type, const char *url)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *start = strstr(url, "://");
    char servers[1024], errstr[512], group[64];
    size_t size = sizeof(errstr);
    rd_kafka_t *client;
    bool ok;

    snprintf(servers, sizeof(servers), "%s", start != NULL ? start + 3 : url);
    servers[strcspn(servers, "/")] = '\0';
    snprintf(group, sizeof(group), "kafka-throughput-%d", (int)getpid());
    ok = conf_set(conf, "bootstrap.servers", servers, errstr, size) &&
         conf_set(conf, "log_level", "3", errstr, size); /* no retry chatter while a broker starts */
    if (type == RD_KAFKA_PRODUCER) {
        ok = ok && conf_set(conf, "enable.idempotence", "true", errstr, size) &&
             conf_set(conf, "acks", "all", errstr, size) &&
             conf_set(conf, "linger.ms", "5", errstr, size) &&
             conf_set(conf, "partitioner", "murmur2_random", errstr, size) &&
             conf_set(conf, "socket.nagle.disable", "true", errstr, size);
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    } else {
        ok = ok && conf_set(conf, "group.id", group, errstr, size);
    }
    if (!ok) {
        fprintf(stderr, "kafka_throughput: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    client = rd_kafka_new(type, conf, errstr, sizeof(errstr));
    if (client == NULL) {
        fprintf(stderr, "kafka_throughput: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
    }
    return client;
}

static int
create_topic(const char *url, const char *topic, int partitions)
{
    rd_kafka_t *client = client_new(RD_KAFKA_PRODUCER, url);
    char errstr[512];
    rd_kafka_NewTopic_t *new_topic;
    rd_kafka_queue_t *queue;
    rd_kafka_event_t *event;
    const struct rd_kafka_metadata *metadata = NULL;
    int rc = 1;

    if (client == NULL)
        return 1;
    new_topic = rd_kafka_NewTopic_new(topic, partitions, 1, errstr, sizeof(errstr));
    queue = rd_kafka_queue_new(client);
    rd_kafka_CreateTopics(client, &new_topic, 1, NULL, queue);
    event = rd_kafka_queue_poll(queue, 30000);
    if (event != NULL && rd_kafka_event_error(event) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        size_t count = 0;
        const rd_kafka_topic_result_t **topics =
            rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(event), &count);

        if (count == 1 && rd_kafka_topic_result_error(topics[0]) == RD_KAFKA_RESP_ERR_NO_ERROR)
            rc = 0;
        else
            fprintf(stderr, "kafka_throughput: create %s: %s\n", topic,
                    count == 1 ? rd_kafka_topic_result_error_string(topics[0]) : "no result");
    } else {
        fprintf(stderr, "kafka_throughput: create %s: no answer\n", topic);
    }
    /* leaders known: a metadata request for the topic names them */
    for (int i = 0; rc == 0 && i < 100; i++) {
        rd_kafka_topic_t *handle = rd_kafka_topic_new(client, topic, NULL);
        bool ready =
            rd_kafka_metadata(client, 0, handle, &metadata, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
            metadata->topic_cnt == 1 && metadata->topics[0].partition_cnt == partitions;

        for (int p = 0; ready && p < partitions; p++)
            ready = metadata->topics[0].partitions[p].leader >= 0;
        if (metadata != NULL)
            rd_kafka_metadata_destroy(metadata);
        metadata = NULL;
        rd_kafka_topic_destroy(handle);
        if (ready)
            break;
        usleep(100000);
    }
    if (event != NULL)
        rd_kafka_event_destroy(event);
    rd_kafka_NewTopic_destroy(new_topic);
    rd_kafka_queue_destroy(queue);
    rd_kafka_destroy(client);
    return rc;
}

static int
delete_topic(const char *url, const char *topic)
{
    rd_kafka_t *client = client_new(RD_KAFKA_PRODUCER, url);
    rd_kafka_DeleteTopic_t *delete_one;
    rd_kafka_queue_t *queue;
    rd_kafka_event_t *event;

    if (client == NULL)
        return 1;
    delete_one = rd_kafka_DeleteTopic_new(topic);
    queue = rd_kafka_queue_new(client);
    rd_kafka_DeleteTopics(client, &delete_one, 1, NULL, queue);
    event = rd_kafka_queue_poll(queue, 30000);
    if (event != NULL)
        rd_kafka_event_destroy(event);
    rd_kafka_DeleteTopic_destroy(delete_one);
    rd_kafka_queue_destroy(queue);
    rd_kafka_destroy(client);
    return 0;
}

static int
count_records(const char *url, const char *topic)
{
    rd_kafka_t *client = client_new(RD_KAFKA_CONSUMER, url);
    const struct rd_kafka_metadata *metadata = NULL;
    rd_kafka_topic_t *handle;
    long long total = 0;
    int rc = 1;

    if (client == NULL)
        return 1;
    handle = rd_kafka_topic_new(client, topic, NULL);
    if (rd_kafka_metadata(client, 0, handle, &metadata, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        metadata->topic_cnt == 1 && metadata->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        rc = 0;
        for (int p = 0; p < metadata->topics[0].partition_cnt; p++) {
            int64_t low, high;

            if (rd_kafka_query_watermark_offsets(client, topic, p, &low, &high, 10000) !=
                RD_KAFKA_RESP_ERR_NO_ERROR) {
                rc = 1;
                break;
            }
            total += high - low;
        }
    }
    if (metadata != NULL)
        rd_kafka_metadata_destroy(metadata);
    rd_kafka_topic_destroy(handle);
    rd_kafka_destroy(client);
    if (rc == 0)
        printf("records=%lld\n", total);
    else
        fprintf(stderr, "kafka_throughput: unable to count the records of %s\n", topic);
    return rc;
}

/* One raw producer's share: produce as fast as the queue takes them, then flush. */
struct raw_producer {
    rd_kafka_t *producer;
    const char *topic;
    long long first, count;
    const char *payload;
    size_t payload_bytes;
    int failed;
    pthread_t thread;
};

static void *
raw_run(void *arg)
{
    struct raw_producer *r = arg;
    char id[32];

    for (long long i = r->first; i < r->first + r->count; i++) {
        rd_kafka_headers_t *headers = rd_kafka_headers_new(3);
        rd_kafka_resp_err_t code;

        snprintf(id, sizeof(id), "%lld", i + 1);
        rd_kafka_header_add(headers, "message-id", -1, id, -1);
        rd_kafka_header_add(headers, "outbox-queue", -1, "bench", -1);
        rd_kafka_header_add(headers, "outbox-attempt", -1, "1", -1);
        while ((code = rd_kafka_producev(r->producer, RD_KAFKA_V_TOPIC(r->topic),
                                         RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                         RD_KAFKA_V_VALUE((void *)r->payload, r->payload_bytes),
                                         RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_END)) ==
               RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(r->producer, 1);
        if (code != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "kafka_throughput: produce: %s\n", rd_kafka_err2str(code));
            rd_kafka_headers_destroy(headers);
            r->failed = 1;
            return NULL;
        }
        if (i % 1000 == 999)
            rd_kafka_poll(r->producer, 0);
    }
    rd_kafka_flush(r->producer, 120000);
    return NULL;
}

/*
 * THREADS producers (the relay's --concurrency), each connected before the
 * clock starts as the relay's sinks are, share COUNT records.
 */
static int
produce_raw(const char *url, const char *topic, long long count, size_t payload_bytes, int threads)
{
    struct raw_producer producers[MAX_THREADS] = {{0}};
    char *payload = malloc(payload_bytes + 1);
    long long assigned = 0;
    double started, seconds;
    int failures = 0;

    if (payload == NULL || threads < 1 || threads > MAX_THREADS)
        return 2;
    memset(payload, 'x', payload_bytes);
    for (int t = 0; t < threads; t++) {
        const struct rd_kafka_metadata *metadata = NULL;

        producers[t].producer = client_new(RD_KAFKA_PRODUCER, url);
        if (producers[t].producer == NULL ||
            rd_kafka_metadata(producers[t].producer, 0, NULL, &metadata, 10000) !=
                RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "kafka_throughput: no metadata from %s\n", url);
            return 1;
        }
        rd_kafka_metadata_destroy(metadata);
    }
    started = now_seconds();
    for (int t = 0; t < threads; t++) {
        long long share = count / threads + (t < count % threads);

        producers[t].topic = topic;
        producers[t].first = assigned;
        producers[t].count = share;
        producers[t].payload = payload;
        producers[t].payload_bytes = payload_bytes;
        assigned += share;
        pthread_create(&producers[t].thread, NULL, raw_run, &producers[t]);
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(producers[t].thread, NULL);
        failures += producers[t].failed;
    }
    seconds = now_seconds() - started;
    for (int t = 0; t < threads; t++)
        rd_kafka_destroy(producers[t].producer);
    free(payload);
    if (failures > 0 || atomic_load(&delivered) != count) {
        fprintf(stderr, "kafka_throughput: %lld of %lld delivered, %lld failed\n",
                (long long)atomic_load(&delivered), count, (long long)atomic_load(&failed));
        return 1;
    }
    printf("rate=%.0f count=%lld threads=%d seconds=%.3f\n", (double)count / seconds, count,
           threads, seconds);
    return 0;
}

struct publisher {
    const char *url;
    const char *topic;
    int64_t first_job_id;
    size_t count;
    size_t batch;
    const char *payload;
    size_t payload_len;
    size_t accepted;
    pthread_t thread;
};

static void *
publisher_run(void *arg)
{
    struct publisher *p = arg;
    struct sink_kafka_config kafka = {.topic_prefix = ""};
    struct sink_options options = {.url = p->url};

    *sink_options_broker(&options, "kafka") = &kafka;
    p->accepted = sink_load_publish(&options, p->topic, p->first_job_id, p->count, p->batch,
                                    p->payload, p->payload_len);
    return NULL;
}

static int
publish_through_sink(const char *url, const char *topic, size_t count, size_t payload_bytes,
                     int threads, size_t batch)
{
    struct publisher publishers[MAX_THREADS] = {{0}};
    size_t accepted = 0, assigned = 0;
    double started, seconds;
    char *payload;

    if (count == 0 || threads < 1 || threads > MAX_THREADS || batch == 0 || payload_bytes < 16)
        return 2;
    payload = malloc(payload_bytes + 1);
    if (payload == NULL)
        return 1;
    memset(payload, 'x', payload_bytes);
    memcpy(payload, "{\"pad\":\"", 8);
    memcpy(payload + payload_bytes - 2, "\"}", 2);
    payload[payload_bytes] = '\0';
    started = now_seconds();
    for (int t = 0; t < threads; t++) {
        size_t share = count / (size_t)threads + ((size_t)t < count % (size_t)threads);

        publishers[t] = (struct publisher){.url = url, .topic = topic,
                                           .first_job_id = 1 + (int64_t)assigned, .count = share,
                                           .batch = batch, .payload = payload,
                                           .payload_len = payload_bytes};
        assigned += share;
        pthread_create(&publishers[t].thread, NULL, publisher_run, &publishers[t]);
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(publishers[t].thread, NULL);
        accepted += publishers[t].accepted;
    }
    seconds = now_seconds() - started;
    free(payload);
    if (accepted != count) {
        fprintf(stderr, "kafka_throughput: %zu of %zu messages not accepted\n", count - accepted,
                count);
        return 1;
    }
    printf("rate=%.0f count=%zu threads=%d batch=%zu seconds=%.3f\n", (double)count / seconds,
           count, threads, batch, seconds);
    return 0;
}

int
main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "create-topic") == 0)
        return create_topic(argv[2], argv[3], argc > 4 ? atoi(argv[4]) : 1);
    if (argc == 4 && strcmp(argv[1], "delete-topic") == 0)
        return delete_topic(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "count") == 0)
        return count_records(argv[2], argv[3]);
    if ((argc == 6 || argc == 7) && strcmp(argv[1], "raw") == 0)
        return produce_raw(argv[2], argv[3], atoll(argv[4]), (size_t)atol(argv[5]),
                           argc > 6 ? atoi(argv[6]) : 2);
    if (argc >= 6 && argc <= 8 && strcmp(argv[1], "sink") == 0)
        return publish_through_sink(argv[2], argv[3], strtoul(argv[4], NULL, 10),
                                    strtoul(argv[5], NULL, 10), argc > 6 ? atoi(argv[6]) : 2,
                                    argc > 7 ? strtoul(argv[7], NULL, 10) : 500);
    fprintf(stderr,
            "usage: kafka_throughput create-topic|delete-topic|count|raw|sink URL TOPIC ...\n");
    return 2;
}
