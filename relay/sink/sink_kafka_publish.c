/*
 * sink_kafka_publish.c - a batch handed to librdkafka and settled by its
 * delivery reports: records built from rows, the wait for every report,
 * the second try alone of a record the broker found too large in a batch,
 * and the idle poll (see sink_kafka.c for the outcome of each error).
 */
#include "sink_kafka_conn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clock.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "timeouts.h"
/* Kafka's longest topic name. */
#define SINK_KAFKA_TOPIC_MAX 249

/* ---- callbacks (served by rd_kafka_poll/flush on the publishing thread) ---- */

/* What a failed delivery report means for its row. */
static enum sink_status
status_of_error(rd_kafka_resp_err_t code)
{
    switch (code) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        return SINK_REJECTED;
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
        return SINK_FAILED;
    default:
        return SINK_DEFERRED;
    }
}

void
sink_kafka_on_delivery(rd_kafka_t *producer, const rd_kafka_message_t *message, void *opaque)
{
    sink *s = opaque;
    struct sink_kafka *k = s->impl;
    size_t index = (size_t)(uintptr_t)message->_private;
    enum sink_status status;

    (void)producer;
    /* reports of an abandoned batch (while the producer is torn down) have no row */
    if (k->outcomes == NULL || index >= k->count || k->settled[index])
        return;
    k->settled[index] = true;
    k->reports++;
    if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        sink_outcome_set(&k->outcomes[index], SINK_ACCEPTED, NULL);
        return;
    }
    status = status_of_error(message->err);
    k->too_large[index] = status == SINK_REJECTED;
    if (status == SINK_DEFERRED)
        k->deferred++;
    sink_outcome_set(&k->outcomes[index], status, "kafka: %s (%s)", rd_kafka_err2str(message->err),
                     rd_kafka_err2name(message->err));
}

void
sink_kafka_on_error(rd_kafka_t *producer, int code, const char *reason, void *opaque)
{
    sink *s = opaque;
    struct sink_kafka *k = s->impl;

    (void)producer;
    k->last_error = (rd_kafka_resp_err_t)code;
    k->all_down |= code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN;
    snprintf(k->last_reason, sizeof(k->last_reason), "%s", reason);
}

/* Destroys the producer at once: whatever it still holds is dropped, unreported. */
void
sink_kafka_destroy_producer(struct sink_kafka *k)
{
    if (k->producer == NULL)
        return;
    k->outcomes = NULL;
    rd_kafka_purge(k->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_poll(k->producer, 0);
    rd_kafka_destroy(k->producer);
    k->producer = NULL;
}

void
sink_kafka_disconnect(sink *s)
{
    struct sink_kafka *k = s->impl;

    sink_kafka_destroy_producer(k);
    s->connected = false;
}


/* A fatal producer error (idempotence state lost): the producer must be rebuilt. */
bool
sink_kafka_producer_fatal(struct sink_kafka *k, char *reason, size_t size)
{
    return rd_kafka_fatal_error(k->producer, reason, size) != RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Serves reports while librdkafka is idle; the producer stays usable. */
int
sink_kafka_idle(sink *s, struct outbox_error *err)
{
    struct sink_kafka *k = s->impl;
    char reason[SINK_KAFKA_ERRSTR_MAX];

    rd_kafka_poll(k->producer, 0);
    if (sink_kafka_producer_fatal(k, reason, sizeof(reason))) {
        sink_kafka_disconnect(s);
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "kafka producer failed: %s", reason);
    }
    return 0;
}


/* ---- publishing --------------------------------------------------------------- */

/* Room to mark which messages of a batch have their report. */
static int
reserve_reports(struct sink_kafka *k, size_t count, struct outbox_error *err)
{
    if (count > k->capacity) {
        bool *settled = realloc(k->settled, count * sizeof(*settled));
        bool *too_large;

        if (settled == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        k->settled = settled;
        too_large = realloc(k->too_large, count * sizeof(*too_large));
        if (too_large == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        k->too_large = too_large;
        k->capacity = count;
    }
    if (count > 0) {
        memset(k->settled, 0, count * sizeof(*k->settled));
        memset(k->too_large, 0, count * sizeof(*k->too_large));
    }
    return 0;
}

/* The headers the relay sets itself; a row header of the same name is dropped, not doubled. */
static bool
is_relay_header(const struct json_member *member)
{
    static const char *const names[] = {"message-id", "outbox-job-id", "outbox-queue",
                                         "outbox-attempt"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (member->key_len == strlen(names[i]) &&
            memcmp(member->key, names[i], member->key_len) == 0)
            return true;
    return false;
}

/*
 * The record's headers: the row's (traceparent and tracestate among them),
 * then message-id, outbox-job-id, outbox-queue and outbox-attempt. NULL with the outcome
 * set when the row's headers are not an object of strings.
 */
static rd_kafka_headers_t *
record_headers(const struct sink_message *m, struct sink_outcome *outcome)
{
    struct json_string_object row = {0};
    struct outbox_error parse_error = {0};
    const char *text = m->headers != NULL ? m->headers : "";
    rd_kafka_headers_t *headers;
    char number[32];

    if (text[0] != '\0' && json_parse_string_object(text, strlen(text), &row, &parse_error) != 0) {
        sink_outcome_set(outcome, SINK_REJECTED, "invalid headers: %s", parse_error.message);
        return NULL;
    }
    headers = rd_kafka_headers_new(row.count + 5 + m->extra_header_count);
    for (size_t i = 0; i < row.count; i++)
        if (!is_relay_header(&row.members[i]) &&
            (m->content_type == NULL || strcasecmp(row.members[i].key, "content-type") != 0))
            rd_kafka_header_add(headers, row.members[i].key, (ssize_t)row.members[i].key_len,
                                row.members[i].value, (ssize_t)row.members[i].value_len);
    rd_kafka_header_add(headers, "message-id", -1, m->message_id, -1);
    snprintf(number, sizeof(number), "%" PRId64, m->job_id);
    rd_kafka_header_add(headers, "outbox-job-id", -1, number, -1);
    rd_kafka_header_add(headers, "outbox-queue", -1, m->queue, -1);
    snprintf(number, sizeof(number), "%" PRId32, m->attempt);
    rd_kafka_header_add(headers, "outbox-attempt", -1, number, -1);
    if (m->content_type != NULL) /* CloudEvents (the Kafka binding's content-type) */
        rd_kafka_header_add(headers, "content-type", -1, m->content_type, -1);
    for (size_t i = 0; i < m->extra_header_count; i++)
        rd_kafka_header_add(headers, m->extra_headers[i].name, -1, m->extra_headers[i].value, -1);
    json_string_object_clear(&row);
    return headers;
}

/* Writes prefix + (routing key, else queue) into topic; -1 with the outcome set when too long. */
static int
record_topic(const struct sink_kafka *k, const struct sink_message *m, char *topic,
             struct sink_outcome *outcome)
{
    const char *suffix =
        m->routing_key != NULL && m->routing_key[0] != '\0' ? m->routing_key : m->queue;
    size_t prefix_len = strlen(k->topic_prefix);

    if (prefix_len + strlen(suffix) > SINK_KAFKA_TOPIC_MAX) {
        sink_outcome_set(outcome, SINK_REJECTED, "kafka topic name longer than %d bytes",
                         SINK_KAFKA_TOPIC_MAX);
        return -1;
    }
    memcpy(topic, k->topic_prefix, prefix_len);
    memcpy(topic + prefix_len, suffix, strlen(suffix) + 1);
    if (strncmp(topic, "__", 2) == 0) {
        /* __consumer_offsets, __transaction_state, the tools' own topics */
        sink_outcome_set(outcome, SINK_REJECTED,
                         "kafka topic '%.128s' is reserved: '__' topics are the cluster's own",
                         topic);
        return -1;
    }
    return 0;
}

/*
 * Hands message index to librdkafka, waiting for room in its queue until
 * deadline. 0, or -1 with the outcome set: the message gets no report.
 */
static int
produce_one(sink *s, const struct sink_message *m, size_t index, double deadline,
            struct sink_outcome *outcome)
{
    struct sink_kafka *k = s->impl;
    char topic[SINK_KAFKA_TOPIC_MAX + 1];
    size_t key_len = m->ordering_key != NULL ? strlen(m->ordering_key) : 0;
    rd_kafka_headers_t *headers;
    rd_kafka_resp_err_t code;
    enum sink_status status;

    if ((int64_t)m->payload_len > s->options.max_message_bytes) {
        sink_outcome_set(outcome, SINK_REJECTED,
                         "message of %zu bytes exceeds the limit of %" PRId64 " bytes",
                         m->payload_len, s->options.max_message_bytes);
        return -1;
    }
    if (record_topic(k, m, topic, outcome) != 0)
        return -1;
    headers = record_headers(m, outcome);
    if (headers == NULL)
        return -1;
    for (;;) {
        code = rd_kafka_producev(k->producer, RD_KAFKA_V_TOPIC(topic),
                                 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_VALUE((void *)m->payload, m->payload_len),
                                 RD_KAFKA_V_KEY(m->ordering_key, key_len),
                                 RD_KAFKA_V_TIMESTAMP((int64_t)(m->created_at * 1000.0)),
                                 RD_KAFKA_V_HEADERS(headers),
                                 RD_KAFKA_V_OPAQUE((void *)(uintptr_t)index), RD_KAFKA_V_END);
        if (code != RD_KAFKA_RESP_ERR__QUEUE_FULL || clock_monotonic_seconds() >= deadline)
            break;
        rd_kafka_poll(k->producer, SINK_KAFKA_POLL_MS);
    }
    if (code == RD_KAFKA_RESP_ERR_NO_ERROR)
        return 0; /* the headers are librdkafka's now */
    rd_kafka_headers_destroy(headers);
    status = status_of_error(code);
    if (status == SINK_DEFERRED)
        k->deferred++;
    sink_outcome_set(outcome, status, "kafka: %s (%s)", rd_kafka_err2str(code),
                     rd_kafka_err2name(code));
    return -1;
}

/*
 * Serves delivery reports until expected have come, io_timeout_ms pass
 * without one, every broker connection is down, or the producer fails for
 * good. True when all came. librdkafka would keep a batch for a broker
 * that is gone until message.timeout.ms; waiting that long only lets the
 * rows' leases run out, so a cluster with no broker left gives up at once.
 */
static bool
await_reports(sink *s, size_t expected, char *fatal, size_t fatal_size)
{
    struct sink_kafka *k = s->impl;
    double timeout = s->options.io_timeout_ms / 1000.0;
    double last_progress = clock_monotonic_seconds();
    size_t seen = k->reports;

    while (k->reports < expected) {
        /* flush, not poll: it sends what linger.ms would still hold back */
        rd_kafka_flush(k->producer, SINK_KAFKA_POLL_MS);
        if (sink_kafka_producer_fatal(k, fatal, fatal_size) || k->all_down)
            return false;
        if (k->reports != seen) {
            seen = k->reports;
            last_progress = clock_monotonic_seconds();
        } else if (clock_monotonic_seconds() - last_progress > timeout) {
            return false;
        }
    }
    return true;
}

/*
 * The broker judges a record batch as a whole: one record over the topic's
 * max.message.bytes gets every record of its batch refused as too large.
 * So each message refused so is sent again alone, and is dead only if it
 * is refused alone too. False when a report did not come (as await_reports).
 */
static bool
retry_too_large_alone(sink *s, const struct sink_message *messages, size_t count,
                      double deadline, char *fatal, size_t fatal_size)
{
    struct sink_kafka *k = s->impl;

    for (size_t i = 0; i < count; i++) {
        if (!k->too_large[i])
            continue;
        k->too_large[i] = false;
        k->settled[i] = false;
        if (produce_one(s, &messages[i], i, deadline, &k->outcomes[i]) != 0) {
            k->settled[i] = true;
            continue;
        }
        if (!await_reports(s, k->reports + 1, fatal, fatal_size))
            return false;
        k->too_large[i] = false;
    }
    return k->deferred == 0;
}

int
sink_kafka_publish(sink *s, const struct sink_message *messages, size_t count,
                   struct sink_outcome *outcomes, struct outbox_error *err)
{
    struct sink_kafka *k = s->impl;
    double deadline = clock_monotonic_seconds() + s->options.io_timeout_ms / 1000.0;
    char fatal[SINK_KAFKA_ERRSTR_MAX] = "";
    size_t expected = 0;
    bool complete;

    for (size_t i = 0; i < count; i++)
        sink_outcome_set(&outcomes[i], SINK_DEFERRED, "kafka: no delivery report within %d ms",
                         s->options.io_timeout_ms);
    if (reserve_reports(k, count, err) != 0)
        return -1;
    k->outcomes = outcomes;
    k->count = count;
    k->reports = 0;
    k->deferred = 0;
    k->all_down = false;
    for (size_t i = 0; i < count; i++) {
        if (produce_one(s, &messages[i], i, deadline, &outcomes[i]) != 0)
            k->settled[i] = true;
        else
            expected++;
    }
    complete = await_reports(s, expected, fatal, sizeof(fatal));
    if (complete && k->deferred == 0 && expected > 1)
        complete = retry_too_large_alone(s, messages, count, deadline, fatal, sizeof(fatal));
    k->outcomes = NULL;
    if (complete && k->deferred == 0)
        return 0;
    for (size_t i = 0; i < count && !complete && k->all_down; i++)
        if (!k->settled[i])
            sink_outcome_set(&outcomes[i], SINK_DEFERRED, "kafka: every broker is down");
    /* no message's fault: a fresh producer for the next batch, nothing of this one left queued */
    sink_kafka_disconnect(s);
    if (fatal[0] != '\0')
        return outbox_error_set(err, OUTBOX_ERR_BROKER, "kafka producer failed: %s", fatal);
    if (!complete && k->all_down)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                "kafka: every broker is down (%zu of %zu records without a report):"
                                " %s",
                                expected - k->reports, expected, k->last_reason);
    if (!complete)
        return outbox_error_set(err, OUTBOX_ERR_TIMEOUT,
                                "kafka: %zu of %zu records without a delivery report within %d ms",
                                expected - k->reports, expected, s->options.io_timeout_ms);
    return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                            "kafka: %zu of %zu records not delivered through no fault of theirs",
                            k->deferred, count);
}
