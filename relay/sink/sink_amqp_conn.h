/*
 * sink_amqp_conn.h - the RabbitMQ sink's shared state: the connection and
 * channel, the bookkeeping of the batch being published, and the small
 * connection helpers every file of the sink uses.
 *
 * This is the ground floor of the sink: sink_amqp_conn.c calls nothing of
 * sink_amqp.c, sink_amqp_confirm.c or sink_amqp_publish.c, and only those
 * files include this header.
 */
#ifndef OUTBOX_SINK_AMQP_CONN_H
#define OUTBOX_SINK_AMQP_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <amqp.h>

#include "sink_internal.h"
#include "timeouts.h" /* SINK_AMQP_CLOSE_TIMEOUT_MS */

#define SINK_AMQP_CHANNEL 1
#define SINK_AMQP_FRAME_MAX 131072
/* Publishes between two non-blocking looks at what the broker sent back. */
#define SINK_AMQP_WINDOW 256
#define SINK_AMQP_ATTEMPT_HEADER "x-outbox-attempt"
/* the row's job id (an int64), beside message_id: what a consumer finds the row by */
#define SINK_AMQP_JOB_ID_HEADER "x-outbox-job-id"
#define SINK_AMQP_SHORTSTR_MAX 255
#define SINK_AMQP_SYSTEM_CA_FILE "/etc/ssl/certs/ca-certificates.crt"
/* Exchanges remembered as existing; past this many the list starts over. */
#define SINK_AMQP_KNOWN_EXCHANGES 64

struct sink_amqp {
    amqp_connection_state_t conn; /* NULL when disconnected */
    bool channel_open;            /* SINK_AMQP_CHANNEL is open in confirm mode */
    uint64_t next_tag;            /* delivery tag of the next publish on the channel */
    amqp_table_entry_t *entries; /* scratch for one message's headers */
    size_t entries_capacity;
    char *known_exchanges[SINK_AMQP_KNOWN_EXCHANGES]; /* found by a passive declare */
    size_t known_count;
    size_t broker_max_bytes; /* max_message_size learned from a 406, 0 while unknown */
    char *exchange;          /* --exchange, "" for the default exchange */
    bool tls_verify;         /* --tls-verify */
    int heartbeat_seconds;   /* 0: none */
};

/* Where one message of the batch being published stands. */
enum message_state {
    MESSAGE_NOT_SENT = 0, /* not handed to the broker (yet, or again after a channel close) */
    MESSAGE_IN_FLIGHT,    /* published, waiting for ack or nack */
    MESSAGE_RETURNED,     /* basic.return seen: failed, its ack still to come */
    MESSAGE_SETTLED,      /* outcome final (acked, nacked or rejected locally) */
};

/* The bookkeeping of one sink_publish() call. */
struct batch {
    const struct sink_message *messages;
    struct sink_outcome *outcomes;
    size_t count;
    unsigned char *states;  /* enum message_state per message */
    size_t *index_of_tag;   /* message index of delivery tag base_tag + k */
    uint64_t base_tag;      /* delivery tag of the first publish of this batch */
    size_t sent;            /* tags used so far */
    size_t settled_below;   /* every tag offset below this is settled */
    size_t unsettled;       /* published messages without ack/nack yet */
    bool channel_closed;    /* the broker closed the channel during this round */
    char close_text[SINK_REASON_MAX]; /* its code and text: "406 PRECONDITION_FAILED - ..." */
};

/* Result of handling one incoming frame. */
enum frame_result {
    FRAME_HANDLED = 0,
    FRAME_CHANNEL_CLOSED, /* the broker closed our channel; reasons filled */
    FRAME_CONNECTION_LOST /* err filled; the caller tears down */
};

/* Forgets which exchanges exist (new connection, or the channel was closed). */
void sink_amqp_forget_exchanges(struct sink_amqp *impl);

/* Frees the connection without talking to the broker and marks the sink disconnected. */
void sink_amqp_drop_connection(sink *s);

/* Describes a failed RPC reply as text ("404 NOT_FOUND - ...", a library error). */
void sink_amqp_describe_reply(amqp_rpc_reply_t reply, char *text, size_t size);

/* Opens the channel and puts it in confirm mode; the tag count starts over. */
int sink_amqp_open_channel(sink *s, struct outbox_error *err);

#endif
