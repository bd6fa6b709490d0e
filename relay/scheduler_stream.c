/*
 * scheduler_stream.c - the stream queues of a relay of a list: each
 * database's stream worker, run by the slot serving the database. See
 * scheduler_stream.h.
 */
#include "scheduler_stream.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "ends.h"
#include "error.h"
#include "log.h"
#include "scheduler.h"
#include "sink.h"
#include "store_database_lease.h"
#include "store_stream.h"
#include "stream.h"
#include "stream_worker.h"
#include "timeouts.h"

/* A database's stream worker and what the scheduler knows of its leases. */
struct tenant_stream {
    struct stream_worker worker;
    char who[DATABASE_NAME_MAX + 16]; /* "database=NAME", for the worker's log lines */
    double extended_at; /* no lease of its partitions ends later than a lease after this */
};

/* ---- the worker on a slot's connection -------------------------------------- */

/*
 * Lends c's connection to t's worker as a stream store, the statements
 * prepared on it first when c never had them (a new connection: the held
 * cursors are read again at the next renewal, the database may be a
 * promoted standby since). -1 with err.
 */
static int
lend_connection(struct tenant_stream *ts, struct idle_connection *c, struct outbox_error *err)
{
    struct stream_worker *sr = &ts->worker;

    sr->store =
        stream_store_borrow(outbox_store_conn(c->db.store), sr->owner, !c->stream_ready, err);
    if (sr->store == NULL)
        return -1;
    if (!c->stream_ready) {
        c->stream_ready = true;
        sr->reload_cursors = true;
        sr->next_renew = 0;
    }
    sr->identity = c->db.identity;
    return 0;
}

/* Takes the connection and the broker back from t's worker. */
static void
take_connection_back(struct tenant_stream *ts)
{
    stream_store_free(ts->worker.store); /* the connection stays open */
    ts->worker.store = NULL;
    ts->worker.sink = NULL;
    ts->worker.turn_until = 0;
}

/*
 * Gives t's partitions and membership back through c; the log line at
 * level (DEBUG when the database just went quiet, INFO when the relay gives
 * the database up).
 */
static void
give_partitions_back(struct tenant *t, struct idle_connection *c, enum log_level level)
{
    struct tenant_stream *ts = t->stream;
    struct outbox_error err;
    size_t held;

    if (ts == NULL || ts->worker.owned_count == 0 || c->db.store == NULL)
        return;
    held = ts->worker.owned_count;
    if (lend_connection(ts, c, &err) != 0) {
        log_event(OUTBOX_LOG_WARN,
                  "stream partitions not given back, their leases end on their own",
                  "database=%s error=\"%s\"", t->name, err.message);
        ts->worker.owned_count = 0;
        return;
    }
    stream_worker_release_all(&ts->worker);
    take_connection_back(ts);
    ts->worker.next_renew = 0;
    log_event(level, "stream partitions given back", "database=%s partitions=%zu", t->name, held);
}

void
scheduler_stream_give_back(struct scheduler *s, struct tenant *t, struct idle_connection *c)
{
    (void)s;
    give_partitions_back(t, c, OUTBOX_LOG_INFO);
}

bool
scheduler_stream_holds(const struct tenant *t)
{
    return t->stream != NULL && t->stream->worker.owned_count > 0;
}

void
scheduler_stream_free(struct tenant *t)
{
    if (t->stream == NULL)
        return;
    stream_worker_clear(&t->stream->worker);
    free(t->stream);
    t->stream = NULL;
}

/* ---- a visit ----------------------------------------------------------------- */

/*
 * Whether this slot runs t's streams now: none other does, and t has a
 * stream queue or is due to be looked at for one. Marks them run.
 */
static bool
claim(struct scheduler *s, struct tenant *t, double now)
{
    bool claimed;

    pthread_mutex_lock(&s->lock);
    claimed = !t->stream_busy && (t->stream != NULL || now >= t->stream_check_due);
    t->stream_busy |= claimed;
    pthread_mutex_unlock(&s->lock);
    return claimed;
}

/* Whether the relay gives t up after this visit: t removed from the list, or the relay stopping. */
static bool
leaving(struct scheduler *s, struct tenant *t)
{
    bool gone;

    pthread_mutex_lock(&s->lock);
    gone = t->removed || relay_stopping(s->relay);
    pthread_mutex_unlock(&s->lock);
    return gone;
}

/* The slot is done with t's streams. */
static void
unclaim(struct scheduler *s, struct tenant *t)
{
    pthread_mutex_lock(&s->lock);
    t->stream_busy = false;
    pthread_mutex_unlock(&s->lock);
}

/*
 * Looks on c for a stream queue among --queues when t has no worker yet,
 * and makes its worker once one exists. -1 with err.
 */
static int
find_streams(struct scheduler *s, struct tenant *t, struct idle_connection *c, double now,
             struct outbox_error *err)
{
    struct tenant_stream *ts;
    bool exists = false;

    if (t->stream != NULL)
        return 0;
    pthread_mutex_lock(&s->lock); /* t's fields are the scheduler's: claim reads them */
    t->stream_check_due = now + MAINTENANCE_STREAM_CHECK_EVERY_SECONDS;
    pthread_mutex_unlock(&s->lock);
    if (store_database_has_streams(outbox_store_conn(c->db.store), s->streams->queues, &exists,
                                   err) != 0)
        return -1;
    if (!exists)
        return 0;
    ts = calloc(1, sizeof(*ts));
    if (ts == NULL || stream_worker_init(s->streams, &ts->worker, 0, err) != 0) {
        if (ts != NULL)
            stream_worker_clear(&ts->worker);
        free(ts);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    snprintf(ts->who, sizeof(ts->who), "database=%s", t->name);
    ts->worker.who = ts->who;
    ts->worker.acquired_log = OUTBOX_LOG_DEBUG; /* at each burst: see leases_when_due */
    pthread_mutex_lock(&s->lock);
    t->stream = ts;
    pthread_mutex_unlock(&s->lock);
    log_event(OUTBOX_LOG_INFO, "stream queues found, served with the database's rows",
              "database=%s", t->name);
    return 0;
}

/*
 * The leases' work when due. The partitions are held only while their
 * rows come: a visit that finds none to publish gives them back (publish),
 * so a quiet database holds no lease to renew and its visits write
 * nothing, which the statistics watch would take for a change and wake it
 * for. So a visit holding none takes them only when rows wait (one probe of
 * each partition). Partitions held past their lease (the database down
 * meanwhile, backed off) are forgotten without a word first: they are free
 * again, or another relay's, and are taken again as any free one.
 */
static int
leases_when_due(struct tenant_stream *ts, double now, bool *pending, struct outbox_error *err)
{
    struct stream_worker *sr = &ts->worker;

    *pending = true;
    if (sr->owned_count > 0 && now > ts->extended_at + sr->lease_seconds) {
        log_event(OUTBOX_LOG_DEBUG, "stream partitions rested past their lease, taken again",
                  "%s partitions=%zu", ts->who, sr->owned_count);
        sr->owned_count = 0;
        sr->next_renew = 0;
    }
    if (sr->owned_count == 0 && stream_store_pending(sr->store, sr->queues, pending, err) != 0)
        return -1;
    if (!*pending || now < sr->next_renew)
        return 0;
    if (stream_leases_turn(sr, err) != 0)
        return -1;
    ts->extended_at = clock_monotonic_seconds();
    return 0;
}

/*
 * Publishes t's held partitions on slot p, pass after pass, until a pass
 * reads nothing or `until`. Then, when no pass could read more: whether
 * rows wait still (behind the horizon, a row's backoff, another relay's
 * lease, a paused queue), else the partitions go back. -1 with err.
 */
static int
publish(struct tenant *t, struct idle_connection *c, struct pipeline *p, double until,
        struct stream_visit *out, struct outbox_error *err)
{
    struct tenant_stream *ts = t->stream;
    struct stream_worker *sr = &ts->worker;
    uint64_t settled = sr->settled;
    size_t rows = 0;
    bool pending = false;

    sr->sink = p->sink;
    sr->turn_until = until;
    if (sr->owned_count > 0 && !sink_is_connected(sr->sink) &&
        ends_connect_sink(p, ENDS_AGAIN) != 0) {
        out->waiting = true; /* the relay stops */
        return 0;
    }
    do {
        if (stream_partitions_pass(sr, &rows, err) != 0)
            return -1;
        out->rows += rows;
        if (rows > 0)
            ts->extended_at = clock_monotonic_seconds(); /* the advances extended the leases */
    } while (rows > 0 && clock_monotonic_seconds() < until && !stream_worker_stopping(sr) &&
             sink_is_connected(sr->sink));
    out->more = rows > 0;
    out->settled = sr->settled - settled;
    if (!out->more && stream_store_pending(sr->store, sr->queues, &pending, err) != 0)
        return -1;
    out->waiting = pending;
    if (!out->more && !pending) {
        take_connection_back(ts);
        give_partitions_back(t, c, OUTBOX_LOG_DEBUG);
    }
    return 0;
}

/* Deletes published rows past --retention and spent key places, when due. -1 with err. */
static int
cleanup_when_due(struct tenant_stream *ts, struct idle_connection *c, struct outbox_error *err)
{
    int rc = 0;

    if (clock_monotonic_seconds() < ts->worker.next_cleanup)
        return 0;
    if (ts->worker.store == NULL)
        rc = lend_connection(ts, c, err);
    if (rc == 0)
        rc = stream_cleanup_turn(&ts->worker, err);
    return rc;
}

int
scheduler_stream_serve(struct scheduler *s, struct pipeline *p, struct tenant *t,
                       struct idle_connection *c, double until, struct stream_visit *out,
                       struct outbox_error *err)
{
    double now = clock_monotonic_seconds();
    int rc;

    *out = (struct stream_visit){0};
    if (c->db.store == NULL || !claim(s, t, now))
        return 0;
    rc = find_streams(s, t, c, now, err);
    if (rc == 0 && t->stream != NULL) {
        bool pending = false;

        rc = lend_connection(t->stream, c, err);
        if (rc == 0)
            rc = leases_when_due(t->stream, now, &pending, err);
        if (rc == 0 && pending)
            rc = publish(t, c, p, until, out, err);
        if (rc == 0)
            rc = cleanup_when_due(t->stream, c, err);
        take_connection_back(t->stream);
    }
    if (rc != 0 && t->stream != NULL)
        t->stream->worker.next_renew = 0; /* renewed, the cursors read again, on the next */
    if (rc == 0 && leaving(s, t))
        scheduler_stream_give_back(s, t, c);
    unclaim(s, t);
    return rc;
}

void
scheduler_stream_lease_lost(struct scheduler *s, struct tenant *t, struct idle_connection *c)
{
    if (!claim(s, t, -1))
        return; /* the slot running them gives them back at a later visit */
    scheduler_stream_give_back(s, t, c);
    unclaim(s, t);
}
