/*
 * settle.c - the marks of a published batch: completed, failed, given
 * back, sent to the database ahead of their results and recorded once it
 * confirmed them.
 *
 * No row is marked before the broker confirmed it; a mark the database did
 * not confirm leaves the row running, to be published again after its
 * lease (at least once).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cause_log.h"
#include "clock.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "outbox.h"
#include "ends.h"
#include "settle.h"
#include "sink.h"

bool
settlement_has_rows(const struct settlement *st)
{
    return st->accepted + st->failed + st->deferred > 0;
}

/*
 * ' trace_id="<32 hex>"' for the log lines about a row, empty for a row
 * without a W3C traceparent; quoted, so that a JSON log keeps it a string.
 */
struct trace_field {
    char text[48];
};

/*
 * The trace field of row job_id of the settlement's batch (sorted by job
 * id), read from its traceparent header "00-<trace id>-<parent id>-<flags>".
 * Only log lines about single rows need it, so the headers are parsed here
 * and not on the way to the broker.
 */
static struct trace_field
trace_field_of(const struct settlement *st, int64_t job_id)
{
    struct trace_field field = {{0}};
    struct json_string_object headers = {0};
    struct outbox_error err;
    size_t low = 0, high = st->batch.count;

    while (low < high) {
        size_t mid = low + (high - low) / 2;

        if (st->batch.jobs[mid].job_id < job_id)
            low = mid + 1;
        else
            high = mid;
    }
    if (low == st->batch.count || st->batch.jobs[low].job_id != job_id ||
        strstr(st->batch.jobs[low].headers, "traceparent") == NULL ||
        json_parse_string_object(st->batch.jobs[low].headers, strlen(st->batch.jobs[low].headers),
                                 &headers, &err) != 0)
        return field;
    for (size_t i = 0; i < headers.count; i++) {
        const struct json_member *m = &headers.members[i];

        if (strcmp(m->key, "traceparent") == 0 && m->value_len == 55 && m->value[2] == '-' &&
            m->value[35] == '-' && strspn(m->value + 3, "0123456789abcdef") == 32)
            snprintf(field.text, sizeof(field.text), " trace_id=\"%.32s\"", m->value + 3);
    }
    json_string_object_clear(&headers);
    return field;
}

/* Records what marking the accepted rows changed; the rest lost their lease. */
static void
record_completed(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    p->rows_completed += changed;
    for (size_t i = 0; i < st->accepted; i++)
        if (st->done[i])
            metrics_add_queue(r->metrics, METRICS_ROWS_COMPLETED, st->lease_queues[i], 1);
    if (changed < st->accepted) {
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->accepted - changed);
        for (size_t i = 0; i < st->accepted; i++)
            if (!st->done[i])
                log_event_limited("lease-lost", OUTBOX_LOG_WARN,
                                  "lease lost before marking a published row",
                                  "pipeline=%d job_id=%lld%s", p->index,
                                  (long long)st->leases[i].job_id,
                                  trace_field_of(st, st->leases[i].job_id).text);
    }
}

/* Records what giving the failed rows back changed: retried later, or dead. */
static void
record_failed(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    for (size_t i = 0; i < st->failed; i++) {
        const struct outbox_failure *f = &st->failures[i];

        if (!st->done[i])
            continue;
        /* a row's last attempt counts as dead only, as the metric's help says */
        if (st->dead[i]) {
            metrics_add_queue(r->metrics, METRICS_ROWS_DEAD, st->failure_queues[i], 1);
            log_event(OUTBOX_LOG_ERROR, "row is dead", "pipeline=%d job_id=%lld%s error=\"%s\"",
                      p->index, (long long)f->job_id, trace_field_of(st, f->job_id).text,
                      f->error);
        } else {
            metrics_add_queue(r->metrics, METRICS_ROWS_FAILED, st->failure_queues[i], 1);
            log_event_limited("publish-failed", OUTBOX_LOG_WARN, "publish failed, will retry",
                              "pipeline=%d job_id=%lld%s retry_in=%.1fs error=\"%s\"", p->index,
                              (long long)f->job_id, trace_field_of(st, f->job_id).text,
                              f->retry_seconds, f->error);
        }
    }
    if (changed < st->failed)
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->failed - changed);
}

/* Records what giving the deferred rows back changed. */
static void
record_given_back(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    metrics_add(r->metrics, METRICS_ROWS_RELEASED, changed);
    if (changed < st->deferred)
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->deferred - changed);
}

/* Forgets a settled (or abandoned) batch. */
void
settlement_clear(struct pipeline *p, struct settlement *st)
{
    metrics_add_in_flight(p->relay->metrics, -(int64_t)st->published);
    st->accepted = st->failed = st->deferred = st->asked = st->published = 0;
    outbox_batch_release_memory(&st->batch);
}

/*
 * Sends the marks of a published batch (complete, fail, then give back) to
 * db ahead of their results. Returns 0, or -1 after dropping the store.
 */
int
settle_send(struct pipeline *p, struct database *db, const struct settlement *st)
{
    struct outbox_error err;

    if (outbox_complete_send(db->store, st->leases, st->accepted, &err) != 0 ||
        outbox_fail_send(db->store, st->failures, st->failed, &err) != 0 ||
        outbox_release_send(db->store, st->deferred_leases, st->deferred, &err) != 0) {
        ends_store_failed(p, db, &err);
        return -1;
    }
    return 0;
}

/*
 * Collects what settle_send() sent and records it. Returns 0, or -1 after
 * dropping the store: the marks that were not confirmed are left to
 * settle_now().
 */
int
settle_receive(struct pipeline *p, struct database *db, struct settlement *st)
{
    struct outbox_error err;
    size_t changed;

    if (outbox_complete_receive(db->store, st->leases, st->accepted, st->done, &changed, &err) != 0)
        goto fail;
    record_completed(p, st, changed);
    st->accepted = 0;
    if (outbox_fail_receive(db->store, st->failures, st->failed, st->done, st->dead, &changed,
                            &err) != 0)
        goto fail;
    record_failed(p, st, changed);
    st->failed = 0;
    if (outbox_release_receive(db->store, st->deferred_leases, st->deferred, st->done, &changed,
                               &err) != 0)
        goto fail;
    record_given_back(p, st, changed);
    st->deferred = st->asked = 0;
    return 0;

fail:
    ends_store_failed(p, db, &err);
    return -1;
}

/*
 * Marks a published batch and waits. If the database is gone, reconnects
 * once and tries again while the leases may still hold; rows it cannot mark
 * stay running and are re-published after their lease (at least once).
 */
void
settle_now(struct pipeline *p, struct database *db, struct settlement *st)
{
    for (int attempt = 0; attempt < 2 && settlement_has_rows(st); attempt++) {
        if (db->store == NULL && ends_connect_store(db, ENDS_AGAIN) != 0)
            break;
        if (settle_send(p, db, st) == 0)
            settle_receive(p, db, st);
    }
    settlement_clear(p, st);
}

void
settlement_free(struct settlement *st)
{
    outbox_batch_release_memory(&st->batch);
    free(st->outcomes);
    free(st->leases);
    free(st->lease_queues);
    free(st->failures);
    free(st->failure_queues);
    free(st->deferred_leases);
    free(st->done);
    free(st->dead);
}

int
settlement_init(struct settlement *st, size_t n)
{
    st->outcomes = calloc(n, sizeof(*st->outcomes));
    st->leases = calloc(n, sizeof(*st->leases));
    st->lease_queues = calloc(n, sizeof(*st->lease_queues));
    st->failures = calloc(n, sizeof(*st->failures));
    st->failure_queues = calloc(n, sizeof(*st->failure_queues));
    st->deferred_leases = calloc(n, sizeof(*st->deferred_leases));
    st->done = calloc(n, sizeof(*st->done));
    st->dead = calloc(n, sizeof(*st->dead));
    return st->outcomes && st->leases && st->lease_queues && st->failures && st->failure_queues &&
                   st->deferred_leases && st->done && st->dead
               ? 0
               : -1;
}
