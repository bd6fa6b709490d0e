/*
 * publish.c - one claimed batch out to the broker: the lease proven first,
 * the rows sorted by outcome after.
 *
 * A row is published only while its lease is proven held; a row the broker
 * did not take through its own fault spends an attempt, a deferred one
 * (connection lost, broker busy) is given back without.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cause_log.h"
#include "cloudevents.h"
#include "clock.h"
#include "error.h"
#include "job_message.h"
#include "json.h"
#include "mutant.h"
#include "log.h"
#include "otel.h"
#include "outbox.h"
#include "ends.h"
#include "publish.h"
#include "sink.h"

/* Batches in a row that lose the broker connection before one is published in halves. */
#define BISECT_AFTER_LOSSES 2

/* Wall-clock seconds since the epoch, to compare with created_at. */
static double
wall_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Keeps a broker's reason printable, one line of well-formed UTF-8 (a
 * header name the row gave stays as written), so the database always takes
 * it as text: control characters and stray bytes become '?'.
 */
static void
sanitize_reason(char *reason)
{
    size_t left = strlen(reason);

    for (unsigned char *c = (unsigned char *)reason; *c != '\0';) {
        size_t length = json_utf8_length(c, left);

        if (length == 0 || *c < 0x20 || *c == 0x7f) {
            *c = '?';
            length = 1;
        }
        c += length;
        left -= length;
    }
}

/* Fills the failure of one message from its sink outcome. */
static void
add_failure(struct pipeline *p, struct outbox_failure *failure, const struct outbox_job *job,
            struct sink_outcome *outcome)
{
    const struct relay_config *c = p->relay->config;

    sanitize_reason(outcome->reason);
    *failure = (struct outbox_failure){
        .job_id = job->job_id,
        .generation = job->generation,
        .error = outcome->reason[0] ? outcome->reason : "publish failed",
        .retry_seconds =
            outbox_backoff_seconds(job->generation, c->retry_base_seconds, c->retry_max_seconds,
                                   (double)rand_r(&p->db.seed) / ((double)RAND_MAX + 1)),
        .permanent = outcome->status == SINK_REJECTED,
    };
}

/* Fills p->leases with the rows of a batch. */
static void
lease_batch(struct pipeline *p, const struct outbox_batch *batch)
{
    for (size_t i = 0; i < batch->count; i++)
        p->leases[i] = (struct outbox_lease){batch->jobs[i].job_id, batch->jobs[i].generation};
}

/*
 * Publishing a row whose lease has ended would put it out after rows of its
 * key that another relay published meanwhile: that relay reaped the row,
 * published it and went on with the key. So before a batch goes out, every
 * row whose lease the pipeline cannot prove it still holds is dropped. A
 * batch claimed less than half a lease ago is held for sure (claimed_at is
 * taken before the claim was sent, on the monotonic clock, so the lease
 * began later); an older one (a broker that kept it waiting, a process
 * stopped by SIGSTOP or a stalled VM, the claim made ahead and collected
 * after such a pause) is extended, and only the rows the extend returned
 * stay. Without a database nothing can be proved and every row is dropped.
 * Dropped rows are neither published nor marked: another relay owns them,
 * or will once the lease ends. What stays open is a pause between this
 * check and the write to the broker (the README's ordering promise).
 */
void
publish_keep_held_rows(struct pipeline *p, struct database *db, struct outbox_batch *batch,
                       double *claimed_at)
{
    const struct relay_config *c = p->relay->config;
    double checked = clock_monotonic_seconds(), held_for = checked - *claimed_at;
    struct outbox_error err;
    size_t changed = 0, kept = 0;

    if (batch->count == 0 || held_for <= c->lease_seconds / 2.0)
        return;
    lease_batch(p, batch);
    memset(p->done, 0, batch->count * sizeof(*p->done));
    if (db->store != NULL) {
        if (outbox_extend(db->store, p->leases, batch->count, c->lease_seconds, p->done, &changed,
                          &err) == 0)
            *claimed_at = checked;
        else {
            ends_store_failed(p, db, &err);
            memset(p->done, 0, batch->count * sizeof(*p->done));
        }
    }
    for (size_t i = 0; i < batch->count; i++)
        if (p->done[i])
            batch->jobs[kept++] = batch->jobs[i];
    if (kept < batch->count) {
        metrics_add(p->relay->metrics, METRICS_LEASE_LOST, batch->count - kept);
        log_event_limited("lease-lost-unpublished", OUTBOX_LOG_WARN,
                          "lease lost before publishing, rows left to their new owner",
                          "pipeline=%d rows=%zu held_for=%.1fs", p->index, batch->count - kept,
                          held_for);
    }
    batch->count = kept;
}

/*
 * Hands a claimed batch that will not be published back to db at once,
 * attempt included, then frees it. Without a database the rows come back
 * when their lease runs out. 0, or -1 with the connection dropped.
 */
int
publish_give_back(struct pipeline *p, struct database *db, struct outbox_batch *batch)
{
    struct outbox_error err;
    size_t changed;
    int rc = 0;

    if (batch->count > 0 && db->store != NULL) {
        lease_batch(p, batch);
        rc = outbox_release(db->store, p->leases, batch->count, p->done, &changed, &err);
        if (rc != 0)
            ends_store_failed(p, db, &err);
    }
    outbox_batch_release_memory(batch);
    return rc;
}

/*
 * Publishes messages [low, high) of st's batch in halves, each half in
 * halves again while it breaks the connection, so that a message that
 * breaks the connection by itself (one the broker answers by closing the
 * connection, or one the client library refuses mid-frame) ends up alone:
 * it fails (an attempt spent, dead after max_attempts) and the others go
 * out. A half whose messages the broker all confirmed is not published
 * again; one confirmed in part is (at least once). Without a broker the
 * rest is deferred.
 */
static void
publish_halves(struct pipeline *p, struct settlement *st, size_t low, size_t high)
{
    struct outbox_error err;
    size_t pending = 0, middle;

    for (size_t i = low; i < high; i++)
        pending += st->outcomes[i].status != SINK_ACCEPTED;
    if (pending == 0)
        return;
    if (!sink_is_connected(p->sink) && ends_connect_sink(p, ENDS_AGAIN) != 0) {
        for (size_t i = low; i < high; i++)
            if (st->outcomes[i].status != SINK_ACCEPTED)
                sink_outcome_set(&st->outcomes[i], SINK_DEFERRED,
                                 "not published: broker unreachable");
        return;
    }
    if (sink_publish(p->sink, p->messages + low, high - low, st->outcomes + low, &err) == 0)
        return;
    ends_broker_lost(p, &err);
    if (high - low == 1) {
        if (st->outcomes[low].status == SINK_DEFERRED)
            sink_outcome_set(&st->outcomes[low], SINK_FAILED,
                             "the broker connection broke on this message alone: %s", err.message);
        return;
    }
    middle = low + (high - low) / 2;
    publish_halves(p, st, low, middle);
    publish_halves(p, st, middle, high);
}

/*
 * Publishes st's batch. A batch after BISECT_AFTER_LOSSES publishes in a
 * row that lost the connection goes out in halves (publish_halves): a
 * message that breaks the connection would otherwise be given back, no
 * attempt spent, and break it again for ever. Returns what sink_publish
 * returned for the whole batch (0 after halves).
 */
static int
publish_rows(struct pipeline *p, struct settlement *st, struct outbox_error *err)
{
    size_t count = st->batch.count;
    int rc;

    if (p->connection_losses >= BISECT_AFTER_LOSSES && count > 1) {
        log_event(OUTBOX_LOG_WARN, "broker connection lost by batches in a row, publishing in halves",
                  "pipeline=%d rows=%zu losses=%d", p->index, count, p->connection_losses);
        for (size_t i = 0; i < count; i++)
            sink_outcome_set(&st->outcomes[i], SINK_DEFERRED, "not published");
        publish_halves(p, st, 0, count);
        p->connection_losses = 0;
        return 0;
    }
#ifdef OUTBOX_MUTANTS
    if (mutant_fires_every("mark_without_publish", 8)) { /* the last row accepted, never sent */
        sink_outcome_set(&st->outcomes[--count], SINK_ACCEPTED, "not published");
        if (count == 0)
            return 0;
    }
#endif
    rc = sink_publish(p->sink, p->messages, count, st->outcomes, err);
    p->connection_losses = rc != 0 ? p->connection_losses + 1 : 0;
    if (rc != 0 && count == 1 && p->connection_losses >= BISECT_AFTER_LOSSES &&
        st->outcomes[0].status == SINK_DEFERRED) {
        /* alone already: it is the one that breaks the connection */
        sink_outcome_set(&st->outcomes[0], SINK_FAILED,
                         "the broker connection broke on this message alone: %s", err->message);
        p->connection_losses = 0;
    }
    return rc;
}

/* Rows given back without an attempt: the pipeline's cause, and a warning now and then. */
static void
note_deferred(struct pipeline *p, size_t deferred, const char *reason)
{
    unsigned long repeats;

    outbox_error_set(&p->cause, OUTBOX_ERR_CONNECTION, "rows deferred: %s", reason);
    if (cause_log_due(&p->deferred_log, reason, &repeats))
        log_event(OUTBOX_LOG_WARN, "rows not published through no fault of their own, given back",
                  "pipeline=%d rows=%zu error=\"%s\" repeats=%lu", p->index, deferred, reason,
                  repeats);
}

/*
 * The messages of batch, made from db's rows, with their spans prepared
 * (*traced) and their CloudEvents attributes. False when the attributes
 * could not be built (out of memory): the batch is then deferred.
 */
static bool
build_batch_messages(struct pipeline *p, const struct database *db,
                     const struct outbox_batch *batch, bool *traced)
{
    bool built = true;

    for (size_t i = 0; i < batch->count; i++) {
        const struct outbox_job *job = &batch->jobs[i];

        p->messages[i] = job_message_from_job(job, &db->identity);
        p->messages[i].place.verdict = order_checks_verdict(
            &p->checks, db->identity.history_name, job->queue, p->messages[i].place.order);
        metrics_add_queue(p->relay->metrics, METRICS_ROWS_CLAIMED, job->queue, 1);
    }
    *traced = otel_prepare(p->otel, p->messages, batch->count) == 0;
    cloudevents_reset(p->cloudevents);
    for (size_t i = 0; i < batch->count && p->cloudevents != NULL; i++)
        if (cloudevents_apply(p->cloudevents, sink_cloudevents_prefix(p->sink), &db->identity,
                              &p->messages[i]) != 0)
            built = false;
    return built;
}

/*
 * Sorts the rows of db's published batch st by outcome (accepted, deferred,
 * failed), wall the time the broker answered, for the latency of the
 * accepted ones. A row deferred to ask a check is given back as well, its
 * check noted for the answer between turns: not the broker's fault.
 */
static void
sort_outcomes(struct pipeline *p, const struct database *db, struct settlement *st, double wall)
{
    relay *r = p->relay;
    const struct outbox_batch *batch = &st->batch;
    size_t accepted = 0, failed = 0, timed = 0, deferred = 0, asked = 0;
    const char *deferred_reason = "";

    for (size_t i = 0; i < batch->count; i++) {
        const struct outbox_job *job = &batch->jobs[i];

        if (st->outcomes[i].status == SINK_ACCEPTED) {
            st->lease_queues[accepted] = job->queue;
            if (job->created_at > 0) /* 0: an infinite created_at, no latency to observe */
                p->lags[timed++] = wall - job->created_at;
            st->leases[accepted++] = (struct outbox_lease){job->job_id, job->generation};
            metrics_add_queue(r->metrics, METRICS_ROWS_PUBLISHED, job->queue, 1);
        } else if (st->outcomes[i].status == SINK_DEFERRED) {
            if (st->outcomes[i].check[0] != '\0' && p->messages[i].place.order != NULL) {
                order_checks_ask(&p->checks, db->identity.history_name, job->queue,
                                 p->messages[i].place.order, st->outcomes[i].check);
                asked++;
            } else if (deferred == asked) {
                deferred_reason = st->outcomes[i].reason;
            }
            st->deferred_leases[deferred++] = (struct outbox_lease){job->job_id, job->generation};
        } else {
            st->failure_queues[failed] = job->queue;
            add_failure(p, &st->failures[failed++], job, &st->outcomes[i]);
        }
    }
    if (deferred > asked)
        note_deferred(p, deferred - asked, deferred_reason);
    /* a broker that takes none of a batch (too few replicas to wait for, ...) shows in health */
    metrics_set_broker_held(r->metrics,
                            accepted == 0 && deferred > asked ? deferred_reason : NULL);
    metrics_observe_many(r->metrics, METRICS_COMMIT_TO_PUBLISH, p->lags, timed);
    if (accepted > 0)
        metrics_round_trip(r->metrics, METRICS_BROKER);
    st->accepted = accepted;
    st->failed = failed;
    st->deferred = deferred;
    st->asked = asked;
}

/* Publishes the claimed batch of st and sorts its rows into accepted and failed. */
void
publish_batch(struct pipeline *p, const struct database *db, struct settlement *st)
{
    relay *r = p->relay;
    const struct outbox_batch *batch = &st->batch;
    struct outbox_error err;
    double started, finished, wall, started_wall;
    bool built, traced;
    int rc = 0;

    if (batch->count == 0)
        return;
    built = build_batch_messages(p, db, batch, &traced);
    metrics_add_in_flight(r->metrics, (int64_t)batch->count);
    st->published = batch->count;
    started = clock_monotonic_seconds();
    started_wall = otel_enabled() ? wall_seconds() : 0;
    if (built)
        rc = publish_rows(p, st, &err);
    else
        for (size_t i = 0; i < batch->count; i++)
            sink_outcome_set(&st->outcomes[i], SINK_DEFERRED, "out of memory building cloudevents");
    finished = clock_monotonic_seconds();
    wall = wall_seconds();
    if (traced)
        otel_publish(p->otel, 0, p->messages, st->outcomes, batch->count, started_wall, wall);
    metrics_observe(r->metrics, METRICS_PUBLISH_DURATION, finished - started);
    if (rc != 0)
        ends_broker_lost(p, &err);
    sort_outcomes(p, db, st, wall);
}
