/*
 * amqp_consumer.h - a small RabbitMQ client for tests: set up queues and
 * exchanges, then fetch what a sink or the relay published and look at
 * every property a consumer would see.
 *
 * Connects with the same URL syntax as the relay (OUTBOX_TEST_AMQP_URL).
 * Every call is bounded (5 s per broker round trip). Functions return 0 or
 * -1; consumer_error() tells why, for test failure messages.
 */
#ifndef OUTBOX_TEST_AMQP_CONSUMER_H
#define OUTBOX_TEST_AMQP_CONSUMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct consumer consumer;

/* One header of a fetched message: strings as text, integers as numbers. */
struct consumer_header {
    char *key;
    bool is_int;
    int64_t int_value;
    char *text; /* NULL unless the value is a string */
};

/* One fetched message. Strings are NUL-terminated copies; NULL when absent. */
struct consumer_message {
    char *exchange;
    char *routing_key;
    char *message_id;
    char *content_type;
    char *type;
    uint8_t delivery_mode; /* 0 when absent */
    bool has_timestamp;
    uint64_t timestamp;
    struct consumer_header *headers;
    size_t header_count;
    char *body;
    size_t body_len;
};

/* Connects to url (amqp://user:pass@host:port/vhost); NULL when that fails (reason on stderr). */
consumer *consumer_connect(const char *url);
void consumer_free(consumer *c);

/* Why the last call failed. */
const char *consumer_error(const consumer *c);

/* Declares a durable queue (idempotent) and purges it. */
int consumer_declare_queue(consumer *c, const char *queue);
/* Declares a durable exchange of type ("direct", "topic", ...). */
int consumer_declare_exchange(consumer *c, const char *exchange, const char *type);
int consumer_bind(consumer *c, const char *queue, const char *exchange, const char *routing_key);
int consumer_delete_queue(consumer *c, const char *queue);
int consumer_delete_exchange(consumer *c, const char *exchange);
int consumer_purge(consumer *c, const char *queue);
/* Stores the number of ready messages of queue in *count. */
int consumer_count(consumer *c, const char *queue, uint32_t *count);

/*
 * Fetches up to max messages from queue (basic.get, auto-ack), waiting up
 * to timeout_ms in total for them to show up. Stores how many it got in
 * *fetched; the caller clears each with consumer_message_clear().
 */
int consumer_fetch(consumer *c, const char *queue, struct consumer_message *messages, size_t max,
                   int timeout_ms, size_t *fetched);
void consumer_message_clear(struct consumer_message *message);

/* The header named key, or NULL. */
const struct consumer_header *consumer_message_header(const struct consumer_message *message,
                                                      const char *key);

#endif
