/*
 * sink_amqp_conn.c - the RabbitMQ connection's small shared steps: forgetting
 * known exchanges, dropping a dead connection, describing a failed RPC
 * reply and opening the confirm channel.
 *
 * Rules: these act on struct sink_amqp alone and call no other file of the
 * sink, so the confirm reader, the publisher and the ops table can all
 * stand on them.
 */
#include "sink_amqp_conn.h"

#include <stdio.h>
#include <stdlib.h>

#include <amqp_framing.h>

#include "error.h"

void
sink_amqp_forget_exchanges(struct sink_amqp *impl)
{
    for (size_t i = 0; i < impl->known_count; i++)
        free(impl->known_exchanges[i]);
    impl->known_count = 0;
}

void
sink_amqp_drop_connection(sink *s)
{
    struct sink_amqp *impl = s->impl;

    sink_amqp_forget_exchanges(impl);
    if (impl->conn != NULL)
        amqp_destroy_connection(impl->conn);
    impl->conn = NULL;
    impl->channel_open = false;
    s->connected = false;
}

void
sink_amqp_describe_reply(amqp_rpc_reply_t reply, char *text, size_t size)
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

int
sink_amqp_open_channel(sink *s, struct outbox_error *err)
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
        sink_amqp_describe_reply(reply, text, sizeof(text));
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                "unable to open a confirm channel on %s: %s",
                                sink_target(s), text);
    }
    impl->channel_open = true;
    impl->next_tag = 1;
    return 0;
}
