/*
 * sink_amqp.c - the RabbitMQ sink: publish with publisher confirms.
 *
 * One connection, one channel in confirm mode. A batch is published in
 * windows (frames that already arrived are handled between windows without
 * blocking), then the sink reads frames itself until every published
 * message is settled, or io_timeout_ms passes without a frame from the broker:
 *
 *   basic.ack      accepted, unless a basic.return for it came first
 *   basic.nack     failed
 *   basic.return   the message was unroutable (mandatory): failed, even
 *                  though the broker acks it afterwards
 *   channel.close  one message caused it (RabbitMQ closes the channel on a
 *                  publish it refuses, e.g. 406 over max_message_size, 404
 *                  for a missing exchange): that message fails with the
 *                  broker's text, the channel is reopened and every other
 *                  unsettled message is published again in the same call
 *                  (their confirms died with the channel; at least once).
 *                  The culprit is the message whose size the 406 names (the
 *                  size limit is learned and applied before publishing from
 *                  then on, for the life of the connection); for any other
 *                  text the rest is published one message at a time, each
 *                  waiting for its confirm, so the next close names its
 *                  message
 *   connection.close, socket error, heartbeat timeout, confirm timeout
 *                  no message's fault: every unsettled message is deferred
 *                  (given back without spending an attempt), the
 *                  connection is torn down and publish returns -1;
 *                  sink_connect() reconnects
 *
 * Delivery tags count publishes on the channel from 1 after confirm.select;
 * the sink keeps that count so each tag maps back to one message.
 *
 * Destination: a message goes to its own exchange (else --exchange)
 * with its own routing key (else its queue). RabbitMQ answers a publish to
 * a missing exchange by closing the channel, and finding the culprit then
 * takes republishing the window one message at a time (channel.close
 * above); so before a batch is published, every named exchange the
 * connection has not seen yet is looked up with a passive exchange.declare. A missing one fails just its messages with the broker's
 * text ("404 NOT_FOUND - no exchange ...") and the channel is reopened for
 * the rest. Exchanges found are remembered for the life of the connection
 * (at most SINK_AMQP_KNOWN_EXCHANGES names; any channel close forgets them,
 * since an exchange deleted later closes the channel on the next publish).
 *
 * Heartbeats: options.heartbeat_seconds as given, 0 disables them (see
 * sink.h); the relay passes TIMEOUT_BROKER_HEARTBEAT_SECONDS.
 *
 * TLS (amqps://): peer certificate and host name are verified unless
 * --tls-verify is no, against the CA file named by SSL_CERT_FILE
 * or else the system bundle /etc/ssl/certs/ca-certificates.crt.
 */
#include "sink_internal.h"
#include "sink_amqp.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "clock.h"
#include "error.h"
#include "json.h"

#define SINK_AMQP_CHANNEL 1
#define SINK_AMQP_FRAME_MAX 131072
/* Publishes between two non-blocking looks at what the broker sent back. */
#define SINK_AMQP_WINDOW 256
/* The polite close at disconnect waits at most this long per step. */
#define SINK_AMQP_CLOSE_TIMEOUT_MS 2000
#define SINK_AMQP_ATTEMPT_HEADER "x-outbox-attempt"
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

static struct timeval
timeval_from_ms(int64_t ms)
{
    struct timeval tv;

    if (ms < 0)
        ms = 0;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000 * 1000);
    return tv;
}

/* Forgets which exchanges exist (new connection, or the channel was closed). */
static void
forget_exchanges(struct sink_amqp *impl)
{
    for (size_t i = 0; i < impl->known_count; i++)
        free(impl->known_exchanges[i]);
    impl->known_count = 0;
}

/* Frees the connection without talking to the broker and marks the sink disconnected. */
static void
drop_connection(sink *s)
{
    struct sink_amqp *impl = s->impl;

    forget_exchanges(impl);
    if (impl->conn != NULL)
        amqp_destroy_connection(impl->conn);
    impl->conn = NULL;
    impl->channel_open = false;
    s->connected = false;
}

/* Describes a failed RPC reply as text ("404 NOT_FOUND - ...", a library error). */
static void
describe_reply(amqp_rpc_reply_t reply, char *text, size_t size)
{
    switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        snprintf(text, size, "no error");
        break;
    case AMQP_RESPONSE_NONE:
        snprintf(text, size, "no reply from the broker");
        break;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(text, size, "%s", amqp_error_string2(reply.library_error));
        break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            const amqp_connection_close_t *close = reply.reply.decoded;

            snprintf(text, size, "%u %.*s", close->reply_code, (int)close->reply_text.len,
                     (const char *)close->reply_text.bytes);
        } else if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            const amqp_channel_close_t *close = reply.reply.decoded;

            snprintf(text, size, "%u %.*s", close->reply_code, (int)close->reply_text.len,
                     (const char *)close->reply_text.bytes);
        } else {
            snprintf(text, size, "unexpected method 0x%08x from the broker", reply.reply.id);
        }
        break;
    }
}

/* Opens the channel and puts it in confirm mode; the tag count starts over. */
static int
open_channel(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    amqp_rpc_reply_t reply;
    char text[256];

    amqp_channel_open(impl->conn, SINK_AMQP_CHANNEL);
    reply = amqp_get_rpc_reply(impl->conn);
    if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
        amqp_confirm_select(impl->conn, SINK_AMQP_CHANNEL);
        reply = amqp_get_rpc_reply(impl->conn);
    }
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        describe_reply(reply, text, sizeof(text));
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                "unable to open a confirm channel on %s: %s",
                                sink_target(s), text);
    }
    impl->channel_open = true;
    impl->next_tag = 1;
    return 0;
}

/*
 * librabbitmq trusts no CA by itself: load the OpenSSL-conventional
 * SSL_CERT_FILE when set, else the system bundle.
 */
static int
load_ca_bundle(sink *s, amqp_socket_t *socket, struct outbox_error *err)
{
    const char *ca_file = getenv("SSL_CERT_FILE");

    if (ca_file == NULL || ca_file[0] == '\0')
        ca_file = SINK_AMQP_SYSTEM_CA_FILE;
    if (amqp_ssl_socket_set_cacert(socket, ca_file) != AMQP_STATUS_OK)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "unable to load ca certificates from '%s' for %s", ca_file,
                                sink_target(s));
    return 0;
}

static int
sink_amqp_init(sink *s, const void *options, struct outbox_error *err)
{
    const struct sink_amqp_config *config = options;
    const char *exchange = config->exchange != NULL ? config->exchange : "";
    struct sink_amqp *impl;

    if (strlen(exchange) > SINK_AMQP_SHORTSTR_MAX)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--exchange: longer than %d bytes (%zu)",
                                SINK_AMQP_SHORTSTR_MAX, strlen(exchange));
    impl = calloc(1, sizeof(*impl));
    if (impl == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->impl = impl;
    impl->exchange = strdup(exchange);
    if (impl->exchange == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    impl->tls_verify = config->tls_verify;
    return 0;
}

static int
sink_amqp_connect(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    amqp_socket_t *socket;
    struct timeval connect_timeout = timeval_from_ms(s->options.connect_timeout_ms);
    struct timeval rpc_timeout = timeval_from_ms(s->options.io_timeout_ms);
    amqp_rpc_reply_t reply;
    char text[256];
    int rc;

    impl->broker_max_bytes = 0; /* learned again on this connection if need be */
    impl->conn = amqp_new_connection();
    if (impl->conn == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (s->url.scheme->tls) {
        socket = amqp_ssl_socket_new(impl->conn);
        if (socket != NULL) {
            amqp_ssl_socket_set_verify_peer(socket, impl->tls_verify);
            amqp_ssl_socket_set_verify_hostname(socket, impl->tls_verify);
            if (impl->tls_verify && load_ca_bundle(s, socket, err) != 0)
                goto fail;
        }
    } else {
        socket = amqp_tcp_socket_new(impl->conn);
    }
    if (socket == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to create a socket for %s",
                         sink_target(s));
        goto fail;
    }
    rc = amqp_socket_open_noblock(socket, s->url.endpoints[s->endpoint].host,
                                  s->url.endpoints[s->endpoint].port, &connect_timeout);
    if (rc != AMQP_STATUS_OK) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to connect to %s: %s",
                         sink_target(s), amqp_error_string2(rc));
        goto fail;
    }
    amqp_set_handshake_timeout(impl->conn, &connect_timeout);
    amqp_set_rpc_timeout(impl->conn, &rpc_timeout);
    reply = amqp_login(impl->conn, s->url.vhost, 0, SINK_AMQP_FRAME_MAX,
                       s->options.heartbeat_seconds > 0 ? s->options.heartbeat_seconds : 0,
                       AMQP_SASL_METHOD_PLAIN, s->url.user, s->url.password);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        describe_reply(reply, text, sizeof(text));
        /* The broker answers a refused login or a missing vhost with connection.close. */
        if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
            reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            amqp_connection_close_ok_t close_ok = {0};

            amqp_send_method(impl->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &close_ok);
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "unable to log in to %s as '%s': %s",
                             sink_target(s), s->url.user, text);
        } else {
            outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to log in to %s as '%s': %s",
                             sink_target(s), s->url.user, text);
        }
        goto fail;
    }
    if (open_channel(s, err) != 0)
        goto fail;
    s->connected = true;
    return 0;

fail:
    drop_connection(s);
    return -1;
}

/* Marks message i settled and keeps the count of unsettled ones. */
static void
settle(struct batch *batch, size_t i, bool acked)
{
    if (batch->states[i] == MESSAGE_IN_FLIGHT) {
        if (acked)
            sink_outcome_set(&batch->outcomes[i], SINK_ACCEPTED, NULL);
        else
            sink_outcome_set(&batch->outcomes[i], SINK_FAILED, "nacked by the broker");
    } else if (batch->states[i] != MESSAGE_RETURNED) {
        return;
    }
    batch->states[i] = MESSAGE_SETTLED;
    batch->unsettled--;
}

/* Applies a basic.ack or basic.nack for delivery_tag (and all before it when multiple). */
static void
settle_tags(struct batch *batch, uint64_t delivery_tag, bool multiple, bool acked)
{
    uint64_t end = batch->base_tag + batch->sent; /* one past our last tag */

    if (multiple && delivery_tag == 0)
        delivery_tag = end - 1;
    if (delivery_tag < batch->base_tag || delivery_tag >= end)
        return; /* not from this batch */
    if (!multiple) {
        settle(batch, batch->index_of_tag[delivery_tag - batch->base_tag], acked);
    } else {
        size_t last = (size_t)(delivery_tag - batch->base_tag);

        for (size_t k = batch->settled_below; k <= last; k++)
            settle(batch, batch->index_of_tag[k], acked);
    }
    while (batch->settled_below < batch->sent &&
           batch->states[batch->index_of_tag[batch->settled_below]] == MESSAGE_SETTLED)
        batch->settled_below++;
}

/*
 * Defers every published, unsettled message and every unsent one with
 * reason: the connection failed them, not their content. A returned message
 * keeps its own failure (unroutable).
 */
static void
defer_unsettled(struct batch *batch, const char *reason)
{
    for (size_t i = 0; i < batch->count; i++) {
        switch (batch->states[i]) {
        case MESSAGE_IN_FLIGHT:
            sink_outcome_set(&batch->outcomes[i], SINK_DEFERRED, "%s", reason);
            break;
        case MESSAGE_NOT_SENT:
            sink_outcome_set(&batch->outcomes[i], SINK_DEFERRED, "not published: %s", reason);
            break;
        default:
            break;
        }
        if (batch->states[i] != MESSAGE_SETTLED)
            batch->states[i] = MESSAGE_SETTLED;
    }
    batch->unsettled = 0;
}

/*
 * Reads the content of a basic.return and fails the message it names (by
 * message_id) as unroutable.
 */
static enum frame_result
handle_return(sink *s, struct batch *batch, const amqp_basic_return_t *returned,
              amqp_channel_t channel, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    char reason[SINK_REASON_MAX];
    char id_text[32];
    amqp_message_t message;
    amqp_rpc_reply_t reply;
    char text[256];

    /* Copy the reply before reading on: the frame's memory is the library's. */
    snprintf(reason, sizeof(reason), "unroutable: %u %.*s", returned->reply_code,
             (int)returned->reply_text.len, (const char *)returned->reply_text.bytes);
    reply = amqp_read_message(impl->conn, channel, &message, 0);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        describe_reply(reply, text, sizeof(text));
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                         sink_target(s), text);
        return FRAME_CONNECTION_LOST;
    }
    if (batch != NULL && (message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) &&
        message.properties.message_id.len < sizeof(id_text)) {
        char *end;
        long long job_id;

        memcpy(id_text, message.properties.message_id.bytes, message.properties.message_id.len);
        id_text[message.properties.message_id.len] = '\0';
        job_id = strtoll(id_text, &end, 10);
        if (*end == '\0' && end != id_text) {
            for (size_t k = batch->settled_below; k < batch->sent; k++) {
                size_t i = batch->index_of_tag[k];

                if (batch->states[i] == MESSAGE_IN_FLIGHT &&
                    batch->messages[i].job_id == (int64_t)job_id) {
                    sink_outcome_set(&batch->outcomes[i], SINK_FAILED, "%s", reason);
                    batch->states[i] = MESSAGE_RETURNED;
                    break;
                }
            }
        }
    }
    amqp_destroy_message(&message);
    return FRAME_HANDLED;
}

/*
 * Handles one frame from the broker. batch is NULL while idle: confirms and
 * returns then belong to nobody and are dropped.
 */
static enum frame_result
handle_frame(sink *s, struct batch *batch, const amqp_frame_t *frame, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;

    if (frame->frame_type != AMQP_FRAME_METHOD)
        return FRAME_HANDLED; /* stray content; heartbeats never get here */
    switch (frame->payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
        const amqp_basic_ack_t *ack = frame->payload.method.decoded;

        if (batch != NULL)
            settle_tags(batch, ack->delivery_tag, ack->multiple, true);
        return FRAME_HANDLED;
    }
    case AMQP_BASIC_NACK_METHOD: {
        const amqp_basic_nack_t *nack = frame->payload.method.decoded;

        if (batch != NULL)
            settle_tags(batch, nack->delivery_tag, nack->multiple, false);
        return FRAME_HANDLED;
    }
    case AMQP_BASIC_RETURN_METHOD:
        return handle_return(s, batch, frame->payload.method.decoded, frame->channel, err);
    case AMQP_CHANNEL_CLOSE_METHOD: {
        const amqp_channel_close_t *close = frame->payload.method.decoded;
        amqp_channel_close_ok_t close_ok = {0};
        char reason[SINK_REASON_MAX];

        snprintf(reason, sizeof(reason), "channel closed by the broker: %u %.*s",
                 close->reply_code, (int)close->reply_text.len,
                 (const char *)close->reply_text.bytes);
        impl->channel_open = false;
        forget_exchanges(impl);
        if (batch != NULL) {
            /* who caused it is worked out once the round stops (blame_channel_close) */
            batch->channel_closed = true;
            snprintf(batch->close_text, sizeof(batch->close_text), "%u %.*s", close->reply_code,
                     (int)close->reply_text.len, (const char *)close->reply_text.bytes);
        }
        if (amqp_send_method(impl->conn, frame->channel, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &close_ok) != AMQP_STATUS_OK) {
            outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                             sink_target(s), reason);
            return FRAME_CONNECTION_LOST;
        }
        return FRAME_CHANNEL_CLOSED;
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
        const amqp_connection_close_t *close = frame->payload.method.decoded;
        amqp_connection_close_ok_t close_ok = {0};

        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s closed by the broker: %u %.*s",
                         sink_target(s), close->reply_code, (int)close->reply_text.len,
                         (const char *)close->reply_text.bytes);
        amqp_send_method(impl->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &close_ok);
        return FRAME_CONNECTION_LOST;
    }
    default:
        /* connection.blocked/unblocked, channel.flow and the like: nothing to do. */
        return FRAME_HANDLED;
    }
}

/*
 * Waits up to timeout_ms (0: only what already arrived) for one frame and
 * handles it. Returns 1 when a frame was handled, 0 when none came, or the
 * negative of a frame_result otherwise.
 */
static int
read_one_frame(sink *s, struct batch *batch, int64_t timeout_ms, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    struct timeval tv = timeval_from_ms(timeout_ms);
    amqp_frame_t frame;
    enum frame_result result;
    int rc;

    amqp_maybe_release_buffers(impl->conn);
    rc = amqp_simple_wait_frame_noblock(impl->conn, &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT)
        return 0;
    if (rc != AMQP_STATUS_OK) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                         sink_target(s), amqp_error_string2(rc));
        return -FRAME_CONNECTION_LOST;
    }
    result = handle_frame(s, batch, &frame, err);
    return result == FRAME_HANDLED ? 1 : -(int)result;
}

/* The exchange a message goes to: its own, else the sink's. */
static const char *
message_exchange(const sink *s, const struct sink_message *message)
{
    const struct sink_amqp *impl = s->impl;

    return message->exchange != NULL ? message->exchange : impl->exchange;
}

/* The routing key of a message: its own, else its queue. */
static const char *
message_routing_key(const struct sink_message *message)
{
    return message->routing_key != NULL ? message->routing_key : message->queue;
}

/*
 * Checks that a message can be published as is: 0 with headers filled (the
 * caller clears them), or -1 with the outcome set to SINK_REJECTED and why.
 */
static int
check_message(sink *s, const struct sink_message *message, struct json_string_object *headers,
              struct sink_outcome *outcome)
{
    struct sink_amqp *impl = s->impl;
    struct outbox_error parse_error = {0};
    const char *header_text = message->headers != NULL ? message->headers : "";
    size_t header_bytes = 0;

    memset(headers, 0, sizeof(*headers));
    if ((int64_t)message->payload_len > s->options.max_message_bytes) {
        sink_outcome_set(outcome, SINK_REJECTED,
                         "message of %zu bytes exceeds the limit of %" PRId64 " bytes",
                         message->payload_len, s->options.max_message_bytes);
        return -1;
    }
    if (impl->broker_max_bytes > 0 && message->payload_len > impl->broker_max_bytes) {
        sink_outcome_set(outcome, SINK_REJECTED,
                         "message of %zu bytes exceeds the broker's limit of %zu bytes"
                         " (max_message_size)",
                         message->payload_len, impl->broker_max_bytes);
        return -1;
    }
    if (strlen(message_routing_key(message)) > SINK_AMQP_SHORTSTR_MAX ||
        strlen(message_exchange(s, message)) > SINK_AMQP_SHORTSTR_MAX) {
        sink_outcome_set(outcome, SINK_REJECTED, "routing key or exchange longer than %d bytes",
                         SINK_AMQP_SHORTSTR_MAX);
        return -1;
    }
    if (header_text[0] != '\0' &&
        json_parse_string_object(header_text, strlen(header_text), headers, &parse_error) != 0) {
        sink_outcome_set(outcome, SINK_REJECTED, "invalid headers: %s", parse_error.message);
        return -1;
    }
    for (size_t i = 0; i < headers->count; i++) {
        if (headers->members[i].key_len > SINK_AMQP_SHORTSTR_MAX) {
            sink_outcome_set(outcome, SINK_REJECTED, "header name longer than %d bytes",
                             SINK_AMQP_SHORTSTR_MAX);
            goto fail;
        }
        header_bytes += 1 + headers->members[i].key_len + 1 + 4 + headers->members[i].value_len;
    }
    /*
     * The properties go in one header frame, which the library cannot split:
     * headers plus the fixed properties (under 600 bytes) must fit in it.
     */
    if (header_bytes + 1024 > (size_t)amqp_get_frame_max(impl->conn)) {
        sink_outcome_set(outcome, SINK_REJECTED,
                         "headers of %zu bytes do not fit in an amqp frame of %d bytes",
                         header_bytes, amqp_get_frame_max(impl->conn));
        goto fail;
    }
    return 0;

fail:
    json_string_object_clear(headers);
    return -1;
}

/* Publishes message i of the batch; -1 only when the connection failed. */
static int
publish_one(sink *s, struct batch *batch, size_t i, const struct json_string_object *headers,
            struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    const struct sink_message *message = &batch->messages[i];
    amqp_basic_properties_t props;
    char message_id[32];
    size_t entry_count = 0;
    int rc;

    if (impl->entries_capacity < headers->count + 1) {
        size_t capacity = headers->count + 16;
        amqp_table_entry_t *entries = realloc(impl->entries, capacity * sizeof(*entries));

        if (entries == NULL) {
            sink_outcome_set(&batch->outcomes[i], SINK_FAILED, "out of memory");
            return 0;
        }
        impl->entries = entries;
        impl->entries_capacity = capacity;
    }
    for (size_t h = 0; h < headers->count; h++) {
        amqp_table_entry_t *entry;

        if (headers->members[h].key_len == strlen(SINK_AMQP_ATTEMPT_HEADER) &&
            memcmp(headers->members[h].key, SINK_AMQP_ATTEMPT_HEADER, headers->members[h].key_len) == 0)
            continue; /* ours wins */
        entry = &impl->entries[entry_count++];
        entry->key.bytes = (void *)headers->members[h].key;
        entry->key.len = headers->members[h].key_len;
        entry->value.kind = AMQP_FIELD_KIND_UTF8;
        entry->value.value.bytes.bytes = (void *)headers->members[h].value;
        entry->value.value.bytes.len = headers->members[h].value_len;
    }
    impl->entries[entry_count].key = amqp_cstring_bytes(SINK_AMQP_ATTEMPT_HEADER);
    impl->entries[entry_count].value.kind = AMQP_FIELD_KIND_I32;
    impl->entries[entry_count].value.value.i32 = message->attempt;
    entry_count++;

    snprintf(message_id, sizeof(message_id), "%" PRId64, message->job_id);
    memset(&props, 0, sizeof(props));
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_TYPE_FLAG |
                   AMQP_BASIC_HEADERS_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = 2;
    props.message_id = amqp_cstring_bytes(message_id);
    /* a created_at out of range (an infinite time written by hand) sends no timestamp */
    props.timestamp =
        message->created_at > 0 && message->created_at < 1e18 ? (uint64_t)message->created_at : 0;
    props.type = amqp_cstring_bytes(message->queue);
    props.headers.num_entries = (int)entry_count;
    props.headers.entries = impl->entries;

    rc = amqp_basic_publish(impl->conn, SINK_AMQP_CHANNEL,
                            amqp_cstring_bytes(message_exchange(s, message)),
                            amqp_cstring_bytes(message_routing_key(message)), 1, 0, &props,
                            (amqp_bytes_t){.len = message->payload_len,
                                           .bytes = (void *)message->payload});
    if (rc != AMQP_STATUS_OK) {
        /* Frames may be half written: the connection cannot be trusted any more. */
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                         sink_target(s), amqp_error_string2(rc));
        return -1;
    }
    batch->states[i] = MESSAGE_IN_FLIGHT;
    batch->index_of_tag[batch->sent++] = i;
    batch->unsettled++;
    impl->next_tag++;
    return 0;
}

/*
 * Handles every frame that already arrived, without blocking. Returns 0, or
 * the negative frame_result that stopped it.
 */
static int
drain_arrived(sink *s, struct batch *batch, struct outbox_error *err)
{
    int rc;

    while ((rc = read_one_frame(s, batch, 0, err)) > 0)
        ;
    return rc;
}

/* True when the connection has already found this exchange. */
static bool
exchange_known(const struct sink_amqp *impl, const char *exchange)
{
    for (size_t i = 0; i < impl->known_count; i++)
        if (strcmp(impl->known_exchanges[i], exchange) == 0)
            return true;
    return false;
}

static void
remember_exchange(struct sink_amqp *impl, const char *exchange)
{
    char *copy;

    if (impl->known_count == SINK_AMQP_KNOWN_EXCHANGES)
        forget_exchanges(impl);
    copy = strdup(exchange);
    if (copy != NULL) /* out of memory: looked up again next time */
        impl->known_exchanges[impl->known_count++] = copy;
}

/*
 * Looks up, with a passive exchange.declare, every exchange the batch names
 * that the connection has not found yet (see the top of the file). The
 * messages to an exchange the broker refuses are settled as failed with its
 * text, and the channel it closed is opened again. Returns -1 only when the
 * connection failed (err filled).
 */
static int
verify_exchanges(sink *s, struct batch *batch, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    const char *previous = ""; /* the last one found: batches mostly name one exchange */

    for (size_t i = 0; i < batch->count; i++) {
        const char *exchange = message_exchange(s, &batch->messages[i]);
        amqp_channel_close_ok_t close_ok = {0};
        amqp_rpc_reply_t reply;
        char text[SINK_REASON_MAX - 64];

        /*
         * "" is the default exchange: it always exists and RabbitMQ refuses
         * any declare of it, passive too (403), so it is never checked. Too
         * long is refused later.
         */
        if (exchange[0] == '\0' || strcmp(exchange, previous) == 0 ||
            batch->states[i] == MESSAGE_SETTLED || strlen(exchange) > SINK_AMQP_SHORTSTR_MAX)
            continue;
        if (exchange_known(impl, exchange)) {
            previous = exchange;
            continue;
        }
        amqp_exchange_declare(impl->conn, SINK_AMQP_CHANNEL, amqp_cstring_bytes(exchange),
                              amqp_cstring_bytes("direct"), 1, 0, 0, 0, amqp_empty_table);
        reply = amqp_get_rpc_reply(impl->conn);
        if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
            remember_exchange(impl, exchange);
            previous = exchange;
            continue;
        }
        describe_reply(reply, text, sizeof(text));
        if (reply.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION ||
            reply.reply.id != AMQP_CHANNEL_CLOSE_METHOD) {
            if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION) {
                amqp_connection_close_ok_t connection_close_ok = {0};

                amqp_send_method(impl->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
                                 &connection_close_ok);
            }
            return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                                    sink_display_url(s), text);
        }
        /* the broker refused the exchange (404 missing, 403 not allowed) and closed the channel */
        impl->channel_open = false;
        if (amqp_send_method(impl->conn, SINK_AMQP_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &close_ok) != AMQP_STATUS_OK)
            return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                                    sink_display_url(s), text);
        for (size_t j = i; j < batch->count; j++) {
            if (batch->states[j] != MESSAGE_SETTLED &&
                strcmp(message_exchange(s, &batch->messages[j]), exchange) == 0) {
                sink_outcome_set(&batch->outcomes[j], SINK_FAILED,
                                 "channel closed by the broker: %s", text);
                batch->states[j] = MESSAGE_SETTLED;
            }
        }
        if (open_channel(s, err) != 0)
            return -1;
    }
    return 0;
}

/* How one round of publishing ended. */
enum round_result {
    ROUND_DONE = 0,       /* every message of the round settled */
    ROUND_CHANNEL_CLOSED, /* the broker closed the channel; close_text says why */
    ROUND_LOST,           /* connection lost or no confirm in time: err filled, all deferred */
};

/*
 * Waits until every published message of the round is settled, the channel
 * closes, or the broker stays silent for io_timeout_ms.
 */
static enum round_result
wait_settled(sink *s, struct batch *batch, struct outbox_error *err)
{
    int64_t deadline = clock_monotonic_ms() + s->options.io_timeout_ms;

    while (batch->unsettled > 0 && !batch->channel_closed) {
        int64_t left = deadline - clock_monotonic_ms();
        int got;

        if (left <= 0) {
            char reason[SINK_REASON_MAX];

            snprintf(reason, sizeof(reason), "no publisher confirm from the broker within %d ms",
                     s->options.io_timeout_ms);
            outbox_error_set(err, OUTBOX_ERR_TIMEOUT, "%s at %s", reason, sink_target(s));
            return ROUND_LOST;
        }
        got = read_one_frame(s, batch, left, err);
        if (got == -FRAME_CONNECTION_LOST)
            return ROUND_LOST;
        /* the broker is answering: a large batch gets as long as it keeps making progress */
        if (got == 1)
            deadline = clock_monotonic_ms() + s->options.io_timeout_ms;
    }
    return batch->channel_closed ? ROUND_CHANNEL_CLOSED : ROUND_DONE;
}

/*
 * Publishes every message of the batch still to be published: all in
 * windows, or one_at_a_time, each waiting for its confirm before the next.
 * Delivery tags start over with the round (a fresh channel after a close).
 */
static enum round_result
publish_round(sink *s, struct batch *batch, bool one_at_a_time, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;

    batch->base_tag = impl->next_tag;
    batch->sent = batch->settled_below = batch->unsettled = 0;
    batch->channel_closed = false;
    for (size_t i = 0; i < batch->count && !batch->channel_closed; i++) {
        struct json_string_object headers;
        int published;

        if (batch->states[i] != MESSAGE_NOT_SENT)
            continue;
        if (check_message(s, &batch->messages[i], &headers, &batch->outcomes[i]) != 0) {
            batch->states[i] = MESSAGE_SETTLED;
            continue;
        }
        published = publish_one(s, batch, i, &headers, err);
        json_string_object_clear(&headers);
        if (published != 0)
            return ROUND_LOST;
        if (one_at_a_time) {
            enum round_result result = wait_settled(s, batch, err);

            if (result != ROUND_DONE)
                return result;
        } else if (batch->sent % SINK_AMQP_WINDOW == 0 &&
                   drain_arrived(s, batch, err) == -FRAME_CONNECTION_LOST) {
            return ROUND_LOST;
        }
    }
    return wait_settled(s, batch, err);
}

/*
 * The size a RabbitMQ 406 names, from "406 PRECONDITION_FAILED - message
 * size 2097152 is larger than configured max size 1048576"; false for any
 * other text.
 */
static bool
parse_size_refusal(const char *text, size_t *size, size_t *limit)
{
    const char *at = strstr(text, "message size ");
    unsigned long long message_size, max_size;
    int used = 0;

    if (strncmp(text, "406 ", 4) != 0 || at == NULL ||
        sscanf(at, "message size %llu is larger than configured max size %llu%n", &message_size,
               &max_size, &used) != 2 ||
        used == 0 || max_size == 0)
        return false;
    *size = (size_t)message_size;
    *limit = (size_t)max_size;
    return true;
}

/*
 * After the broker closed the channel in a round: fails the message that
 * caused it, and makes every other unsettled message ready to be published
 * again. Returns whether the rest must go one at a time to find the culprit
 * (the text named no message, and more than one was in flight).
 */
static bool
blame_channel_close(sink *s, struct batch *batch, bool one_at_a_time)
{
    struct sink_amqp *impl = s->impl;
    size_t size = 0, limit = 0, in_flight = 0, blamed = 0;
    bool sized = parse_size_refusal(batch->close_text, &size, &limit);

    if (sized && (impl->broker_max_bytes == 0 || limit < impl->broker_max_bytes))
        impl->broker_max_bytes = limit;
    for (size_t i = 0; i < batch->count; i++)
        if (batch->states[i] == MESSAGE_IN_FLIGHT)
            in_flight++;
    for (size_t i = 0; i < batch->count; i++) {
        bool culprit;

        if (batch->states[i] == MESSAGE_RETURNED) {
            batch->states[i] = MESSAGE_SETTLED; /* unroutable: its own failure stands */
            continue;
        }
        if (batch->states[i] != MESSAGE_IN_FLIGHT)
            continue;
        /* alone in flight it can only be this one; else the size the 406 names */
        culprit = one_at_a_time || in_flight == 1 ||
                  (sized && batch->messages[i].payload_len == size);
        if (culprit) {
            /* a size refusal will not change by retrying; other refusals might */
            sink_outcome_set(&batch->outcomes[i], sized ? SINK_REJECTED : SINK_FAILED,
                             "channel closed by the broker: %s", batch->close_text);
            batch->states[i] = MESSAGE_SETTLED;
            blamed++;
        } else {
            /* its confirm died with the channel: publish it again (at least once) */
            sink_outcome_set(&batch->outcomes[i], SINK_DEFERRED, "not published: channel closed");
            batch->states[i] = MESSAGE_NOT_SENT;
        }
    }
    batch->unsettled = 0;
    return blamed == 0;
}

static int
sink_amqp_publish(sink *s, const struct sink_message *messages, size_t count,
                  struct sink_outcome *outcomes, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    struct batch batch = {.messages = messages, .outcomes = outcomes, .count = count};
    bool one_at_a_time = false;
    int rc = 0;

    for (size_t i = 0; i < count; i++)
        sink_outcome_set(&outcomes[i], SINK_DEFERRED, "not published");
    if (count == 0)
        return 0;
    batch.states = calloc(count, sizeof(*batch.states));
    batch.index_of_tag = calloc(count, sizeof(*batch.index_of_tag));
    if (batch.states == NULL || batch.index_of_tag == NULL) {
        rc = outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    if (!impl->channel_open && open_channel(s, err) != 0)
        goto lost;
    if (verify_exchanges(s, &batch, err) != 0)
        goto lost;

    /*
     * Every round but the last ends in a channel close that settles at least
     * one message (its culprit) or switches to one at a time, whose next
     * close always names one: at most count + 1 rounds.
     */
    for (size_t round = 0; round <= count + 1; round++) {
        enum round_result result = publish_round(s, &batch, one_at_a_time, err);

        if (result == ROUND_LOST)
            goto lost;
        if (result == ROUND_DONE)
            goto cleanup;
        if (blame_channel_close(s, &batch, one_at_a_time))
            one_at_a_time = true;
        if (open_channel(s, err) != 0)
            goto lost;
    }
    defer_unsettled(&batch, "the broker kept closing the channel");
    goto cleanup;

lost:
    defer_unsettled(&batch, err->message);
    drop_connection(s);
    rc = -1;

cleanup:
    free(batch.states);
    free(batch.index_of_tag);
    return rc;
}

static int
sink_amqp_idle(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;

    /* Bounded: a handful of stray frames at most, then heartbeats are serviced. */
    for (int i = 0; i < 1000; i++) {
        int rc = read_one_frame(s, NULL, 0, err);

        if (rc == 0)
            break;
        if (rc == -FRAME_CONNECTION_LOST) {
            drop_connection(s);
            return -1;
        }
    }
    if (!impl->channel_open && open_channel(s, err) != 0) {
        drop_connection(s);
        return -1;
    }
    return 0;
}

/*
 * A passive declare of the exchange: the broker answers declare-ok, or
 * closes the channel with 404 NOT_FOUND. Publishing to a missing exchange
 * would close the channel on every batch.
 */
static int
sink_amqp_check(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    amqp_rpc_reply_t reply;
    char text[256], quoted[SINK_AMQP_SHORTSTR_MAX + 1];

    if (impl->exchange[0] == '\0')
        return 0;
    amqp_exchange_declare(impl->conn, SINK_AMQP_CHANNEL, amqp_cstring_bytes(impl->exchange),
                          amqp_cstring_bytes("direct"), 1, 0, 0, 0, amqp_empty_table);
    reply = amqp_get_rpc_reply(impl->conn);
    if (reply.reply_type == AMQP_RESPONSE_NORMAL)
        return 0;
    describe_reply(reply, text, sizeof(text));
    outbox_error_quote(quoted, sizeof(quoted), impl->exchange);
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
        ((const amqp_channel_close_t *)reply.reply.decoded)->reply_code == AMQP_NOT_FOUND) {
        amqp_channel_close_ok_t close_ok = {0};

        amqp_send_method(impl->conn, SINK_AMQP_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok);
        impl->channel_open = false;
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "--exchange: exchange '%s' not found on %s: %s",
                         quoted, sink_display_url(s), text);
    } else {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to look up exchange '%s' on %s: %s",
                         quoted, sink_display_url(s), text);
    }
    drop_connection(s);
    return -1;
}

static void
sink_amqp_disconnect(sink *s)
{
    struct sink_amqp *impl = s->impl;
    struct timeval close_timeout = timeval_from_ms(SINK_AMQP_CLOSE_TIMEOUT_MS);

    if (impl->conn != NULL) {
        amqp_set_rpc_timeout(impl->conn, &close_timeout);
        if (impl->channel_open)
            amqp_channel_close(impl->conn, SINK_AMQP_CHANNEL, AMQP_REPLY_SUCCESS);
        amqp_connection_close(impl->conn, AMQP_REPLY_SUCCESS);
    }
    drop_connection(s);
}

static void
sink_amqp_destroy(sink *s)
{
    struct sink_amqp *impl = s->impl;

    if (impl == NULL)
        return;
    drop_connection(s);
    free(impl->entries);
    free(impl->exchange);
    free(impl);
    s->impl = NULL;
}

static const struct sink_ops sink_amqp_ops = {
    .init = sink_amqp_init,
    .connect = sink_amqp_connect,
    .publish = sink_amqp_publish,
    .idle = sink_amqp_idle,
    .check = sink_amqp_check,
    .disconnect = sink_amqp_disconnect,
    .destroy = sink_amqp_destroy,
    .endpoint_alternatives = true,
};

/* ---- registry row --------------------------------------------------------- */

static const struct url_scheme sink_amqp_scheme = {
    .name = "amqp",
    .usage = "amqp://user:pass@host:port[,host2:port2...]/vhost",
    .default_port = 5672,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .path = URL_PATH_VHOST,
    .default_user = "guest",
    .default_password = "guest",
};

static const struct url_scheme sink_amqps_scheme = {
    .name = "amqps",
    .usage = "amqps://...",
    .default_port = 5671,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .path = URL_PATH_VHOST,
    .default_user = "guest",
    .default_password = "guest",
    .tls = true,
};

static const struct url_scheme *const sink_amqp_schemes[] = {&sink_amqp_scheme, &sink_amqps_scheme,
                                                             NULL};

static const struct option_spec sink_amqp_options[] = {
    {"exchange", "NAME", OPTION_STRING, OPTION_FIELD(struct sink_amqp_config, exchange), "", 0, 0, NULL,
     "AMQP exchange of rows without their own (default: the default exchange)",
     OPTION_FROM_ENVIRONMENT, SINK_AMQP_SHORTSTR_MAX},
    {"tls-verify", "yes|no", OPTION_CHOICE, OPTION_FIELD(struct sink_amqp_config, tls_verify), "yes", 0,
     0, "no|yes", "amqps: verify the broker's certificate and host name", OPTION_FROM_ENVIRONMENT,
     0},
};

/* What a sink opened without parsed options uses: the rows' fallbacks. */
static void
sink_amqp_config_defaults(void *config)
{
    ((struct sink_amqp_config *)config)->tls_verify = true;
}

const struct sink_type sink_amqp_type = {
    .kind = "amqp",
    .schemes = sink_amqp_schemes,
    .options = sink_amqp_options,
    .option_count = sizeof(sink_amqp_options) / sizeof(sink_amqp_options[0]),
    .config_size = sizeof(struct sink_amqp_config),
    .config_defaults = sink_amqp_config_defaults,
    .ops = &sink_amqp_ops,
};
