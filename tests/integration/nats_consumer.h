/*
 * nats_consumer.h - test helpers that make JetStream streams and read back
 * what the relay published to them.
 *
 * The relay never creates streams, so the tests do, through libnats's
 * stream API: one stream per test, named after it, over the subjects
 * "<prefix>>" (or one exact subject). Reading walks the stream by sequence
 * (stream message get), so a test sees every stored message with its
 * subject, Nats-Msg-Id and body, the way a consumer replaying the stream
 * would. For tests only: errors print nothing and are reported by return
 * value.
 */
#ifndef OUTBOX_TESTS_NATS_CONSUMER_H
#define OUTBOX_TESTS_NATS_CONSUMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct nats_consumer nats_consumer;

/* What a test stream is made with; zero values take the server's defaults. */
struct nats_consumer_stream_options {
    const char *subject;     /* the stream's one subject filter, e.g. "events.>" */
    bool memory;             /* memory storage instead of file storage */
    int64_t max_msgs;        /* > 0: a message limit ... */
    bool discard_new;        /* ... refusing new messages once reached */
    int64_t duplicates_ms;   /* duplicate window; 0: the server's (2 min) */
    int replicas;            /* 0: 1 */
};

/* Connects to a nats:// URL (a server list allowed). NULL on failure. */
nats_consumer *nats_consumer_connect(const char *url);
/* The same, authenticated by a credentials file (user JWT and seed). NULL on failure. */
nats_consumer *nats_consumer_connect_creds(const char *url, const char *creds);
void nats_consumer_free(nats_consumer *c);

/*
 * Subscribes with core NATS (no stream) to subject; answers each message
 * that asks for a reply with reply_text (kept, not copied) unless NULL. 0,
 * or -1. Up to 4 subscriptions, ended by nats_consumer_free().
 */
int nats_consumer_subscribe(nats_consumer *c, const char *subject, const char *reply_text);
/* How many messages the core subscriptions received. */
long long nats_consumer_received(nats_consumer *c);

/* Creates stream name. 0, or -1. */
int nats_consumer_create_stream(nats_consumer *c, const char *name,
                                const struct nats_consumer_stream_options *options);

/* Deletes stream name; a missing stream is not an error. */
void nats_consumer_delete_stream(nats_consumer *c, const char *name);

/* One stored message; strings are owned. */
struct nats_consumer_message {
    uint64_t sequence;
    char *subject;
    char *msg_id;  /* Nats-Msg-Id, NULL when absent */
    int64_t job_id; /* the Outbox-Job-Id header, -1 when absent */
    char *body;
    char *headers; /* every header as "Name: value\n" lines */
};

/*
 * Reads every message stream holds into *messages (count in *count; free
 * with nats_consumer_messages_free). 0, or -1.
 */
int nats_consumer_read(nats_consumer *c, const char *stream, struct nats_consumer_message **messages,
                       size_t *count);
void nats_consumer_messages_free(struct nats_consumer_message *messages, size_t count);

/* Copies the name of the server leading stream ("n2") into out; 0, or -1 when none is known. */
int nats_consumer_stream_leader(nats_consumer *c, const char *stream, char *out, size_t size);

/* The number of messages stream holds, or -1. */
long long nats_consumer_stream_count(nats_consumer *c, const char *stream);

#endif
