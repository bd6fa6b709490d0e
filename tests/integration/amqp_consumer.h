/*
 * amqp_consumer.h - a small RabbitMQ client for tests: set up queues and
 * exchanges, then fetch what a sink or the relay published and look at
 * every property a consumer would see.
 *
 * Connects with the same URL syntax as the relay (OUTBOX_TEST_AMQP_URL).
 * Every call is bounded (5 s per broker round trip). Functions return 0 or
 * -1; queue_consumer_error() tells why, for test failure messages.
 */
#ifndef OUTBOX_TEST_AMQP_CONSUMER_H
#define OUTBOX_TEST_AMQP_CONSUMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct queue_consumer queue_consumer;

/* One header of a fetched message: strings as text, integers as numbers. */
struct queue_consumer_header {
    char *key;
    bool is_int;
    int64_t int_value;
    char *text; /* NULL unless the value is a string */
};

/* One fetched message. Strings are NUL-terminated copies; NULL when absent. */
struct queue_consumer_message {
    char *exchange;
    char *routing_key;
    char *message_id;
    int64_t job_id; /* the x-outbox-job-id header, -1 without one */
    char *content_type;
    char *type;
    uint8_t delivery_mode; /* 0 when absent */
    bool has_timestamp;
    uint64_t timestamp;
    struct queue_consumer_header *headers;
    size_t header_count;
    char *body;
    size_t body_len;
};

/* Connects to url (amqp://user:pass@host:port/vhost); NULL when that fails (reason on stderr). */
queue_consumer *queue_consumer_connect(const char *url);
void queue_consumer_free(queue_consumer *c);

/* Why the last call failed. */
const char *queue_consumer_error(const queue_consumer *c);

/* Declares a durable queue (idempotent) and purges it. */
int queue_consumer_declare_queue(queue_consumer *c, const char *queue);
/* Declares a quorum queue (replicated over the cluster's nodes, idempotent) and purges it. */
int queue_consumer_declare_quorum_queue(queue_consumer *c, const char *queue);
/* Declares a durable exchange of type ("direct", "topic", ...). */
int queue_consumer_declare_exchange(queue_consumer *c, const char *exchange, const char *type);
int queue_consumer_bind(queue_consumer *c, const char *queue, const char *exchange, const char *routing_key);
int queue_consumer_delete_queue(queue_consumer *c, const char *queue);
int queue_consumer_delete_exchange(queue_consumer *c, const char *exchange);
int queue_consumer_purge(queue_consumer *c, const char *queue);
/* Stores the number of ready messages of queue in *count. */
int queue_consumer_count(queue_consumer *c, const char *queue, uint32_t *count);

/*
 * Fetches up to max messages from queue (basic.get, auto-ack), waiting up
 * to timeout_ms in total for them to show up. Stores how many it got in
 * *fetched; the caller clears each with queue_consumer_message_clear().
 */
int queue_consumer_fetch(queue_consumer *c, const char *queue, struct queue_consumer_message *messages, size_t max,
                   int timeout_ms, size_t *fetched);
void queue_consumer_message_clear(struct queue_consumer_message *message);

/*
 * Consumes queue (basic.consume, auto-ack, so the broker streams without a
 * round trip per message) until no message came for idle_ms, calling
 * on_message with each message's message_id ("" when absent) and job id
 * (the x-outbox-job-id header, -1 when absent). For draining tens of
 * thousands of messages; the consumer is cancelled before it returns.
 */
int queue_consumer_drain(queue_consumer *c, const char *queue, int idle_ms,
                         void (*on_message)(const char *message_id, int64_t job_id, void *arg),
                         void *arg);

/* The header named key, or NULL. */
const struct queue_consumer_header *queue_consumer_message_header(const struct queue_consumer_message *message,
                                                      const char *key);

#endif
