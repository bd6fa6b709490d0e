/*
 * sink_amqp_publish.c - publishing a batch with publisher confirms.
 *
 * A batch is published in windows (frames that already arrived are handled
 * between windows without blocking), then the sink reads frames until every
 * published message is settled, or io_timeout_ms passes without a frame
 * from the broker (then every unsettled message is deferred and the
 * connection torn down).
 *
 * RabbitMQ closes the channel on a publish it refuses (406 over
 * max_message_size, 404 for a missing exchange): that message fails with
 * the broker's text, the channel is reopened and every other unsettled
 * message is published again in the same call (their confirms died with
 * the channel; at least once). The culprit is the message whose size the
 * 406 names (the size limit is then applied before publishing, for the
 * life of the connection); for any other text the rest is published one
 * message at a time, each waiting for its confirm, so the next close names
 * its message.
 *
 * Destination: a message goes to its own exchange (else --exchange) with
 * its own routing key (else its queue). Before a batch is published, every
 * named exchange the connection has not seen yet is looked up with a
 * passive exchange.declare, so a missing one fails just its messages
 * instead of closing the channel mid-window. Exchanges found are
 * remembered for the life of the connection (at most
 * SINK_AMQP_KNOWN_EXCHANGES names; any channel close forgets them, since an
 * exchange deleted later closes the channel on the next publish).
 */
#include "sink_amqp_publish.h"
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

/* How one round of publishing ended. */
enum round_result {
    ROUND_DONE = 0,       /* every message of the round settled */
    ROUND_CHANNEL_CLOSED, /* the broker closed the channel; close_text says why */
    ROUND_LOST,           /* connection lost or no confirm in time: err filled, all deferred */
};

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
 * True for a header RabbitMQ routes by: CC and BCC send copies of the
 * message to more routing keys (BCC invisibly), past the row's routing key.
 * RabbitMQ compares them as written.
 */
static bool
header_is_reserved(const struct json_member *member)
{
    return (member->key_len == 2 && memcmp(member->key, "CC", 2) == 0) ||
           (member->key_len == 3 && memcmp(member->key, "BCC", 3) == 0);
}

/*
 * The header part of check_message(): the row's headers parse, none is
 * reserved or too long, and they fit in one frame. 0 with headers filled,
 * or -1 with them cleared and the outcome set.
 */
static int
check_headers(sink *s, const struct sink_message *message, struct json_string_object *headers,
              struct sink_outcome *outcome)
{
    struct sink_amqp *impl = s->impl;
    struct outbox_error parse_error = {0};
    const char *header_text = message->headers != NULL ? message->headers : "";
    size_t header_bytes = 0;

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
        if (header_is_reserved(&headers->members[i])) {
            sink_outcome_set(outcome, SINK_REJECTED,
                             "header '%s' is reserved to rabbitmq: it routes copies of the message"
                             " past the row's routing key",
                             headers->members[i].key);
            goto fail;
        }
        header_bytes += 1 + headers->members[i].key_len + 1 + 4 + headers->members[i].value_len;
    }
    for (size_t i = 0; i < message->extra_header_count; i++)
        header_bytes += 1 + strlen(message->extra_headers[i].name) + 1 + 4 +
                        strlen(message->extra_headers[i].value);
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

/*
 * Checks that a message can be published as is: 0 with headers filled (the
 * caller clears them), or -1 with the outcome set to SINK_REJECTED and why.
 */
static int
check_message(sink *s, const struct sink_message *message, struct json_string_object *headers,
              struct sink_outcome *outcome)
{
    struct sink_amqp *impl = s->impl;

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
    return check_headers(s, message, headers, outcome);
}

/* True for a row header the sink writes itself: the message's own wins. */
static bool
header_is_ours(const struct json_member *member)
{
    static const char *const ours[] = {SINK_AMQP_ATTEMPT_HEADER, SINK_AMQP_JOB_ID_HEADER};

    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
        if (member->key_len == strlen(ours[i]) &&
            memcmp(member->key, ours[i], member->key_len) == 0)
            return true;
    return false;
}

/*
 * The AMQP header table of message into impl->entries (grown as needed):
 * the row's headers but ours, then the attempt and the job id. *count is
 * its length. -1 when out of memory.
 */
static int
fill_header_table(struct sink_amqp *impl, const struct sink_message *message,
                  const struct json_string_object *headers, size_t *count)
{
    size_t entry_count = 0;

    if (impl->entries_capacity < headers->count + message->extra_header_count + 2) {
        size_t capacity = headers->count + message->extra_header_count + 16;
        amqp_table_entry_t *entries = realloc(impl->entries, capacity * sizeof(*entries));

        if (entries == NULL)
            return -1;
        impl->entries = entries;
        impl->entries_capacity = capacity;
    }
    for (size_t h = 0; h < headers->count; h++) {
        amqp_table_entry_t *entry;

        if (header_is_ours(&headers->members[h]))
            continue; /* ours win */
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
    impl->entries[entry_count].key = amqp_cstring_bytes(SINK_AMQP_JOB_ID_HEADER);
    impl->entries[entry_count].value.kind = AMQP_FIELD_KIND_I64;
    impl->entries[entry_count].value.value.i64 = message->job_id;
    entry_count++;
    for (size_t h = 0; h < message->extra_header_count; h++) {
        impl->entries[entry_count].key = amqp_cstring_bytes(message->extra_headers[h].name);
        impl->entries[entry_count].value.kind = AMQP_FIELD_KIND_UTF8;
        impl->entries[entry_count].value.value.bytes =
            amqp_cstring_bytes(message->extra_headers[h].value);
        entry_count++;
    }
    *count = entry_count;
    return 0;
}

/* Publishes message i of the batch; -1 only when the connection failed. */
static int
publish_one(sink *s, struct batch *batch, size_t i, const struct json_string_object *headers,
            struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    const struct sink_message *message = &batch->messages[i];
    amqp_basic_properties_t props;
    size_t entry_count;
    int rc;

    if (fill_header_table(impl, message, headers, &entry_count) != 0) {
        sink_outcome_set(&batch->outcomes[i], SINK_FAILED, "out of memory");
        return 0;
    }
    memset(&props, 0, sizeof(props));
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_TYPE_FLAG |
                   AMQP_BASIC_HEADERS_FLAG;
    props.content_type = amqp_cstring_bytes(message->content_type != NULL ? message->content_type
                                                                          : "application/json");
    props.delivery_mode = 2;
    props.message_id = amqp_cstring_bytes(message->message_id);
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

    while ((rc = sink_amqp_read_one_frame(s, batch, 0, err)) > 0)
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
        sink_amqp_forget_exchanges(impl);
    copy = strdup(exchange);
    if (copy != NULL) /* out of memory: looked up again next time */
        impl->known_exchanges[impl->known_count++] = copy;
}

/*
 * After a passive declare of message i's exchange failed with reply: when
 * the broker refused the exchange (404 missing, 403 not allowed) and closed
 * the channel, the batch's messages to it fail with its text and the
 * channel is opened again. -1 when the connection failed (err filled).
 */
static int
exchange_refused(sink *s, struct batch *batch, size_t i, amqp_rpc_reply_t reply,
                 struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    const char *exchange = message_exchange(s, &batch->messages[i]);
    amqp_channel_close_ok_t close_ok = {0};
    char text[SINK_REASON_MAX - 64];

    sink_amqp_describe_reply(reply, text, sizeof(text));
    if (reply.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION ||
        reply.reply.id != AMQP_CHANNEL_CLOSE_METHOD) {
        if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION) {
            amqp_connection_close_ok_t connection_close_ok = {0};

            amqp_send_method(impl->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &connection_close_ok);
        }
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                                sink_display_url(s), text);
    }
    impl->channel_open = false;
    if (amqp_send_method(impl->conn, SINK_AMQP_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok) !=
        AMQP_STATUS_OK)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to %s lost: %s",
                                sink_display_url(s), text);
    for (size_t j = i; j < batch->count; j++) {
        if (batch->states[j] != MESSAGE_SETTLED &&
            strcmp(message_exchange(s, &batch->messages[j]), exchange) == 0) {
            sink_outcome_set(&batch->outcomes[j], SINK_FAILED, "channel closed by the broker: %s",
                             text);
            batch->states[j] = MESSAGE_SETTLED;
        }
    }
    return sink_amqp_open_channel(s, err);
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
        amqp_rpc_reply_t reply;

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
        if (exchange_refused(s, batch, i, reply, err) != 0)
            return -1;
    }
    return 0;
}

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
        got = sink_amqp_read_one_frame(s, batch, left, err);
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

int
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
    if (!impl->channel_open && sink_amqp_open_channel(s, err) != 0)
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
        if (sink_amqp_open_channel(s, err) != 0)
            goto lost;
    }
    sink_amqp_defer_unsettled(&batch, "the broker kept closing the channel");
    goto cleanup;

lost:
    sink_amqp_defer_unsettled(&batch, err->message);
    sink_amqp_drop_connection(s);
    rc = -1;

cleanup:
    free(batch.states);
    free(batch.index_of_tag);
    return rc;
}
