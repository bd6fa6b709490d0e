/*
 * sink_kafka_conn.h - the Kafka sink's shared state: the producer and the
 * bookkeeping of the batch being published, which the delivery reports
 * fill on the publishing thread.
 *
 * Only the sink's files include this header: sink_kafka.c (configuring and
 * connecting the producer, --check, its ops table and registry row) and
 * sink_kafka_publish.c (a batch, its delivery reports, idle).
 */
#ifndef OUTBOX_SINK_KAFKA_CONN_H
#define OUTBOX_SINK_KAFKA_CONN_H

#include <stdbool.h>
#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "sink_internal.h"

/* librdkafka's error texts, and the last reason kept */
#define SINK_KAFKA_ERRSTR_MAX 512

struct sink_kafka {
    rd_kafka_t *producer;
    char *topic_prefix;
    int sasl_mechanism; /* index in sink_kafka.c's SASL_MECHANISMS */
    /* the batch being published: its outcomes and which have their report */
    struct sink_outcome *outcomes;
    bool *settled;
    bool *too_large; /* refused as too large: alone, or in a batch the broker found too large */
    size_t count;
    size_t capacity;
    size_t reports;  /* delivery reports received for this batch */
    size_t deferred; /* of which no message's fault */
    /* the last error librdkafka reported outside a delivery report */
    rd_kafka_resp_err_t last_error;
    bool all_down; /* every broker connection went down since the batch began */
    char last_reason[SINK_KAFKA_ERRSTR_MAX];
};

/* librdkafka's delivery report and error callbacks (served by rd_kafka_poll and flush). */
void sink_kafka_on_delivery(rd_kafka_t *producer, const rd_kafka_message_t *message,
                            void *opaque);
void sink_kafka_on_error(rd_kafka_t *producer, int code, const char *reason, void *opaque);

/* Destroys the producer at once: whatever it still holds is dropped, unreported. */
void sink_kafka_destroy_producer(struct sink_kafka *k);

/* A fatal producer error (idempotence state lost): the producer must be rebuilt. */
bool sink_kafka_producer_fatal(struct sink_kafka *k, char *reason, size_t size);

/* The sink's disconnect, idle and publish operations (see struct sink_ops). */
void sink_kafka_disconnect(sink *s);
int sink_kafka_idle(sink *s, struct outbox_error *err);
int sink_kafka_publish(sink *s, const struct sink_message *messages, size_t count,
                       struct sink_outcome *outcomes, struct outbox_error *err);

#endif
