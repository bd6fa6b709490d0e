/*
 * sink_amqp_confirm.c - what the broker sends back while a batch is
 * published, and what it means for each message.
 *
 * Delivery tags count publishes on the channel from 1 after
 * confirm.select; the batch keeps that count so each tag maps back to one
 * message:
 *
 *   basic.ack      accepted, unless a basic.return for it came first
 *   basic.nack     failed
 *   basic.return   the message was unroutable (mandatory): failed, even
 *                  though the broker acks it afterwards
 *   channel.close  one message caused it: sink_amqp_publish.c finds it and
 *                  publishes the others again
 *   connection.close, socket error, heartbeat timeout
 *                  no message's fault: every unsettled message is deferred
 *                  (given back without spending an attempt) and the
 *                  connection is torn down
 */
#include "sink_amqp_confirm.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "clock.h"
#include "error.h"
#include "json.h"

/* What the broker answered for a message: basic.ack or basic.nack. */
enum broker_answer { ANSWER_ACK, ANSWER_NACK };

/* Marks message i settled and keeps the count of unsettled ones. */
static void
settle(struct batch *batch, size_t i, enum broker_answer answer)
{
    if (batch->states[i] == MESSAGE_IN_FLIGHT) {
        if (answer == ANSWER_ACK)
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
settle_tags(struct batch *batch, uint64_t delivery_tag, bool multiple, enum broker_answer answer)
{
    uint64_t end = batch->base_tag + batch->sent; /* one past our last tag */

    if (multiple && delivery_tag == 0)
        delivery_tag = end - 1;
    if (delivery_tag < batch->base_tag || delivery_tag >= end)
        return; /* not from this batch */
    if (!multiple) {
        settle(batch, batch->index_of_tag[delivery_tag - batch->base_tag], answer);
    } else {
        size_t last = (size_t)(delivery_tag - batch->base_tag);

        for (size_t k = batch->settled_below; k <= last; k++)
            settle(batch, batch->index_of_tag[k], answer);
    }
    while (batch->settled_below < batch->sent &&
           batch->states[batch->index_of_tag[batch->settled_below]] == MESSAGE_SETTLED)
        batch->settled_below++;
}

void
sink_amqp_defer_unsettled(struct batch *batch, const char *reason)
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
    amqp_message_t message;
    amqp_rpc_reply_t reply;
    char text[256];

    /* Copy the reply before reading on: the frame's memory is the library's. */
    snprintf(reason, sizeof(reason), "unroutable: %u %.*s", returned->reply_code,
             (int)returned->reply_text.len, (const char *)returned->reply_text.bytes);
    reply = amqp_read_message(impl->conn, channel, &message, 0);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        sink_amqp_describe_reply(reply, text, sizeof(text));
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                         sink_target(s), text);
        return FRAME_CONNECTION_LOST;
    }
    if (batch != NULL && (message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)) {
        const amqp_bytes_t id = message.properties.message_id;

        for (size_t k = batch->settled_below; k < batch->sent; k++) {
            size_t i = batch->index_of_tag[k];

            if (batch->states[i] == MESSAGE_IN_FLIGHT &&
                strlen(batch->messages[i].message_id) == id.len &&
                memcmp(batch->messages[i].message_id, id.bytes, id.len) == 0) {
                sink_outcome_set(&batch->outcomes[i], SINK_FAILED, "%s", reason);
                batch->states[i] = MESSAGE_RETURNED;
                break;
            }
        }
    }
    amqp_destroy_message(&message);
    return FRAME_HANDLED;
}

/* The broker closed the channel: noted in the batch, and acknowledged. */
static enum frame_result
handle_channel_close(sink *s, struct batch *batch, const amqp_channel_close_t *close,
                     amqp_channel_t channel, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    amqp_channel_close_ok_t close_ok = {0};
    char reason[SINK_REASON_MAX];

    snprintf(reason, sizeof(reason), "channel closed by the broker: %u %.*s", close->reply_code,
             (int)close->reply_text.len, (const char *)close->reply_text.bytes);
    impl->channel_open = false;
    sink_amqp_forget_exchanges(impl);
    if (batch != NULL) {
        /* who caused it is worked out once the round stops (blame_channel_close) */
        batch->channel_closed = true;
        snprintf(batch->close_text, sizeof(batch->close_text), "%u %.*s", close->reply_code,
                 (int)close->reply_text.len, (const char *)close->reply_text.bytes);
    }
    if (amqp_send_method(impl->conn, channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok) !=
        AMQP_STATUS_OK) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s", sink_target(s),
                         reason);
        return FRAME_CONNECTION_LOST;
    }
    return FRAME_CHANNEL_CLOSED;
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
            settle_tags(batch, ack->delivery_tag, ack->multiple, ANSWER_ACK);
        return FRAME_HANDLED;
    }
    case AMQP_BASIC_NACK_METHOD: {
        const amqp_basic_nack_t *nack = frame->payload.method.decoded;

        if (batch != NULL)
            settle_tags(batch, nack->delivery_tag, nack->multiple, ANSWER_NACK);
        return FRAME_HANDLED;
    }
    case AMQP_BASIC_RETURN_METHOD:
        return handle_return(s, batch, frame->payload.method.decoded, frame->channel, err);
    case AMQP_CHANNEL_CLOSE_METHOD:
        return handle_channel_close(s, batch, frame->payload.method.decoded, frame->channel, err);
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

int
sink_amqp_read_one_frame(sink *s, struct batch *batch, int64_t timeout_ms, struct outbox_error *err)
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
