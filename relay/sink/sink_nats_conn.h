/*
 * sink_nats_conn.h - the NATS JetStream sink's shared state: the
 * connection, the JetStream context and the batch in flight, which the
 * library's thread settles under lock.
 *
 * Only the sink's files include this header: sink_nats.c (connecting,
 * --check, its ops table and registry row), sink_nats_publish.c (a batch
 * and its acks) and sink_nats_message.c (subjects and messages).
 */
#ifndef OUTBOX_SINK_NATS_CONN_H
#define OUTBOX_SINK_NATS_CONN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nats/nats.h>

#include "sink_internal.h"

/* Where a message of the batch stands. */
enum nats_state {
    NATS_STATE_IDLE = 0, /* not published (rejected before, or never reached) */
    NATS_STATE_PENDING,  /* published, no answer yet */
    NATS_STATE_COVERED,  /* published, no answer yet, and a stream covers its subject */
    NATS_STATE_ANSWERED, /* its outcome is final */
    NATS_STATE_NO_RESPONDERS, /* answered "no responders": no stream, or one without a leader */
};

/* A published message's address and its index in the batch, sorted by address. */
struct nats_slot {
    const natsMsg *message;
    size_t index;
};

struct sink_nats {
    char *subject_prefix;
    char *creds;
    int64_t horizon_ms;
    natsConnection *connection;
    jsCtx *js;
    /*
     * A message went out through js: the library makes its table of pending
     * publishes at the first, and asking for that table before it exists
     * reads a null pointer.
     */
    bool js_published;
    bool windows_checked; /* warn_short_windows() ran at the first connect */
    int64_t max_payload; /* from the server's INFO */
    int64_t last_used_ms;
    /* the batch in flight, shared with the library's thread under lock */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    bool closed;          /* the connection was found closed (no reconnects: it stays so) */
    struct nats_slot *slots;
    size_t slot_count;
    enum nats_state *states;
    struct sink_outcome *outcomes;
    size_t unanswered;
    size_t duplicates; /* acks of the batch with duplicate: true */
    size_t capacity;
    natsMsg **messages;
    char *subject; /* scratch for one subject */
    size_t subject_capacity;
};

#endif
