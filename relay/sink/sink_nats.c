/*
 * sink_nats.c - the NATS JetStream sink: one server or a cluster's list.
 *
 * Every message is published to the subject subject_prefix + (routing key,
 * else queue), with the payload's JSON text as its body and the headers
 *
 *   Nats-Msg-Id: <message id>      (sink.h: <database>:<epoch>:<job_id>, .r<n>
 *                                  after it for a row replayed n times)
 *   <the row's headers>            (traceparent and tracestate among them)
 *   Outbox-Job-Id, Outbox-Queue, Outbox-Attempt, Content-Type: application/json
 *
 * A message is accepted only on a JetStream ack naming the stream and its
 * sequence. An ack with duplicate: true is accepted too: the stream holds
 * the job already (a relay died between publish and mark, or the row was
 * re-driven), and the server stored it once, since it deduplicates by
 * Nats-Msg-Id within the stream's duplicate window. The relay never creates
 * or alters streams; --check reads those covering the prefix and warns when
 * a window is shorter than the lease plus the longest retry delay.
 *
 * A batch is published asynchronously: every message goes out with
 * js_PublishMsgAsync, at most PENDING_WINDOW without an ack, and the acks
 * come back on the library's thread, which files each under its message
 * (found by the natsMsg's address in a sorted table). The batch waits on a
 * condition variable until every message is answered, the connection closes
 * or io_timeout_ms pass without an answer.
 *
 * Errors by fault:
 * - a subject no stream covers (no responders) fails only its messages;
 * - a stream refusing a message (limits with discard new, say) fails it
 *   with the server's text; one over the stream's size limit is rejected;
 * - a message whose subject is not a valid NATS subject or lies in the
 *   server's reserved spaces ('$...', _INBOX.), with a header JetStream
 *   obeys (any Nats- name), whose headers a NATS header cannot carry or
 *   which exceeds the server's max_payload (from its INFO) is rejected
 *   without publishing;
 * - a lost connection, no answer in time or a JetStream leader election is
 *   no message's fault: those messages are deferred. The library does not
 *   reconnect by itself (a closed connection leaves the sink disconnected),
 *   so that no publish of a batch outlives the batch; the next sink_connect()
 *   connects to the next server of the URL's list (sink.c), which is why a
 *   URL lists every server of a cluster.
 *
 * While a clustered stream elects a new leader no server listens on its
 * subjects, so publishes in that moment get "no responders" like those to a
 * subject without a stream. After the batch, the sink asks the JetStream API
 * once per such subject whether a stream covers it: if none does, its rows
 * fail; if one does (or the API cannot tell), they are deferred.
 */
#include "sink_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <nats/nats.h>

#include "clock.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "sink_nats.h"

/* Most publishes without an ack at a time. */
#define PENDING_WINDOW 4096
/*
 * Ask whether a stream covers the subjects of unanswered messages after
 * this long without an ack (at most half the I/O timeout): a subject a core
 * NATS subscriber listens on, with no stream behind it, gets no answer at
 * all, and its rows fail then instead of holding the batch.
 */
#define PROBE_AFTER_MS 500
/*
 * The longest --subject-prefix: a publish's control line (HPUB, subject,
 * reply inbox, two sizes) must fit in the server's max_control_line of
 * 4096 bytes with a routing key of 255 bytes after the prefix.
 */
#define SUBJECT_PREFIX_MAX 3700
#define SUBJECT_PREFIX_MAX_TEXT "3700"
/* Ping an idle connection this often. */
#define IDLE_FLUSH_MS 2000
/* Header names the sink writes itself; a row's Nats- header is refused, one of the others dropped. */
#define HEADER_MSG_ID "Nats-Msg-Id"
#define HEADER_JOB_ID "Outbox-Job-Id"
#define HEADER_QUEUE "Outbox-Queue"
#define HEADER_ATTEMPT "Outbox-Attempt"
#define HEADER_CONTENT_TYPE "Content-Type"
/* JetStream API error codes (nats-server's errors.json) the sink tells apart. */
#define JS_ERR_CLUSTER_NOT_AVAILABLE 10008
#define JS_ERR_MESSAGE_TOO_LARGE 10054
#define JS_ERR_NOT_ENABLED_FOR_ACCOUNT 10039
#define JS_ERR_STREAM_OFFLINE 10118
#define JS_ERR_NO_LEADER 10009
#define JS_ERR_HEADER_TOO_LARGE 10097
/* The largest header block JetStream stores ("header size exceeds maximum allowed of 64k"). */
#define HEADER_BYTES_MAX 65535

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

/* ---- subjects --------------------------------------------------------------------- */

/*
 * Why text is no valid subject (prefix: may end with '.', the rest follows),
 * or NULL when it is. Wildcards are refused anywhere, as are whitespace and
 * control characters, and empty tokens.
 */
static const char *
subject_problem(const char *text, bool prefix)
{
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
static const char *
subject_reserved(const char *subject)
{
    if (subject[0] == '$')
        return "'$' subjects ($JS., $SYS., $KV., ...) are the server's api";
    if (strncmp(subject, "_INBOX.", 7) == 0)
        return "_INBOX. holds the replies of clients";
    return NULL;
}

static const char *
subject_suffix(const struct sink_message *message)
{
    return message->routing_key != NULL ? message->routing_key : message->queue;
}

/* Writes the subject of message into the scratch buffer; -1 when out of memory. */
static int
build_subject(struct sink_nats *n, const struct sink_message *message)
{
    const char *suffix = subject_suffix(message);
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

/* ---- the library's callbacks -------------------------------------------------------- */

static int
compare_slots(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct nats_slot *)a)->message;
    uintptr_t y = (uintptr_t)((const struct nats_slot *)b)->message;

    return x < y ? -1 : x > y;
}

/* The batch index of a published message, or SIZE_MAX when not of this batch. */
static size_t
slot_of(const struct sink_nats *n, const natsMsg *message)
{
    struct nats_slot key = {.message = message}, *found;

    if (n->slots == NULL || n->slot_count == 0)
        return SIZE_MAX;
    found = bsearch(&key, n->slots, n->slot_count, sizeof(key), compare_slots);
    return found != NULL ? found->index : SIZE_MAX;
}

/*
 * A reply JetStream did not write: a core NATS subscriber on a subject no
 * stream covers answered in its place. The message reached no stream.
 */
#define NOT_AN_ACK                                                                                 \
    "the reply on '%s' is not a jetstream ack: a core nats subscriber answered, no stream"         \
    " stored the message"

/* Files an error ack by its fault (see the header comment). */
static void
settle_error(struct sink_outcome *outcome, const natsMsg *message, const jsPubAckErr *error)
{
    const char *subject = natsMsg_GetSubject((natsMsg *)message);
    const char *text = error->ErrText != NULL ? error->ErrText : natsStatus_GetText(error->Err);

    if (error->Err == NATS_NO_RESPONDERS)
        sink_outcome_set(outcome, SINK_FAILED,
                         "no jetstream stream covers subject '%s' (503 no responders)", subject);
    else if (error->ErrCode == JS_ERR_MESSAGE_TOO_LARGE || error->ErrCode == JS_ERR_HEADER_TOO_LARGE)
        sink_outcome_set(outcome, SINK_REJECTED, "jetstream refused the message: %s", text);
    else if (error->ErrCode == JS_ERR_CLUSTER_NOT_AVAILABLE || error->ErrCode == JS_ERR_NO_LEADER ||
             error->ErrCode == JS_ERR_STREAM_OFFLINE)
        sink_outcome_set(outcome, SINK_DEFERRED, "jetstream unavailable: %s", text);
    else if (error->ErrCode != 0)
        sink_outcome_set(outcome, SINK_FAILED, "jetstream refused the message on '%s': %s (%d)",
                         subject, text, (int)error->ErrCode);
    else if (error->Err == NATS_TIMEOUT)
        sink_outcome_set(outcome, SINK_DEFERRED, "no jetstream ack: %s", text);
    else
        sink_outcome_set(outcome, SINK_FAILED, NOT_AN_ACK, subject);
}

/* Runs on the library's thread for every ack or error ack of a published message. */
static void
on_ack(jsCtx *js, natsMsg *message, jsPubAck *ack, jsPubAckErr *error, void *closure)
{
    struct sink_nats *n = closure;
    size_t index;

    (void)js;
    pthread_mutex_lock(&n->lock);
    index = slot_of(n, message);
    if (index != SIZE_MAX &&
        (n->states[index] == NATS_STATE_PENDING || n->states[index] == NATS_STATE_COVERED)) {
        if (ack != NULL && ack->Stream != NULL && ack->Stream[0] != '\0') {
            sink_outcome_set(&n->outcomes[index], SINK_ACCEPTED, NULL);
            n->duplicates += ack->Duplicate;
        }
        else if (error != NULL)
            settle_error(&n->outcomes[index], message, error);
        else /* JSON without a stream: an API's answer ({"success":true}), or anyone's */
            sink_outcome_set(&n->outcomes[index], SINK_FAILED, NOT_AN_ACK,
                             natsMsg_GetSubject(message));
        n->states[index] = error != NULL && error->Err == NATS_NO_RESPONDERS
                               ? NATS_STATE_NO_RESPONDERS
                               : NATS_STATE_ANSWERED;
        n->unanswered--;
        if (n->unanswered == 0) /* the batch waits for all, not for each */
            pthread_cond_broadcast(&n->changed);
    }
    pthread_mutex_unlock(&n->lock);
    /* the batch owns and frees its messages */
}

/* ---- connecting --------------------------------------------------------------------- */

static void warn_short_windows(sink *s);

/*
 * Fails with a configuration error naming --nats-creds when path cannot be
 * read. libnats opens the file only at connect, and its error there reads
 * as a failed connection (exit 1) instead of a wrong option. The file's
 * content is never quoted.
 */
static int
check_creds_file(const char *path, struct outbox_error *err)
{
    char quoted[512];
    FILE *file = fopen(path, "r");

    if (file != NULL) {
        fclose(file);
        return 0;
    }
    return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--nats-creds: unable to read '%s': %s",
                            outbox_error_quote(quoted, sizeof(quoted), path), strerror(errno));
}

static int
sink_nats_init(sink *s, const void *options, struct outbox_error *err)
{
    const struct sink_nats_config *config = options;
    struct sink_nats *n = calloc(1, sizeof(*n));
    const char *prefix = config->subject_prefix != NULL ? config->subject_prefix : "";
    const char *problem = subject_problem(prefix, true);
    bool has_creds = config->nats_creds != NULL && config->nats_creds[0] != '\0';

    if (n == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->impl = n;
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->changed, NULL);
    n->subject_prefix = strdup(prefix);
    n->creds = has_creds ? strdup(config->nats_creds) : NULL;
    if (n->subject_prefix == NULL || (has_creds && n->creds == NULL))
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (problem == NULL)
        problem = subject_reserved(prefix);
    if (problem == NULL && strlen(prefix) > SUBJECT_PREFIX_MAX)
        problem = "longer than " SUBJECT_PREFIX_MAX_TEXT " bytes (with a routing key it would pass"
                  " the server's control line of 4096 bytes)";
    if (problem != NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--subject-prefix '%.64s%s' is not a valid nats subject prefix: %s",
                                prefix, strlen(prefix) > 64 ? "..." : "", problem);
    if (has_creds)
        return check_creds_file(n->creds, err);
    return 0;
}

/* Closes and frees the connection and the JetStream context. */
static void
drop_connection(sink *s)
{
    struct sink_nats *n = s->impl;

    jsCtx_Destroy(n->js);
    n->js = NULL;
    n->js_published = false;
    if (n->connection != NULL) {
        natsConnection_Close(n->connection);
        natsConnection_Destroy(n->connection);
        n->connection = NULL;
    }
    s->connected = false;
}

/*
 * Fills options from the URL and the sink options: the endpoint in use
 * (sink.c moves to the next after a loss), user and password or a token,
 * the credentials file, TLS.
 */
static natsStatus
fill_options(sink *s, natsOptions *options)
{
    struct sink_nats *n = s->impl;
    char url[URL_ENDPOINT_TEXT_MAX + 8];
    const char *servers[1] = {url};
    natsStatus st;

    snprintf(url, sizeof(url), "nats://%s", s->endpoint_names[s->endpoint]);
    st = natsOptions_SetServers(options, servers, 1);
    if (st == NATS_OK && s->url.user != NULL && s->url.password != NULL)
        st = natsOptions_SetUserInfo(options, s->url.user, s->url.password);
    else if (st == NATS_OK && (s->url.user != NULL || s->url.password != NULL))
        st = natsOptions_SetToken(options, s->url.user != NULL ? s->url.user : s->url.password);
    if (st == NATS_OK && n->creds != NULL)
        st = natsOptions_SetUserCredentialsFromFiles(options, n->creds, NULL);
    if (st == NATS_OK && s->url.scheme->tls) {
        /*
         * Always verified: the chain against the system CAs (or $SSL_CERT_FILE)
         * and the URL's host name. (--tls-verify is the AMQP sink's option.)
         */
        st = natsOptions_SetSecure(options, true);
        if (st == NATS_OK)
            st = natsOptions_SetExpectedHostname(options, s->url.endpoints[s->endpoint].host);
    }
    if (st == NATS_OK)
        st = natsOptions_SetTimeout(options, s->options.connect_timeout_ms);
    if (st == NATS_OK)
        st = natsOptions_SetAllowReconnect(options, false);
    return st;
}

/* The error code a failed connect deserves: a refused login or TLS setup is configuration. */
static enum outbox_error_code
connect_error_code(natsStatus st)
{
    switch (st) {
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_PERMITTED:
    case NATS_SSL_ERROR:
        return OUTBOX_ERR_CONFIG;
    default:
        return OUTBOX_ERR_CONNECTION;
    }
}

static int
sink_nats_connect(sink *s, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    natsOptions *options = NULL;
    jsOptions js_options;
    natsStatus st;

    drop_connection(s);
    n->closed = false;
    st = natsOptions_Create(&options);
    if (st == NATS_OK)
        st = fill_options(s, options);
    if (st != NATS_OK) {
        natsOptions_Destroy(options);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "nats options for %s: %s",
                                sink_display_url(s), natsStatus_GetText(st));
    }
    st = natsConnection_Connect(&n->connection, options);
    natsOptions_Destroy(options);
    if (st != NATS_OK) {
        const char *detail = nats_GetLastError(NULL), *source_end;
        char redacted[256];

        /* "(conn.c:1905): Authorization Violation": the server's words, without the source line */
        if (detail != NULL && detail[0] == '(' && (source_end = strstr(detail, "): ")) != NULL)
            detail = source_end + 3;
        if (detail != NULL && strcmp(detail, natsStatus_GetText(st)) == 0)
            detail = NULL;
        /* the library's text may quote what it was given: never a password or token */
        url_redact_message(detail != NULL ? detail : "", s->options.url,
                           s->url.password != NULL ? s->url.password : s->url.user, redacted,
                           sizeof(redacted));
        n->connection = NULL;
        return outbox_error_set(err, connect_error_code(st),
                                "unable to connect to nats at %s: %s%s%s", sink_target(s),
                                natsStatus_GetText(st), redacted[0] != '\0' ? ": " : "", redacted);
    }
    jsOptions_Init(&js_options);
    js_options.Wait = s->options.io_timeout_ms;
    js_options.PublishAsync.MaxPending = PENDING_WINDOW;
    js_options.PublishAsync.AckHandler = on_ack;
    js_options.PublishAsync.AckHandlerClosure = n;
    js_options.PublishAsync.StallWait = s->options.io_timeout_ms;
    st = natsConnection_JetStream(&n->js, n->connection, &js_options);
    if (st != NATS_OK) {
        drop_connection(s);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "nats jetstream context: %s",
                                natsStatus_GetText(st));
    }
    n->max_payload = natsConnection_GetMaxPayload(n->connection);
    n->last_used_ms = clock_monotonic_ms();
    s->connected = true;
    if (!n->windows_checked) {
        n->windows_checked = true;
        warn_short_windows(s);
    }
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
header_is_reserved(const struct json_member *member)
{
    return member->key_len >= 5 && strncasecmp(member->key, "Nats-", 5) == 0;
}

/* True for a header name the sink writes itself: a row's of that name is dropped. */
static bool
header_is_ours(const struct json_member *member)
{
    static const char *const ours[] = {HEADER_JOB_ID, HEADER_QUEUE, HEADER_ATTEMPT,
                                       HEADER_CONTENT_TYPE};

    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
        if (strcasecmp(member->key, ours[i]) == 0)
            return true;
    return false;
}

/* Sets the headers of message; the row's come first, ours after. */
static natsStatus
set_headers(natsMsg *out, const struct sink_message *message,
            const struct json_string_object *headers, size_t *header_bytes)
{
    const char *id = message->message_id;
    char job_id[24], attempt[16];
    natsStatus st = NATS_OK;

    snprintf(job_id, sizeof(job_id), "%" PRId64, message->job_id);
    snprintf(attempt, sizeof(attempt), "%" PRId32, message->attempt);
    *header_bytes = 12; /* "NATS/1.0\r\n" and the closing "\r\n" */
    for (size_t h = 0; h < headers->count && st == NATS_OK; h++) {
        if (header_is_ours(&headers->members[h]))
            continue;
        st = natsMsgHeader_Set(out, headers->members[h].key, headers->members[h].value);
        *header_bytes += headers->members[h].key_len + headers->members[h].value_len + 4;
    }
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_MSG_ID, id);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_JOB_ID, job_id);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_QUEUE, message->queue);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_ATTEMPT, attempt);
    if (st == NATS_OK)
        st = natsMsgHeader_Set(out, HEADER_CONTENT_TYPE, "application/json");
    *header_bytes += strlen(HEADER_MSG_ID) + strlen(id) + strlen(HEADER_JOB_ID) + strlen(job_id) +
                     strlen(HEADER_QUEUE) +
                     strlen(message->queue) + strlen(HEADER_ATTEMPT) + strlen(attempt) +
                     strlen(HEADER_CONTENT_TYPE) + strlen("application/json") + 5 * 4;
    return st;
}

/*
 * Builds message i of the batch into n->messages[i], or leaves it NULL with
 * the outcome set: rejected when it can never be published as is.
 */
static void
build_message(sink *s, const struct sink_message *message, size_t i)
{
    struct sink_nats *n = s->impl;
    struct json_string_object headers = {0};
    struct outbox_error parse_error = {0};
    const char *header_text = message->headers != NULL ? message->headers : "";
    const char *problem;
    size_t header_bytes = 0;
    natsMsg *out = NULL;

    if ((int64_t)message->payload_len > s->options.max_message_bytes) {
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED,
                         "message of %zu bytes exceeds the limit of %" PRId64 " bytes",
                         message->payload_len, s->options.max_message_bytes);
        return;
    }
    if (build_subject(n, message) != 0) {
        sink_outcome_set(&n->outcomes[i], SINK_DEFERRED, "out of memory while publishing to nats");
        return;
    }
    problem = subject_problem(n->subject, false);
    if (problem != NULL) {
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED, "invalid nats subject '%s': %s",
                         n->subject, problem);
        return;
    }
    problem = subject_reserved(n->subject);
    if (problem != NULL) {
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED,
                         "nats subject '%.128s' is reserved to the server: %s", n->subject,
                         problem);
        return;
    }
    if (header_text[0] != '\0' &&
        json_parse_string_object(header_text, strlen(header_text), &headers, &parse_error) != 0) {
        sink_outcome_set(&n->outcomes[i], SINK_REJECTED, "invalid headers: %s",
                         parse_error.message);
        return;
    }
    for (size_t h = 0; h < headers.count; h++)
        if (header_is_reserved(&headers.members[h])) {
            sink_outcome_set(&n->outcomes[i], SINK_REJECTED,
                             "header '%.64s' is reserved to nats: a Nats- header steers jetstream"
                             " (message id, rollup, expected stream or sequence)",
                             headers.members[h].key);
            goto cleanup;
        } else if (!header_fits(&headers.members[h])) {
            sink_outcome_set(&n->outcomes[i], SINK_REJECTED,
                             "header '%.64s' cannot be a nats header (a name with ':', space,"
                             " control or non-ascii characters, or a value with a line break)",
                             headers.members[h].key);
            goto cleanup;
        }
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

/* ---- publishing --------------------------------------------------------------------- */

/* Grows the batch arrays to count; -1 when out of memory. */
static int
reserve_batch(struct sink_nats *n, size_t count)
{
    struct nats_slot *slots;
    enum nats_state *states;
    natsMsg **messages;

    if (n->capacity >= count)
        return 0;
    slots = realloc(n->slots, count * sizeof(*slots));
    if (slots != NULL)
        n->slots = slots;
    states = realloc(n->states, count * sizeof(*states));
    if (states != NULL)
        n->states = states;
    messages = realloc(n->messages, count * sizeof(*messages));
    if (messages != NULL)
        n->messages = messages;
    if (slots == NULL || states == NULL || messages == NULL)
        return -1;
    n->capacity = count;
    return 0;
}

/*
 * Publishes the built messages in order; the table of their addresses is
 * filled first, since an ack may come back before the last is sent. Returns
 * -1 (err filled) when the connection failed, which defers the rest.
 */
static int
send_all(sink *s, size_t count, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    size_t slots = 0;
    int rc = 0;

    for (size_t i = 0; i < count; i++)
        if (n->messages[i] != NULL)
            n->slots[slots++] = (struct nats_slot){.message = n->messages[i], .index = i};
    qsort(n->slots, slots, sizeof(*n->slots), compare_slots);
    pthread_mutex_lock(&n->lock);
    n->slot_count = slots;
    pthread_mutex_unlock(&n->lock);
    for (size_t i = 0; i < count; i++) {
        natsMsg *message = n->messages[i];
        natsStatus st;

        if (message == NULL)
            continue;
        pthread_mutex_lock(&n->lock);
        n->states[i] = NATS_STATE_PENDING;
        sink_outcome_set(&n->outcomes[i], SINK_DEFERRED, "no jetstream ack in time");
        n->unanswered++;
        pthread_mutex_unlock(&n->lock);
        st = js_PublishMsgAsync(n->js, &message, NULL);
        n->js_published |= st == NATS_OK;
        if (st != NATS_OK) {
            pthread_mutex_lock(&n->lock);
            if (n->states[i] == NATS_STATE_PENDING) {
                n->states[i] = NATS_STATE_IDLE;
                n->unanswered--;
                sink_outcome_set(&n->outcomes[i], SINK_DEFERRED, "nats publish failed: %s",
                                 natsStatus_GetText(st));
            }
            pthread_mutex_unlock(&n->lock);
            outbox_error_set(err, OUTBOX_ERR_CONNECTION, "publishing to nats at %s failed: %s",
                             sink_display_url(s), natsStatus_GetText(st));
            rc = -1;
            break;
        }
    }
    return rc;
}

/*
 * Whether a stream covers subject, by the JetStream API: 1 yes, 0 no, -1
 * when the API did not answer (a cluster electing its metadata leader).
 */
static int
stream_covers(sink *s, const char *subject)
{
    struct sink_nats *n = s->impl;
    jsStreamNamesList *names = NULL;
    jsOptions options;
    jsErrCode code = 0;
    natsStatus st;
    int covered;

    jsOptions_Init(&options);
    options.Wait = s->options.io_timeout_ms;
    options.Stream.Info.SubjectsFilter = subject;
    st = js_StreamNames(&names, n->js, &options, &code);
    if (st == NATS_OK)
        covered = names != NULL && names->Count > 0;
    else
        covered = st == NATS_NOT_FOUND ? 0 : -1;
    jsStreamNamesList_Destroy(names);
    return covered;
}

/*
 * Fails the unanswered messages whose subject no stream covers: a core NATS
 * subscriber took them (the server sends no "no responders" then), and no
 * ack will ever come. Those of a covered subject (or one the API could not
 * tell about) are marked so and waited for. One question per subject, none
 * past deadline_ms.
 */
static void
probe_unanswered(sink *s, const struct sink_message *messages, size_t count, int64_t deadline_ms)
{
    struct sink_nats *n = s->impl;

    for (size_t i = 0; i < count && !n->closed && clock_monotonic_ms() < deadline_ms; i++) {
        const char *suffix = subject_suffix(&messages[i]);
        bool pending;
        int covered;

        pthread_mutex_lock(&n->lock); /* the library's thread writes the states */
        pending = n->states[i] == NATS_STATE_PENDING;
        pthread_mutex_unlock(&n->lock);
        if (!pending || build_subject(n, &messages[i]) != 0)
            continue;
        covered = stream_covers(s, n->subject);
        pthread_mutex_lock(&n->lock);
        for (size_t j = i; j < count; j++) {
            if (n->states[j] != NATS_STATE_PENDING || strcmp(subject_suffix(&messages[j]), suffix) != 0)
                continue;
            if (covered == 0) {
                sink_outcome_set(&n->outcomes[j], SINK_FAILED,
                                 "no jetstream stream covers subject '%s%s' (no ack: a core nats"
                                 " subscriber took the message)",
                                 n->subject_prefix, suffix);
                n->states[j] = NATS_STATE_ANSWERED;
                n->unanswered--;
            } else {
                n->states[j] = NATS_STATE_COVERED;
            }
        }
        pthread_mutex_unlock(&n->lock);
    }
}

/*
 * Waits until every published message is answered, the connection closes or
 * time runs out; after PROBE_AFTER_MS without an ack, asks once which
 * unanswered subjects a stream covers (probe_unanswered).
 */
static int
wait_answers(sink *s, const struct sink_message *messages, size_t count, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    int64_t now = clock_monotonic_ms(), deadline = now + s->options.io_timeout_ms;
    int64_t probe_delay = PROBE_AFTER_MS < s->options.io_timeout_ms / 2
                              ? PROBE_AFTER_MS
                              : s->options.io_timeout_ms / 2;
    int64_t probe_at = now + probe_delay;
    size_t last_unanswered;
    bool closed, probed = false;
    int rc = 0;

    pthread_mutex_lock(&n->lock);
    last_unanswered = n->unanswered;
    while (n->unanswered > 0 && !n->closed) {
        struct timespec until;

        now = clock_monotonic_ms();
        if (n->unanswered < last_unanswered) {
            /* progress: io_timeout_ms is the longest wait without any */
            probe_at = now + probe_delay;
            last_unanswered = n->unanswered;
            deadline = now + s->options.io_timeout_ms;
        }
        if (now >= deadline)
            break;
        if (!probed && now >= probe_at) {
            pthread_mutex_unlock(&n->lock);
            probe_unanswered(s, messages, count, deadline);
            pthread_mutex_lock(&n->lock);
            probed = true;
            continue;
        }
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&n->changed, &n->lock, &until);
        /*
         * Polled, not told by a closed-connection callback: such a callback
         * could run after the sink that registered it is gone.
         */
        pthread_mutex_unlock(&n->lock);
        closed = natsConnection_IsClosed(n->connection);
        pthread_mutex_lock(&n->lock);
        n->closed |= closed;
    }
    if (n->unanswered > 0) {
        outbox_error_set(err, n->closed ? OUTBOX_ERR_CONNECTION : OUTBOX_ERR_TIMEOUT,
                         n->closed ? "connection to nats at %s lost with %zu acks outstanding"
                                   : "nats at %s did not ack %zu messages in time",
                         sink_display_url(s), n->unanswered);
        rc = -1;
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

/*
 * Tells apart the two reasons for "no responders": a subject no stream
 * covers fails its rows (as settle_error said), a stream without a leader
 * (an election) defers them. One question per subject of the batch.
 */
static void
settle_no_responders(sink *s, const struct sink_message *messages, size_t count)
{
    struct sink_nats *n = s->impl;

    for (size_t i = 0; i < count; i++) {
        int covered;

        if (n->states[i] != NATS_STATE_NO_RESPONDERS)
            continue;
        if (build_subject(n, &messages[i]) != 0)
            covered = -1;
        else
            covered = n->closed ? -1 : stream_covers(s, n->subject);
        for (size_t j = i; j < count; j++) {
            if (n->states[j] != NATS_STATE_NO_RESPONDERS ||
                strcmp(subject_suffix(&messages[j]), subject_suffix(&messages[i])) != 0)
                continue;
            if (covered != 0)
                sink_outcome_set(&n->outcomes[j], SINK_DEFERRED,
                                 "no leader for the jetstream stream of subject '%s%s'"
                                 " (no responders)",
                                 n->subject_prefix, subject_suffix(&messages[j]));
            n->states[j] = NATS_STATE_ANSWERED;
        }
    }
}

/*
 * Ends the batch: takes back from the library whatever it still holds
 * unanswered, closes the table to late acks and frees every message.
 */
static void
end_batch(sink *s, size_t count)
{
    struct sink_nats *n = s->impl;
    natsMsgList pending = {0};

    if (n->js != NULL && n->js_published &&
        js_PublishAsyncGetPendingList(&pending, n->js) == NATS_OK) {
        /* the same messages as n->messages[]: freed below, not through the list */
        free(pending.Msgs);
    }
    pthread_mutex_lock(&n->lock);
    n->slot_count = 0;
    n->unanswered = 0;
    n->outcomes = NULL;
    pthread_mutex_unlock(&n->lock);
    for (size_t i = 0; i < count; i++) {
        natsMsg_Destroy(n->messages[i]);
        n->messages[i] = NULL;
    }
}

static int
sink_nats_publish(sink *s, const struct sink_message *messages, size_t count,
                  struct sink_outcome *outcomes, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    int rc;

    if (count == 0)
        return 0;
    if (reserve_batch(n, count) != 0) {
        for (size_t i = 0; i < count; i++)
            sink_outcome_set(&outcomes[i], SINK_DEFERRED, "out of memory while publishing to nats");
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    pthread_mutex_lock(&n->lock);
    n->outcomes = outcomes;
    n->unanswered = 0;
    n->duplicates = 0;
    n->slot_count = 0;
    pthread_mutex_unlock(&n->lock);
    for (size_t i = 0; i < count; i++) {
        n->messages[i] = NULL;
        n->states[i] = NATS_STATE_IDLE;
        sink_outcome_set(&outcomes[i], SINK_DEFERRED, "not published to nats");
        build_message(s, &messages[i], i);
    }
    rc = send_all(s, count, err);
    if (rc == 0)
        rc = wait_answers(s, messages, count, err);
    else {
        struct outbox_error ignored;

        wait_answers(s, messages, count, &ignored);
    }
    pthread_mutex_lock(&n->lock);
    n->slot_count = 0; /* no late ack may touch the outcomes from here on */
    pthread_mutex_unlock(&n->lock);
    settle_no_responders(s, messages, count);
    end_batch(s, count);
    /* rare (a relay died before marking, a re-drive), and the proof the dedup worked */
    if (n->duplicates > 0)
        log_event(OUTBOX_LOG_INFO, "jetstream acked messages as duplicates, already in the stream",
                  "count=%zu", n->duplicates);
    if (rc != 0 || n->closed) {
        if (rc == 0)
            rc = outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to nats at %s lost",
                                  sink_display_url(s));
        drop_connection(s);
        return rc;
    }
    n->last_used_ms = clock_monotonic_ms();
    return 0;
}

static int
sink_nats_idle(sink *s, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    natsStatus st;

    if (n->closed || natsConnection_IsClosed(n->connection)) {
        drop_connection(s);
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to nats at %s lost",
                                sink_display_url(s));
    }
    if (clock_monotonic_ms() - n->last_used_ms < IDLE_FLUSH_MS)
        return 0;
    st = natsConnection_FlushTimeout(n->connection, s->options.io_timeout_ms);
    if (st != NATS_OK) {
        drop_connection(s);
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "nats at %s failed a ping: %s",
                                sink_display_url(s), natsStatus_GetText(st));
    }
    n->last_used_ms = clock_monotonic_ms();
    return 0;
}

/* ---- --check ------------------------------------------------------------------------ */

/* Warns when stream's duplicate window is shorter than a row can stay published but unmarked. */
static int
check_window(sink *s, const char *stream, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    jsStreamInfo *info = NULL;
    jsErrCode code = 0;
    natsStatus st = js_GetStreamInfo(&info, n->js, stream, NULL, &code);
    int64_t window_ms;
    char key[64];

    if (st != NATS_OK)
        return outbox_error_set(err, OUTBOX_ERR_BROKER, "unable to read nats stream '%s': %s (%d)",
                                stream, natsStatus_GetText(st), (int)code);
    window_ms = info->Config->Duplicates / 1000000;
    snprintf(key, sizeof(key), "nats-window:%s", stream);
    /* once, not once per pipeline connecting */
    if (n->horizon_ms > 0 && window_ms < n->horizon_ms)
        log_event_limited(key, OUTBOX_LOG_WARN,
                          "nats stream duplicate window shorter than lease plus longest retry delay",
                          "stream=%s duplicate_window_ms=%" PRId64 " needed_ms=%" PRId64, stream,
                          window_ms, n->horizon_ms);
    jsStreamInfo_Destroy(info);
    return 0;
}

/* Lists the streams covering the subjects the relay publishes to ("events.>" for "events.", else any). */
static natsStatus
list_streams(sink *s, jsStreamNamesList **names, char *filter, size_t size, jsErrCode *code)
{
    struct sink_nats *n = s->impl;
    size_t prefix_len = strlen(n->subject_prefix);
    jsOptions options;

    if (prefix_len > 0 && n->subject_prefix[prefix_len - 1] == '.' && prefix_len + 2 <= size)
        snprintf(filter, size, "%s>", n->subject_prefix);
    else
        snprintf(filter, size, ">");
    jsOptions_Init(&options);
    options.Wait = s->options.io_timeout_ms;
    options.Stream.Info.SubjectsFilter = filter;
    return js_StreamNames(names, n->js, &options, code);
}

/*
 * At a sink's first connect: the warning of --check about short duplicate
 * windows, so that a daemon started without --check says it too. Errors
 * are left to the publishes.
 */
static void
warn_short_windows(sink *s)
{
    jsStreamNamesList *names = NULL;
    struct outbox_error ignored;
    jsErrCode code = 0;
    char filter[SUBJECT_PREFIX_MAX + 2];

    if (list_streams(s, &names, filter, sizeof(filter), &code) == NATS_OK && names != NULL)
        for (int i = 0; i < names->Count; i++)
            check_window(s, names->List[i], &ignored);
    jsStreamNamesList_Destroy(names);
}

static int
sink_nats_check(sink *s, struct outbox_error *err)
{
    jsStreamNamesList *names = NULL;
    jsErrCode code = 0;
    char filter[SUBJECT_PREFIX_MAX + 2];
    natsStatus st;
    int rc = 0;

    st = list_streams(s, &names, filter, sizeof(filter), &code);
    if (st == NATS_NO_RESPONDERS || code == JS_ERR_NOT_ENABLED_FOR_ACCOUNT) {
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG, "jetstream is not enabled at %s",
                              sink_display_url(s));
    } else if (st == NATS_NOT_FOUND || (st == NATS_OK && (names == NULL || names->Count == 0))) {
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG,
                              "no jetstream stream covers subjects '%s' (the relay never creates"
                              " streams: create one, e.g. nats stream add)", filter);
    } else if (st != NATS_OK) {
        rc = outbox_error_set(err, OUTBOX_ERR_BROKER, "unable to list nats streams: %s (%d)",
                              natsStatus_GetText(st), (int)code);
    } else {
        for (int i = 0; i < names->Count && rc == 0; i++)
            rc = check_window(s, names->List[i], err);
    }
    jsStreamNamesList_Destroy(names);
    if (rc != 0 && err->code == OUTBOX_ERR_CONFIG)
        drop_connection(s);
    return rc;
}

/* ---- the rest ----------------------------------------------------------------------- */

static void
sink_nats_disconnect(sink *s)
{
    drop_connection(s);
}

static void
sink_nats_destroy(sink *s)
{
    struct sink_nats *n = s->impl;

    if (n == NULL)
        return;
    drop_connection(s);
    pthread_mutex_destroy(&n->lock);
    pthread_cond_destroy(&n->changed);
    free(n->subject_prefix);
    free(n->creds);
    free(n->slots);
    free(n->states);
    free(n->messages);
    free(n->subject);
    free(n);
    s->impl = NULL;
}

/* Keeps the redelivery horizon, compared with the stream's duplicate window at connect. */
static void
sink_nats_redelivery_horizon(sink *s, int64_t horizon_ms)
{
    ((struct sink_nats *)s->impl)->horizon_ms = horizon_ms;
}

static const struct sink_ops sink_nats_ops = {
    .init = sink_nats_init,
    .connect = sink_nats_connect,
    .publish = sink_nats_publish,
    .idle = sink_nats_idle,
    .check = sink_nats_check,
    .disconnect = sink_nats_disconnect,
    .destroy = sink_nats_destroy,
    .redelivery_horizon = sink_nats_redelivery_horizon,
    /* any server of a cluster takes publishes for every stream: sink.c picks one per connect */
    .endpoint_alternatives = true,
};

/* ---- registry row ------------------------------------------------------------------- */

static const struct url_scheme sink_nats_scheme = {
    .name = "nats",
    .default_port = 4222,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .usage = "nats://[user:pass@|token@]h1:p1[,h2:p2...]",
};

static const struct url_scheme sink_nats_tls_scheme = {
    .name = "tls",
    .default_port = 4222,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .usage = "tls://... (nats over tls)",
    .tls = true,
};

static const struct url_scheme *const sink_nats_schemes[] = {&sink_nats_scheme,
                                                             &sink_nats_tls_scheme, NULL};

static const struct option_spec sink_nats_options[] = {
    {"subject-prefix", "P", OPTION_STRING, OPTION_FIELD(struct sink_nats_config, subject_prefix), "", 0,
     0, NULL, "NATS subject = P + the row's routing key, else its queue",
     OPTION_FROM_ENVIRONMENT, 0},
    {"nats-creds", "FILE", OPTION_STRING, OPTION_FIELD(struct sink_nats_config, nats_creds), NULL, 0, 0,
     NULL, "NATS: a credentials file (user JWT and seed) for a NATS account",
     OPTION_FROM_ENVIRONMENT, 0},
};

const struct sink_type sink_nats_type = {
    .kind = "nats",
    .schemes = sink_nats_schemes,
    .options = sink_nats_options,
    .option_count = sizeof(sink_nats_options) / sizeof(sink_nats_options[0]),
    /* both options default to none (zero): no config_defaults */
    .config_size = sizeof(struct sink_nats_config),
    .ops = &sink_nats_ops,
};
