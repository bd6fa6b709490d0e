/*
 * amqp_consumer.c - test-side RabbitMQ client (see amqp_consumer.h).
 */
#include "amqp_consumer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>

#include "sink.h"
#include "url.h"
#include "sink_amqp.h"

#define CONSUMER_CHANNEL 1
#define CONSUMER_TIMEOUT_MS 5000

struct queue_consumer {
    amqp_connection_state_t conn;
    bool logged_in; /* worth a polite close */
    char error[512];
};

static void
set_error(queue_consumer *c, const char *format, ...)
{
    va_list ap;

    va_start(ap, format);
    vsnprintf(c->error, sizeof(c->error), format, ap);
    va_end(ap);
}

/* 0 when reply is normal, else -1 with the error describing what failed. */
static int
check_reply(queue_consumer *c, amqp_rpc_reply_t reply, const char *what)
{
    switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        return 0;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        set_error(c, "%s: %s", what, amqp_error_string2(reply.library_error));
        break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            const amqp_channel_close_t *close = reply.reply.decoded;
            amqp_channel_close_ok_t close_ok = {0};

            set_error(c, "%s: %u %.*s", what, close->reply_code, (int)close->reply_text.len,
                      (const char *)close->reply_text.bytes);
            /* Acknowledge and reopen so the helper stays usable. */
            amqp_send_method(c->conn, CONSUMER_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok);
            amqp_channel_open(c->conn, CONSUMER_CHANNEL);
        } else if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            const amqp_connection_close_t *close = reply.reply.decoded;

            set_error(c, "%s: %u %.*s", what, close->reply_code, (int)close->reply_text.len,
                      (const char *)close->reply_text.bytes);
        } else {
            set_error(c, "%s: server exception", what);
        }
        break;
    default:
        set_error(c, "%s: no reply", what);
        break;
    }
    return -1;
}

queue_consumer *
queue_consumer_connect(const char *url_text)
{
    struct broker_url url;
    struct outbox_error err = {0};
    struct timeval timeout = {.tv_sec = CONSUMER_TIMEOUT_MS / 1000};
    queue_consumer *c = NULL;
    amqp_socket_t *socket;

    if (sink_url_parse(url_text, &url, &err) != 0) {
        fprintf(stderr, "consumer: %s\n", err.message);
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        goto fail;
    c->conn = amqp_new_connection();
    socket = amqp_tcp_socket_new(c->conn);
    if (socket == NULL || amqp_socket_open_noblock(socket, url.host, url.port, &timeout) != 0) {
        fprintf(stderr, "consumer: unable to connect to %s:%d\n", url.host, url.port);
        goto fail;
    }
    amqp_set_rpc_timeout(c->conn, &timeout);
    if (check_reply(c, amqp_login(c->conn, sink_amqp_url_vhost(&url), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                                  url.user, url.password),
                    "login") != 0 ||
        (amqp_channel_open(c->conn, CONSUMER_CHANNEL),
         check_reply(c, amqp_get_rpc_reply(c->conn), "channel.open") != 0)) {
        fprintf(stderr, "consumer: %s\n", c->error);
        goto fail;
    }
    c->logged_in = true;
    url_clear(&url);
    return c;

fail:
    url_clear(&url);
    queue_consumer_free(c);
    return NULL;
}

void
queue_consumer_free(queue_consumer *c)
{
    if (c == NULL)
        return;
    if (c->conn != NULL && c->logged_in) {
        amqp_channel_close(c->conn, CONSUMER_CHANNEL, AMQP_REPLY_SUCCESS);
        amqp_connection_close(c->conn, AMQP_REPLY_SUCCESS);
    }
    if (c->conn != NULL)
        amqp_destroy_connection(c->conn);
    free(c);
}

const char *
queue_consumer_error(const queue_consumer *c)
{
    return c->error;
}

int
queue_consumer_declare_queue(queue_consumer *c, const char *queue)
{
    amqp_queue_declare(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0,
                       amqp_empty_table);
    if (check_reply(c, amqp_get_rpc_reply(c->conn), "queue.declare") != 0)
        return -1;
    return queue_consumer_purge(c, queue);
}

int
queue_consumer_declare_quorum_queue(queue_consumer *c, const char *queue)
{
    amqp_table_entry_t type = {.key = amqp_cstring_bytes("x-queue-type"),
                               .value = {.kind = AMQP_FIELD_KIND_UTF8,
                                         .value.bytes = amqp_cstring_bytes("quorum")}};
    amqp_table_t arguments = {.num_entries = 1, .entries = &type};

    amqp_queue_declare(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0,
                       arguments);
    if (check_reply(c, amqp_get_rpc_reply(c->conn), "queue.declare quorum") != 0)
        return -1;
    return queue_consumer_purge(c, queue);
}

int
queue_consumer_declare_exchange(queue_consumer *c, const char *exchange, const char *type)
{
    amqp_exchange_declare(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(exchange),
                          amqp_cstring_bytes(type), 0, 1, 0, 0, amqp_empty_table);
    return check_reply(c, amqp_get_rpc_reply(c->conn), "exchange.declare");
}

int
queue_consumer_bind(queue_consumer *c, const char *queue, const char *exchange, const char *routing_key)
{
    amqp_queue_bind(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(queue),
                    amqp_cstring_bytes(exchange), amqp_cstring_bytes(routing_key),
                    amqp_empty_table);
    return check_reply(c, amqp_get_rpc_reply(c->conn), "queue.bind");
}

int
queue_consumer_delete_queue(queue_consumer *c, const char *queue)
{
    amqp_queue_delete(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(queue), 0, 0);
    return check_reply(c, amqp_get_rpc_reply(c->conn), "queue.delete");
}

int
queue_consumer_delete_exchange(queue_consumer *c, const char *exchange)
{
    amqp_exchange_delete(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(exchange), 0);
    return check_reply(c, amqp_get_rpc_reply(c->conn), "exchange.delete");
}

int
queue_consumer_purge(queue_consumer *c, const char *queue)
{
    amqp_queue_purge(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(queue));
    return check_reply(c, amqp_get_rpc_reply(c->conn), "queue.purge");
}

int
queue_consumer_count(queue_consumer *c, const char *queue, uint32_t *count)
{
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(
        c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(queue), 1, 0, 0, 0, amqp_empty_table);

    if (check_reply(c, amqp_get_rpc_reply(c->conn), "queue.declare passive") != 0)
        return -1;
    *count = ok->message_count;
    return 0;
}

/* A NUL-terminated copy of bytes, or NULL when the property is absent. */
static char *
copy_bytes(amqp_bytes_t bytes)
{
    char *text = malloc(bytes.len + 1);

    if (text == NULL)
        return NULL;
    if (bytes.len > 0)
        memcpy(text, bytes.bytes, bytes.len);
    text[bytes.len] = '\0';
    return text;
}

/* Copies what a test checks out of a library message. */
static int
copy_message(const amqp_message_t *in, amqp_bytes_t exchange, amqp_bytes_t routing_key,
             struct queue_consumer_message *out)
{
    const amqp_basic_properties_t *props = &in->properties;

    memset(out, 0, sizeof(*out));
    out->exchange = copy_bytes(exchange);
    out->routing_key = copy_bytes(routing_key);
    out->job_id = -1;
    if (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        out->message_id = copy_bytes(props->message_id);
    if (props->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
        out->content_type = copy_bytes(props->content_type);
    if (props->_flags & AMQP_BASIC_TYPE_FLAG)
        out->type = copy_bytes(props->type);
    if (props->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
        out->delivery_mode = props->delivery_mode;
    if (props->_flags & AMQP_BASIC_TIMESTAMP_FLAG) {
        out->has_timestamp = true;
        out->timestamp = props->timestamp;
    }
    if ((props->_flags & AMQP_BASIC_HEADERS_FLAG) && props->headers.num_entries > 0) {
        out->headers = calloc((size_t)props->headers.num_entries, sizeof(*out->headers));
        if (out->headers == NULL)
            return -1;
        for (int i = 0; i < props->headers.num_entries; i++) {
            const amqp_table_entry_t *entry = &props->headers.entries[i];
            struct queue_consumer_header *header = &out->headers[out->header_count++];

            header->key = copy_bytes(entry->key);
            switch (entry->value.kind) {
            case AMQP_FIELD_KIND_UTF8:
            case AMQP_FIELD_KIND_BYTES:
                header->text = copy_bytes(entry->value.value.bytes);
                break;
            case AMQP_FIELD_KIND_I8: header->is_int = true, header->int_value = entry->value.value.i8; break;
            case AMQP_FIELD_KIND_I16: header->is_int = true, header->int_value = entry->value.value.i16; break;
            case AMQP_FIELD_KIND_I32: header->is_int = true, header->int_value = entry->value.value.i32; break;
            case AMQP_FIELD_KIND_I64: header->is_int = true, header->int_value = entry->value.value.i64; break;
            case AMQP_FIELD_KIND_U8: header->is_int = true, header->int_value = entry->value.value.u8; break;
            case AMQP_FIELD_KIND_U16: header->is_int = true, header->int_value = entry->value.value.u16; break;
            case AMQP_FIELD_KIND_U32: header->is_int = true, header->int_value = entry->value.value.u32; break;
            default: break;
            }
            if (header->is_int && strcmp(header->key, "x-outbox-job-id") == 0)
                out->job_id = header->int_value;
        }
    }
    out->body = copy_bytes(in->body);
    out->body_len = in->body.len;
    return 0;
}

static int64_t
now_ms(void)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

int
queue_consumer_fetch(queue_consumer *c, const char *queue, struct queue_consumer_message *messages, size_t max,
               int timeout_ms, size_t *fetched)
{
    int64_t deadline = now_ms() + timeout_ms;

    *fetched = 0;
    while (*fetched < max) {
        amqp_rpc_reply_t reply = amqp_basic_get(c->conn, CONSUMER_CHANNEL,
                                                amqp_cstring_bytes(queue), 1);
        const amqp_basic_get_ok_t *ok;
        amqp_bytes_t exchange, routing_key;
        amqp_message_t message;
        int copied;

        if (check_reply(c, reply, "basic.get") != 0)
            return -1;
        if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) {
            struct timespec pause = {.tv_nsec = 20 * 1000000};

            if (now_ms() >= deadline)
                break;
            nanosleep(&pause, NULL);
            continue;
        }
        ok = reply.reply.decoded;
        /* Copy the routing data before reading on: the frame memory is reused. */
        exchange = amqp_bytes_malloc_dup(ok->exchange);
        routing_key = amqp_bytes_malloc_dup(ok->routing_key);
        reply = amqp_read_message(c->conn, CONSUMER_CHANNEL, &message, 0);
        if (check_reply(c, reply, "read message") != 0) {
            amqp_bytes_free(exchange);
            amqp_bytes_free(routing_key);
            return -1;
        }
        copied = copy_message(&message, exchange, routing_key, &messages[*fetched]);
        amqp_bytes_free(exchange);
        amqp_bytes_free(routing_key);
        amqp_destroy_message(&message);
        amqp_maybe_release_buffers(c->conn);
        (*fetched)++;
        if (copied != 0) {
            set_error(c, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* The x-outbox-job-id header of a message's properties, -1 when absent. */
static int64_t
queue_consumer_job_id(const amqp_basic_properties_t *properties)
{
    if (!(properties->_flags & AMQP_BASIC_HEADERS_FLAG))
        return -1;
    for (int h = 0; h < properties->headers.num_entries; h++) {
        const amqp_table_entry_t *entry = &properties->headers.entries[h];

        if (entry->key.len == strlen("x-outbox-job-id") &&
            memcmp(entry->key.bytes, "x-outbox-job-id", entry->key.len) == 0 &&
            entry->value.kind == AMQP_FIELD_KIND_I64)
            return entry->value.value.i64;
    }
    return -1;
}

int
queue_consumer_drain(queue_consumer *c, const char *queue, int idle_ms,
                     void (*on_message)(const char *message_id, int64_t job_id, void *arg),
                     void *arg)
{
    amqp_basic_consume_ok_t *ok;
    amqp_bytes_t tag;
    struct timeval idle = {.tv_sec = idle_ms / 1000, .tv_usec = idle_ms % 1000 * 1000};
    int rc = 0;

    ok = amqp_basic_consume(c->conn, CONSUMER_CHANNEL, amqp_cstring_bytes(queue), amqp_empty_bytes,
                            0, 1, 0, amqp_empty_table);
    if (check_reply(c, amqp_get_rpc_reply(c->conn), "basic.consume") != 0)
        return -1;
    tag = amqp_bytes_malloc_dup(ok->consumer_tag);
    for (;;) {
        amqp_envelope_t envelope;
        amqp_rpc_reply_t reply;
        char id[128] = "";

        amqp_maybe_release_buffers(c->conn);
        reply = amqp_consume_message(c->conn, &envelope, &idle, 0);
        if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            reply.library_error == AMQP_STATUS_TIMEOUT)
            break; /* idle: the queue is empty */
        if (check_reply(c, reply, "consume") != 0) {
            rc = -1;
            break;
        }
        if (envelope.message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
            amqp_bytes_t bytes = envelope.message.properties.message_id;

            snprintf(id, sizeof(id), "%.*s", (int)bytes.len, (const char *)bytes.bytes);
        }
        on_message(id, queue_consumer_job_id(&envelope.message.properties), arg);
        amqp_destroy_envelope(&envelope);
    }
    amqp_basic_cancel(c->conn, CONSUMER_CHANNEL, tag);
    if (rc == 0 && check_reply(c, amqp_get_rpc_reply(c->conn), "basic.cancel") != 0)
        rc = -1;
    amqp_bytes_free(tag);
    return rc;
}

void
queue_consumer_message_clear(struct queue_consumer_message *message)
{
    if (message == NULL)
        return;
    free(message->exchange);
    free(message->routing_key);
    free(message->message_id);
    free(message->content_type);
    free(message->type);
    for (size_t i = 0; i < message->header_count; i++) {
        free(message->headers[i].key);
        free(message->headers[i].text);
    }
    free(message->headers);
    free(message->body);
    memset(message, 0, sizeof(*message));
}

const struct queue_consumer_header *
queue_consumer_message_header(const struct queue_consumer_message *message, const char *key)
{
    for (size_t i = 0; i < message->header_count; i++)
        if (strcmp(message->headers[i].key, key) == 0)
            return &message->headers[i];
    return NULL;
}
