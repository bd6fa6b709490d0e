/*
 * sink_nats_publish.c - a batch published asynchronously, its acks filed
 * under their messages on the library's thread, the wait for them, and the
 * idle ping (see sink_nats.c for the rules by fault).
 */
#include "sink_nats_publish.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "sink_nats_message.h"
#include "timeouts.h"
/* JetStream API error codes (nats-server's errors.json) the sink tells apart. */
#define JS_ERR_CLUSTER_NOT_AVAILABLE 10008
#define JS_ERR_MESSAGE_TOO_LARGE 10054
#define JS_ERR_STREAM_OFFLINE 10118
#define JS_ERR_NO_LEADER 10009
#define JS_ERR_HEADER_TOO_LARGE 10097

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

/* Files an error ack by its fault (see the rules by fault in sink_nats.c). */
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
void
sink_nats_on_ack(jsCtx *js, natsMsg *message, jsPubAck *ack, jsPubAckErr *error, void *closure)
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

/* Closes and frees the connection and the JetStream context. */
void
sink_nats_drop_connection(sink *s)
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
publish_in_order(sink *s, size_t count, struct outbox_error *err)
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
        const char *suffix = sink_nats_subject_suffix(&messages[i]);
        bool pending;
        int covered;

        pthread_mutex_lock(&n->lock); /* the library's thread writes the states */
        pending = n->states[i] == NATS_STATE_PENDING;
        pthread_mutex_unlock(&n->lock);
        if (!pending || sink_nats_build_subject(n, &messages[i]) != 0)
            continue;
        covered = stream_covers(s, n->subject);
        pthread_mutex_lock(&n->lock);
        for (size_t j = i; j < count; j++) {
            if (n->states[j] != NATS_STATE_PENDING || strcmp(sink_nats_subject_suffix(&messages[j]), suffix) != 0)
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
 * time runs out; after SINK_NATS_PROBE_AFTER_MS without an ack, asks once which
 * unanswered subjects a stream covers (probe_unanswered).
 */
static int
wait_answers(sink *s, const struct sink_message *messages, size_t count, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    int64_t now = clock_monotonic_ms(), deadline = now + s->options.io_timeout_ms;
    int64_t probe_delay = SINK_NATS_PROBE_AFTER_MS < s->options.io_timeout_ms / 2
                              ? SINK_NATS_PROBE_AFTER_MS
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
        if (sink_nats_build_subject(n, &messages[i]) != 0)
            covered = -1;
        else
            covered = n->closed ? -1 : stream_covers(s, n->subject);
        for (size_t j = i; j < count; j++) {
            if (n->states[j] != NATS_STATE_NO_RESPONDERS ||
                strcmp(sink_nats_subject_suffix(&messages[j]), sink_nats_subject_suffix(&messages[i])) != 0)
                continue;
            if (covered != 0)
                sink_outcome_set(&n->outcomes[j], SINK_DEFERRED,
                                 "no leader for the jetstream stream of subject '%s%s'"
                                 " (no responders)",
                                 n->subject_prefix, sink_nats_subject_suffix(&messages[j]));
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

int
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
        sink_nats_build_message(s, &messages[i], i);
    }
    rc = publish_in_order(s, count, err);
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
        sink_nats_drop_connection(s);
        return rc;
    }
    n->last_used_ms = clock_monotonic_ms();
    return 0;
}

int
sink_nats_idle(sink *s, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    natsStatus st;

    if (n->closed || natsConnection_IsClosed(n->connection)) {
        sink_nats_drop_connection(s);
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "connection to nats at %s lost",
                                sink_display_url(s));
    }
    if (clock_monotonic_ms() - n->last_used_ms < SINK_NATS_IDLE_FLUSH_MS)
        return 0;
    st = natsConnection_FlushTimeout(n->connection, s->options.io_timeout_ms);
    if (st != NATS_OK) {
        sink_nats_drop_connection(s);
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "nats at %s failed a ping: %s",
                                sink_display_url(s), natsStatus_GetText(st));
    }
    n->last_used_ms = clock_monotonic_ms();
    return 0;
}
