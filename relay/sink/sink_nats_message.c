/*
 * sink_nats_message.c - a row as a NATS message: the subject and its
 * checks, the headers (the row's, then the sink's own) and the limits of
 * JetStream and of the server, before anything is published.
 */
#include "sink_nats_message.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "json.h"

/* Header names the sink writes itself; a row's Nats- header is refused, one of the others dropped. */
#define HEADER_MSG_ID "Nats-Msg-Id"
#define HEADER_MESSAGE_ID "Outbox-Message-Id"
#define HEADER_JOB_ID "Outbox-Job-Id"
#define HEADER_QUEUE "Outbox-Queue"
#define HEADER_ATTEMPT "Outbox-Attempt"
#define HEADER_CONTENT_TYPE "Content-Type"
/* The largest header block JetStream stores ("header size exceeds maximum allowed of 64k"). */
#define HEADER_BYTES_MAX 65535

/* ---- subjects --------------------------------------------------------------------- */

/*
 * Why text is no valid subject (prefix: may end with '.', the rest follows),
 * or NULL when it is. Wildcards are refused anywhere, as are whitespace and
 * control characters, and empty tokens.
 */
const char *
sink_nats_subject_problem(const char *text, enum nats_subject_part part)
{
    bool prefix = part == NATS_SUBJECT_PREFIX;

    size_t len = strlen(text);

    if (len == 0)
        return prefix ? NULL : "it is empty";
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];

        if (c <= ' ' || c == 0x7f)
            return "it holds whitespace or a control character";
        if (c == '*' || c == '>')
            return "it holds a wildcard ('*' or '>')";
        if (c == '.' && (i == 0 || text[i - 1] == '.'))
            return "it has an empty token";
    }
    if (text[len - 1] == '.' && !prefix)
        return "it has an empty token";
    return NULL;
}

/*
 * Why subject lies in a space the server keeps for itself, or NULL when it
 * does not: '$' subjects are the JetStream API ($JS.API.STREAM.PURGE.<name>
 * purges a stream), the system account ($SYS.), key-value buckets ($KV.),
 * object stores and any the server adds; _INBOX. holds the replies of
 * clients. A row publishing there would drive the server, not append to a
 * stream.
 */
const char *
sink_nats_subject_reserved(const char *subject)
{
    if (subject[0] == '$')
        return "'$' subjects ($JS., $SYS., $KV., ...) are the server's api";
    if (strncmp(subject, "_INBOX.", 7) == 0)
        return "_INBOX. holds the replies of clients";
    return NULL;
}

const char *
sink_nats_subject_suffix(const struct sink_message *message)
{
    return message->routing_key != NULL ? message->routing_key : message->queue;
}

/* Writes the subject of message into the scratch buffer; -1 when out of memory. */
int
sink_nats_build_subject(struct sink_nats *n, const struct sink_message *message)
{
    const char *suffix = sink_nats_subject_suffix(message);
    size_t prefix_len = strlen(n->subject_prefix), suffix_len = strlen(suffix);

    if (n->subject_capacity < prefix_len + suffix_len + 1) {
        char *grown = realloc(n->subject, prefix_len + suffix_len + 64);

        if (grown == NULL)
            return -1;
        n->subject = grown;
        n->subject_capacity = prefix_len + suffix_len + 64;
    }
    memcpy(n->subject, n->subject_prefix, prefix_len);
    memcpy(n->subject + prefix_len, suffix, suffix_len + 1);
    return 0;
}

/* ---- building messages -------------------------------------------------------------- */

/* True when a row's header can travel as a NATS header as is. */
static bool
header_fits(const struct json_member *member)
{
    if (member->key_len == 0)
        return false;
    for (size_t i = 0; i < member->key_len; i++) {
        unsigned char c = (unsigned char)member->key[i];

        if (c <= ' ' || c >= 0x7f || c == ':')
            return false;
    }
    for (size_t i = 0; i < member->value_len; i++)
        if (member->value[i] == '\r' || member->value[i] == '\n' || member->value[i] == '\0')
            return false;
    return true;
}

/*
 * True for a header name JetStream obeys: Nats-Msg-Id (its dedup key: a
 * forged one drops another job as a duplicate), Nats-Rollup (purges the
 * subject or the stream), Nats-Expected-*, Nats-TTL and whatever the
 * server adds under the prefix. Compared in any case, as later servers may.
 */
static bool
nats_header_is_reserved(const struct json_member *member)
{
    return member->key_len >= 5 && strncasecmp(member->key, "Nats-", 5) == 0;
}

/* True for a header name the sink writes itself: a row's of that name is dropped. */
static bool
nats_header_is_ours(const struct json_member *member)
{
    static const char *const ours[] = {HEADER_MESSAGE_ID, HEADER_JOB_ID, HEADER_QUEUE,
                                       HEADER_ATTEMPT, HEADER_CONTENT_TYPE};

    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
        if (strcasecmp(member->key, ours[i]) == 0)
            return true;
    return false;
}

/*
 * Sets the headers of message; the row's come first, ours after. The
 * server deduplicates on Nats-Msg-Id: the dedup id, unique across
 * histories whatever the database's form; Outbox-Message-Id is the message
 * id consumers deduplicate on (the same text unless the database kept an
 * earlier form).
 */
static natsStatus
set_headers(natsMsg *out, const struct sink_message *message,
            const struct json_string_object *headers, size_t *header_bytes)
{
    const char *id = message->dedup_id;
    const char *content_type =
        message->content_type != NULL ? message->content_type : "application/json";
    char job_id[24], attempt[16];
    natsStatus st = NATS_OK;

    snprintf(job_id, sizeof(job_id), "%" PRId64, message->job_id);
    snprintf(attempt, sizeof(attempt), "%" PRId32, message->attempt);
    *header_bytes = 12; /* "NATS/1.0\r\n" and the closing "\r\n" */
    for (size_t h = 0; h < headers->count && st == NATS_OK; h++) {
        if (nats_header_is_ours(&headers->members[h]))
            continue;
        st = natsMsgHeader_Set(out, headers->members[h].key, headers->members[h].value);
        *header_bytes += headers->members[h].key_len + headers->members[h].value_len + 4;
    }
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_MSG_ID, id);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_MESSAGE_ID, message->message_id);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_JOB_ID, job_id);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_QUEUE, message->queue);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_ATTEMPT, attempt);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_CONTENT_TYPE, content_type);
    *header_bytes += strlen(HEADER_MSG_ID) + strlen(id) + strlen(HEADER_MESSAGE_ID) +
                     strlen(message->message_id) + strlen(HEADER_JOB_ID) + strlen(job_id) +
                     strlen(HEADER_QUEUE) + strlen(message->queue) + strlen(HEADER_ATTEMPT) +
                     strlen(attempt) + strlen(HEADER_CONTENT_TYPE) + strlen(content_type) + 6 * 4;
    for (size_t h = 0; h < message->extra_header_count && st == NATS_OK; h++) {
        st = natsMsgHeader_Set(out, message->extra_headers[h].name, message->extra_headers[h].value);
        *header_bytes += strlen(message->extra_headers[h].name) +
                         strlen(message->extra_headers[h].value) + 4;
    }
    return st;
}

/*
 * Builds message's subject into n->subject: true with outcome set when it
 * cannot be one (deferred when out of memory, else rejected).
 */
static bool
subject_refused(struct sink_nats *n, const struct sink_message *message,
                struct sink_outcome *outcome)
{
    const char *problem;

    if (sink_nats_build_subject(n, message) != 0) {
        sink_outcome_set(outcome, SINK_DEFERRED, "out of memory while publishing to nats");
        return true;
    }
    problem = sink_nats_subject_problem(n->subject, NATS_SUBJECT_WHOLE);
    if (problem != NULL) {
        sink_outcome_set(outcome, SINK_REJECTED, "invalid nats subject '%s': %s", n->subject,
                         problem);
        return true;
    }
    problem = sink_nats_subject_reserved(n->subject);
    if (problem != NULL) {
        sink_outcome_set(outcome, SINK_REJECTED,
                         "nats subject '%.128s' is reserved to the server: %s", n->subject,
                         problem);
        return true;
    }
    return false;
}

/* True with outcome set (rejected) when a row header cannot travel as a NATS header. */
static bool
headers_refused(const struct json_string_object *headers, struct sink_outcome *outcome)
{
    for (size_t h = 0; h < headers->count; h++)
        if (nats_header_is_reserved(&headers->members[h])) {
            sink_outcome_set(outcome, SINK_REJECTED,
                             "header '%.64s' is reserved to nats: a Nats- header steers jetstream"
                             " (message id, rollup, expected stream or sequence)",
                             headers->members[h].key);
            return true;
        } else if (!header_fits(&headers->members[h])) {
            sink_outcome_set(outcome, SINK_REJECTED,
                             "header '%.64s' cannot be a nats header (a name with ':', space,"
                             " control or non-ascii characters, or a value with a line break)",
                             headers->members[h].key);
            return true;
        }
    return false;
}

/*
 * Builds message i of the batch into n->messages[i], or leaves it NULL with
 * the outcome set: rejected when it can never be published as is.
 */
void
sink_nats_build_message(sink *s, const struct sink_message *message, size_t i)
{
    struct sink_nats *n = s->impl;
    struct json_string_object headers = {0};
    struct outbox_error parse_error = {0};
    const char *header_text = message->headers != NULL ? message->headers : "";
    size_t header_bytes = 0;
    natsMsg *out = NULL;

    if ((int64_t)message->payload_len > s->options.max_message_bytes) {
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED,
                         "message of %zu bytes exceeds the limit of %" PRId64 " bytes",
                         message->payload_len, s->options.max_message_bytes);
        return;
    }
    if (subject_refused(n, message, &n->outcomes[i]))
        return;
    if (header_text[0] != '\0' &&
        json_parse_string_object(header_text, strlen(header_text), &headers, &parse_error) != 0) {
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED, "invalid headers: %s",
                         parse_error.message);
        return;
    }
    if (headers_refused(&headers, &n->outcomes[i]))
        goto cleanup;
    if (natsMsg_Create(&out, n->subject, NULL, message->payload, (int)message->payload_len) !=
            NATS_OK ||
        set_headers(out, message, &headers, &header_bytes) != NATS_OK) {
        natsMsg_Destroy(out);
        out = NULL;
        sink_outcome_set(&n->outcomes[i], SINK_DEFERRED, "unable to build a nats message: %s",
                         nats_GetLastError(NULL));
        goto cleanup;
    }
    if (header_bytes > HEADER_BYTES_MAX) {
        natsMsg_Destroy(out);
        out = NULL;
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED,
                         "headers of %zu bytes exceed jetstream's limit of %d bytes", header_bytes,
                         HEADER_BYTES_MAX);
        goto cleanup;
    }
    if (n->max_payload > 0 && (int64_t)(message->payload_len + header_bytes) > n->max_payload) {
        natsMsg_Destroy(out);
        out = NULL;
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED,
                         "message of %zu bytes with its headers exceeds the server's"
                         " max_payload of %" PRId64 " bytes",
                         message->payload_len + header_bytes, n->max_payload);
        goto cleanup;
    }
    n->messages[i] = out;

cleanup:
    json_string_object_clear(&headers);
}
