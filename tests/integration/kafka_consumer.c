/*
 * kafka_consumer.c - Kafka topics for the tests: create, delete, read back whole.
 */
#include "kafka_consumer.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#define KAFKA_CONSUMER_ERRSTR 512

static long long
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "h1:p1,h2:p2" out of kafka://h1:p1,h2:p2[/]. */
static void
bootstrap_of(const char *url, char *out, size_t size)
{
    const char *start = strstr(url, "://");

    snprintf(out, size, "%s", start != NULL ? start + 3 : url);
    out[strcspn(out, "/")] = '\0';
}

/* A client of type on url's cluster, quiet in the test's output; NULL with why in errbuf. */
static rd_kafka_t *
client_new(rd_kafka_type_t type, const char *url, char *errbuf, size_t size)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char servers[1024], group[64];
    rd_kafka_t *client;

    bootstrap_of(url, servers, sizeof(servers));
    snprintf(group, sizeof(group), "outbox-test-%d-%lld", (int)getpid(), now_ms());
    if (rd_kafka_conf_set(conf, "bootstrap.servers", servers, errbuf, size) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(conf, "log_level", "2", errbuf, size) != RD_KAFKA_CONF_OK ||
        (type == RD_KAFKA_CONSUMER &&
         (rd_kafka_conf_set(conf, "group.id", group, errbuf, size) != RD_KAFKA_CONF_OK ||
          rd_kafka_conf_set(conf, "enable.auto.commit", "false", errbuf, size) !=
              RD_KAFKA_CONF_OK ||
          rd_kafka_conf_set(conf, "enable.partition.eof", "false", errbuf, size) !=
              RD_KAFKA_CONF_OK))) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    client = rd_kafka_new(type, conf, errbuf, size);
    if (client == NULL)
        rd_kafka_conf_destroy(conf);
    return client;
}

/* Metadata of topic alone; NULL when it cannot be read. */
static const struct rd_kafka_metadata *
topic_metadata(rd_kafka_t *client, const char *topic, int timeout_ms)
{
    const struct rd_kafka_metadata *metadata = NULL;
    rd_kafka_topic_t *handle = rd_kafka_topic_new(client, topic, NULL);

    if (handle == NULL)
        return NULL;
    if (rd_kafka_metadata(client, 0, handle, &metadata, timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR)
        metadata = NULL;
    rd_kafka_topic_destroy(handle);
    return metadata;
}

/* The topic exists with partitions partitions, each with a leader. */
static bool
topic_ready(rd_kafka_t *client, const char *topic, int partitions)
{
    const struct rd_kafka_metadata *metadata = topic_metadata(client, topic, 2000);
    bool ready = false;

    if (metadata == NULL)
        return false;
    if (metadata->topic_cnt == 1 && metadata->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
        metadata->topics[0].partition_cnt == partitions) {
        ready = true;
        for (int p = 0; p < partitions; p++)
            ready &= metadata->topics[0].partitions[p].leader >= 0 &&
                     metadata->topics[0].partitions[p].err == RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    rd_kafka_metadata_destroy(metadata);
    return ready;
}

/* Runs the admin request new_topic and returns the topic's result error text, "" when fine. */
static int
run_create(rd_kafka_t *client, rd_kafka_NewTopic_t *new_topic, int timeout_ms, char *errbuf,
           size_t size)
{
    rd_kafka_queue_t *queue = rd_kafka_queue_new(client);
    rd_kafka_AdminOptions_t *options =
        rd_kafka_AdminOptions_new(client, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    rd_kafka_event_t *event;
    int rc = -1;

    rd_kafka_AdminOptions_set_operation_timeout(options, timeout_ms, errbuf, size);
    rd_kafka_CreateTopics(client, &new_topic, 1, options, queue);
    event = rd_kafka_queue_poll(queue, timeout_ms + 5000);
    if (event == NULL) {
        snprintf(errbuf, size, "no answer to CreateTopics");
    } else if (rd_kafka_event_error(event) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(errbuf, size, "CreateTopics: %s", rd_kafka_event_error_string(event));
    } else {
        const rd_kafka_CreateTopics_result_t *result = rd_kafka_event_CreateTopics_result(event);
        size_t count = 0;
        const rd_kafka_topic_result_t **topics =
            rd_kafka_CreateTopics_result_topics(result, &count);

        if (count == 1 && rd_kafka_topic_result_error(topics[0]) == RD_KAFKA_RESP_ERR_NO_ERROR)
            rc = 0;
        else
            snprintf(errbuf, size, "CreateTopics: %s",
                     count == 1 ? rd_kafka_topic_result_error_string(topics[0]) : "no result");
    }
    if (event != NULL)
        rd_kafka_event_destroy(event);
    rd_kafka_AdminOptions_destroy(options);
    rd_kafka_queue_destroy(queue);
    return rc;
}

int
kafka_consumer_create_topic(const char *url, const char *topic, int partitions, int replication,
                            const char *const *configs, int timeout_ms, char *errbuf, size_t size)
{
    rd_kafka_t *client = client_new(RD_KAFKA_PRODUCER, url, errbuf, size);
    rd_kafka_NewTopic_t *new_topic;
    long long deadline = now_ms() + timeout_ms;
    int rc = -1;

    if (client == NULL)
        return -1;
    new_topic = rd_kafka_NewTopic_new(topic, partitions, replication, errbuf, size);
    if (new_topic == NULL)
        goto cleanup;
    for (size_t i = 0; configs != NULL && configs[i] != NULL && configs[i + 1] != NULL; i += 2)
        rd_kafka_NewTopic_set_config(new_topic, configs[i], configs[i + 1]);
    if (run_create(client, new_topic, timeout_ms, errbuf, size) != 0)
        goto cleanup;
    while (!topic_ready(client, topic, partitions)) {
        if (now_ms() > deadline) {
            snprintf(errbuf, size, "topic %s has no leader for every partition after %d ms", topic,
                     timeout_ms);
            goto cleanup;
        }
        usleep(100000);
    }
    rc = 0;

cleanup:
    if (new_topic != NULL)
        rd_kafka_NewTopic_destroy(new_topic);
    rd_kafka_destroy(client);
    return rc;
}

int
kafka_consumer_delete_topic(const char *url, const char *topic)
{
    char errbuf[KAFKA_CONSUMER_ERRSTR];
    rd_kafka_t *client = client_new(RD_KAFKA_PRODUCER, url, errbuf, sizeof(errbuf));
    rd_kafka_DeleteTopic_t *delete_topic;
    rd_kafka_queue_t *queue;
    rd_kafka_event_t *event;
    int rc = -1;

    if (client == NULL)
        return -1;
    delete_topic = rd_kafka_DeleteTopic_new(topic);
    queue = rd_kafka_queue_new(client);
    rd_kafka_DeleteTopics(client, &delete_topic, 1, NULL, queue);
    event = rd_kafka_queue_poll(queue, 30000);
    if (event != NULL) {
        const rd_kafka_DeleteTopics_result_t *result = rd_kafka_event_DeleteTopics_result(event);
        size_t count = 0;
        const rd_kafka_topic_result_t **topics =
            result != NULL ? rd_kafka_DeleteTopics_result_topics(result, &count) : NULL;

        if (count == 1 && rd_kafka_topic_result_error(topics[0]) == RD_KAFKA_RESP_ERR_NO_ERROR)
            rc = 0;
        rd_kafka_event_destroy(event);
    }
    rd_kafka_DeleteTopic_destroy(delete_topic);
    rd_kafka_queue_destroy(queue);
    rd_kafka_destroy(client);
    return rc;
}

int
kafka_consumer_partition_leader(const char *url, const char *topic, int partition)
{
    char errbuf[KAFKA_CONSUMER_ERRSTR];
    rd_kafka_t *client = client_new(RD_KAFKA_PRODUCER, url, errbuf, sizeof(errbuf));
    const struct rd_kafka_metadata *metadata;
    int leader = -1;

    if (client == NULL)
        return -1;
    metadata = topic_metadata(client, topic, 10000);
    if (metadata != NULL && metadata->topic_cnt == 1 &&
        partition < metadata->topics[0].partition_cnt)
        leader = metadata->topics[0].partitions[partition].leader;
    if (metadata != NULL)
        rd_kafka_metadata_destroy(metadata);
    rd_kafka_destroy(client);
    return leader;
}

/* ---- reading ---- */

static char *
copy_bytes(const void *data, size_t len)
{
    char *out = malloc(len + 1);

    if (out == NULL)
        abort();
    if (len > 0)
        memcpy(out, data, len);
    out[len] = '\0';
    return out;
}

/* A header's value as a new string, NULL when the record has none of that name. */
static char *
header_text(rd_kafka_headers_t *headers, const char *name)
{
    const void *value;
    size_t len;

    if (headers == NULL ||
        rd_kafka_header_get_last(headers, name, &value, &len) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return NULL;
    return copy_bytes(value, len);
}

static void
record_fill(struct kafka_consumer_record *record, rd_kafka_message_t *message)
{
    rd_kafka_headers_t *headers = NULL;
    rd_kafka_timestamp_type_t type;
    char *text;

    memset(record, 0, sizeof(*record));
    record->partition = message->partition;
    record->offset = message->offset;
    record->key = message->key != NULL ? copy_bytes(message->key, message->key_len) : NULL;
    record->value = copy_bytes(message->payload, message->len);
    record->value_len = message->len;
    record->timestamp_ms = rd_kafka_message_timestamp(message, &type);
    rd_kafka_message_headers(message, &headers);
    record->header_count = headers != NULL ? rd_kafka_header_cnt(headers) : 0;
    record->message_id = header_text(headers, "message-id");
    text = header_text(headers, "outbox-job-id");
    record->job_id = text != NULL ? strtoll(text, NULL, 10) : -1;
    free(text);
    text = header_text(headers, "outbox-attempt");
    record->attempt = text != NULL ? (int32_t)strtol(text, NULL, 10) : -1;
    free(text);
    record->queue = header_text(headers, "outbox-queue");
    record->traceparent = header_text(headers, "traceparent");
    record->trace_id = header_text(headers, "trace-id");
}

static int
compare_record(const void *a, const void *b)
{
    const struct kafka_consumer_record *x = a, *y = b;

    if (x->partition != y->partition)
        return (x->partition > y->partition) - (x->partition < y->partition);
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The partitions of topic and their high watermarks; -1 when unknown. */
static int
read_watermarks(rd_kafka_t *client, const char *topic, int64_t **high, int *count, char *errbuf,
                size_t size)
{
    const struct rd_kafka_metadata *metadata = topic_metadata(client, topic, 10000);
    int n;

    if (metadata == NULL || metadata->topic_cnt != 1 ||
        metadata->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(errbuf, size, "no metadata for topic %s", topic);
        if (metadata != NULL)
            rd_kafka_metadata_destroy(metadata);
        return -1;
    }
    n = metadata->topics[0].partition_cnt;
    rd_kafka_metadata_destroy(metadata);
    *high = calloc((size_t)n, sizeof(**high));
    *count = n;
    for (int p = 0; p < n; p++) {
        int64_t low;
        rd_kafka_resp_err_t code = rd_kafka_query_watermark_offsets(client, topic, p, &low,
                                                                    &(*high)[p], 10000);

        if (code != RD_KAFKA_RESP_ERR_NO_ERROR) {
            snprintf(errbuf, size, "watermarks of %s/%d: %s", topic, p, rd_kafka_err2str(code));
            free(*high);
            *high = NULL;
            return -1;
        }
    }
    return 0;
}

/* Polls client until every partition reached its high watermark; -1 on timeout. */
static int
consume_to(rd_kafka_t *client, const int64_t *high, int partitions, long long deadline,
           struct kafka_consumer_topic *out, char *errbuf, size_t size)
{
    size_t capacity = 0;
    int64_t *next = calloc((size_t)partitions, sizeof(*next));
    int done = 0, rc = -1;

    for (int p = 0; p < partitions; p++)
        done += high[p] == 0;
    while (done < partitions) {
        rd_kafka_message_t *message = rd_kafka_consumer_poll(client, 100);

        if (now_ms() > deadline) {
            snprintf(errbuf, size, "read %zu records, still missing some at the deadline",
                     out->count);
            if (message != NULL)
                rd_kafka_message_destroy(message);
            goto cleanup;
        }
        if (message == NULL)
            continue;
        if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR && message->partition < partitions &&
            message->offset < high[message->partition]) {
            if (out->count == capacity) {
                capacity = capacity ? capacity * 2 : 1024;
                out->records = realloc(out->records, capacity * sizeof(*out->records));
                if (out->records == NULL)
                    abort();
            }
            record_fill(&out->records[out->count++], message);
            next[message->partition] = message->offset + 1;
            done += next[message->partition] == high[message->partition];
        }
        rd_kafka_message_destroy(message);
    }
    rc = 0;

cleanup:
    free(next);
    return rc;
}

int
kafka_consumer_read_topic(const char *url, const char *topic, int timeout_ms,
                          struct kafka_consumer_topic *out, char *errbuf, size_t size)
{
    rd_kafka_t *client = client_new(RD_KAFKA_CONSUMER, url, errbuf, size);
    rd_kafka_topic_partition_list_t *assignment = NULL;
    long long deadline = now_ms() + timeout_ms;
    int64_t *high = NULL;
    int partitions = 0, rc = -1;

    memset(out, 0, sizeof(*out));
    if (client == NULL)
        return -1;
    if (read_watermarks(client, topic, &high, &partitions, errbuf, size) != 0)
        goto cleanup;
    assignment = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; p++)
        rd_kafka_topic_partition_list_add(assignment, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    if (rd_kafka_assign(client, assignment) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(errbuf, size, "unable to assign the partitions of %s", topic);
        goto cleanup;
    }
    rc = consume_to(client, high, partitions, deadline, out, errbuf, size);
    if (rc != 0)
        kafka_consumer_topic_clear(out);
    else if (out->count > 1) /* an empty topic has no array to sort */
        qsort(out->records, out->count, sizeof(*out->records), compare_record);

cleanup:
    if (assignment != NULL)
        rd_kafka_topic_partition_list_destroy(assignment);
    free(high);
    rd_kafka_consumer_close(client);
    rd_kafka_destroy(client);
    return rc;
}

void
kafka_consumer_topic_clear(struct kafka_consumer_topic *topic)
{
    for (size_t i = 0; i < topic->count; i++) {
        free(topic->records[i].key);
        free(topic->records[i].value);
        free(topic->records[i].message_id);
        free(topic->records[i].queue);
        free(topic->records[i].traceparent);
        free(topic->records[i].trace_id);
    }
    free(topic->records);
    topic->records = NULL;
    topic->count = 0;
}
