/*
 * kafka_consumer.h - test helpers that set up Kafka topics and read back what
 * the relay produced.
 *
 * The relay never creates topics, so tests create them here through
 * librdkafka's admin API and wait until every partition has a leader. A
 * topic is read back whole: every partition from its first offset up to the
 * high watermark at the time of the call, so a read is exact (no "wait a
 * bit for more"). URLs are the relay's kafka://h1:p1,h2:p2 (plaintext, no
 * credentials: the tests use the brokers' plaintext listeners). For tests only: errors are
 * reported by return value and, where given, a message in errbuf.
 */
#ifndef OUTBOX_TESTS_KAFKA_CONSUMER_H
#define OUTBOX_TESTS_KAFKA_CONSUMER_H

#include <stddef.h>
#include <stdint.h>

/*
 * Creates topic with partitions and replication factor, configs a
 * NULL-terminated list of name, value pairs (may be NULL), and waits up to
 * timeout_ms until the cluster's metadata shows a leader for each partition.
 * 0, or -1 with why in errbuf.
 */
int kafka_consumer_create_topic(const char *url, const char *topic, int partitions,
                                int replication, const char *const *configs, int timeout_ms,
                                char *errbuf, size_t size);

/* Deletes topic; 0 or -1 (a missing topic is -1). */
int kafka_consumer_delete_topic(const char *url, const char *topic);

/* The node id leading partition of topic, or -1. */
int kafka_consumer_partition_leader(const char *url, const char *topic, int partition);

/* One record; strings are owned and NUL-terminated. */
struct kafka_consumer_record {
    int32_t partition;
    int64_t offset;
    char *key; /* NULL when the record has none */
    char *value;
    size_t value_len;
    int64_t timestamp_ms;
    char *message_id;   /* the message-id header, NULL without one */
    int64_t job_id;     /* the outbox-job-id header as a number, -1 without one */
    char *queue;        /* outbox-queue header, NULL without one */
    int32_t attempt;    /* outbox-attempt header, -1 without one */
    char *traceparent;  /* NULL without one */
    char *trace_id;     /* the row header "trace-id", NULL without one */
    size_t header_count;
};

struct kafka_consumer_topic {
    struct kafka_consumer_record *records; /* by partition, then offset */
    size_t count;
};

/*
 * Reads every record of every partition of topic up to the high watermark
 * (taken when called), waiting at most timeout_ms in all. 0, or -1 with why
 * in errbuf (out is then empty).
 */
int kafka_consumer_read_topic(const char *url, const char *topic, int timeout_ms,
                              struct kafka_consumer_topic *out, char *errbuf, size_t size);
void kafka_consumer_topic_clear(struct kafka_consumer_topic *topic);

#endif
