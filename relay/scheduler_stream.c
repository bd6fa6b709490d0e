/*
 * scheduler_stream.c - the stream queues of the databases a relay serves:
 * each database's stream worker, run by the slot serving the database. See
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
    /*
     * the relay's own database's: its partitions are taken at once and kept
     * while the relay runs (no watch to spare writes for; a row needs no probe
     * before its partition is read, and relays share them as they start and stop)
     */
    bool kept;
};

/*
 * The worker a slot runs for t, the worker-th of its role (struct
 * slot_role): a list's database has one, run by one slot at a time; the
 * relay's own database has one for each slot publishing its streams (the
 * i-th of n takes the partitions p with p % n == i, so they publish side by
 * side), and one more, for its upkeep slot: the lag report and the cleanup,
 * which publishes nothing (scheduler_stream_upkeep).
 */
static struct tenant_stream *
stream_of(struct tenant *t, int worker)
{
    return &t->stream[worker >= 0 && (size_t)worker < t->stream_count ? worker : 0];
}

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
    /* a plan made for each batch cost PostgreSQL 1-2 us a row (stream_store.h) */
    if (!c->stream_ready && c->streams_only && stream_store_use_generic_plans(sr->store, err) != 0) {
        stream_store_free(sr->store);
        sr->store = NULL;
        return -1;
    }
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
give_partitions_back(struct tenant *t, struct tenant_stream *ts, struct idle_connection *c,
                     enum log_level level)
{
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
    for (size_t i = 0; i < t->stream_count; i++)
        give_partitions_back(t, &t->stream[i], c, OUTBOX_LOG_INFO);
}

bool
scheduler_stream_holds(const struct tenant *t)
{
    for (size_t i = 0; i < t->stream_count; i++)
        if (t->stream[i].worker.owned_count > 0)
            return true;
    return false;
}

void
scheduler_stream_free(struct tenant *t)
{
    for (size_t i = 0; i < t->stream_count; i++)
        stream_worker_clear(&t->stream[i].worker);
    free(t->stream);
    t->stream = NULL;
    t->stream_count = 0;
}

/* ---- a visit ----------------------------------------------------------------- */

/* What claim() let a slot do with a database's streams. */
enum stream_claim {
    STREAM_NOT_NOW,     /* another slot runs them or looks for them, or no look is due */
    STREAM_OTHER_LOOKS, /* the own database: not yet, another slot looks for a stream queue */
    STREAM_SHARED,      /* the own database's workers: each slot runs its own, nothing marked */
    STREAM_ALONE,       /* this slot alone runs them or looks (t->stream_busy): unclaim() */
};

/* Whether claim() let the slot run the streams (or look for them). */
static bool
runs_them(enum stream_claim claimed)
{
    return claimed == STREAM_SHARED || claimed == STREAM_ALONE;
}

/*
 * Whether this slot runs t's streams now: t has a stream queue or is due to
 * be looked at for one, and no other slot runs its worker or looks (a
 * list's database: one slot at a time; the own database: one at a time
 * looks, then each slot runs its own worker).
 */
static enum stream_claim
claim(struct scheduler *s, struct tenant *t, double now)
{
    enum stream_claim claimed = STREAM_NOT_NOW;

    pthread_mutex_lock(&s->lock);
    if (t->kind == TENANT_OWN && t->stream != NULL)
        claimed = STREAM_SHARED;
    else if (!t->stream_busy && (t->stream != NULL || now >= t->stream_check_due))
        claimed = STREAM_ALONE;
    else if (t->kind == TENANT_OWN && t->stream_busy)
        claimed = STREAM_OTHER_LOOKS;
    t->stream_busy |= claimed == STREAM_ALONE;
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

/* The slot is done with t's streams, as claim() let it have them. */
static void
unclaim(struct scheduler *s, struct tenant *t, enum stream_claim claimed)
{
    if (claimed != STREAM_ALONE)
        return;
    pthread_mutex_lock(&s->lock);
    t->stream_busy = false;
    pthread_mutex_unlock(&s->lock);
}

/*
 * Sets up ts's worker, the index-th of count for t: a list's database's
 * one (its partitions taken while their rows come, logged at DEBUG), or
 * one of the own database's (see stream_of). 0, or -1 with err.
 */
static int
worker_init(struct scheduler *s, struct tenant *t, struct tenant_stream *ts, size_t index,
            size_t count, struct outbox_error *err)
{
    struct stream_worker *sr = &ts->worker;

    if (stream_worker_init(s->streams, sr, err) != 0)
        return -1;
    snprintf(ts->who, sizeof(ts->who), "database=%s", t->name);
    ts->kept = t->kind == TENANT_OWN;
    if (t->kind == TENANT_LISTED) {
        sr->who = ts->who;
        sr->acquired_log = OUTBOX_LOG_DEBUG; /* at each burst: see leases_when_due */
        sr->next_report = -1; /* the stream gauges are the relay's own database's */
        return 0;
    }
    if (index + 1 < count) { /* a publisher: its share of the partitions */
        sr->modulus = (int)count - 1;
        sr->residue = (int)index;
        sr->next_report = -1;
        sr->next_cleanup = 1e300;
    }
    return 0;
}

/* The count workers of t, set up (worker_init); NULL with err. */
static struct tenant_stream *
make_workers(struct scheduler *s, struct tenant *t, size_t count, struct outbox_error *err)
{
    struct tenant_stream *workers = calloc(count, sizeof(*workers));

    if (workers == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < count; i++)
        if (worker_init(s, t, &workers[i], i, count, err) != 0) {
            for (size_t k = 0; k <= i; k++)
                stream_worker_clear(&workers[k].worker);
            free(workers);
            return NULL;
        }
    return workers;
}

/*
 * Looks on c for a stream queue among --queues when t has no worker yet,
 * and makes its workers once one exists (one for a list's database; for
 * the own one, one for each of its slots: see stream_of). t counts as
 * looked at (--once's stream slots wait for that) together with its
 * workers, so that no slot sees the one without the other; a failed look
 * counts too, and is tried again when due. -1 with err.
 */
static int
find_streams(struct scheduler *s, struct tenant *t, struct idle_connection *c, double now,
             struct outbox_error *err)
{
    size_t count = t->kind == TENANT_OWN ? scheduler_own_stream_workers(s) : 1;
    struct tenant_stream *workers = NULL;
    bool exists = false;
    int rc;

    if (t->stream != NULL)
        return 0;
    pthread_mutex_lock(&s->lock); /* t's fields are the scheduler's: claim reads them */
    t->stream_check_due = now + MAINTENANCE_STREAM_CHECK_EVERY_SECONDS;
    pthread_mutex_unlock(&s->lock);
    rc = store_database_has_streams(outbox_store_conn(c->db.store), s->streams->queues, &exists,
                                    err);
    if (rc == 0 && exists && (workers = make_workers(s, t, count, err)) == NULL)
        rc = -1;
    pthread_mutex_lock(&s->lock);
    t->stream_looked = true;
    if (workers != NULL) {
        t->stream = workers;
        t->stream_count = count;
    }
    pthread_mutex_unlock(&s->lock);
    if (workers != NULL)
        log_event(OUTBOX_LOG_INFO, "stream queues found, served with the database's rows",
                  "database=%s", t->name);
    return rc;
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
    if (sr->owned_count == 0 && !ts->kept &&
        stream_store_pending(sr->store, sr->queues, pending, err) != 0)
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
publish(struct tenant *t, struct tenant_stream *ts, struct idle_connection *c, struct pipeline *p,
        double until, struct stream_visit *out, struct outbox_error *err)
{
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
    /* a list's database gives its partitions back when quiet: its visits then write nothing
     * for the watch to wake it for */
    if (!out->more && !pending && !ts->kept) {
        take_connection_back(ts);
        give_partitions_back(t, ts, c, OUTBOX_LOG_DEBUG);
    }
    return 0;
}

/*
 * Deletes published rows past --retention and spent key places, and reports
 * the own database's lag, when due. -1 with err.
 */
static int
cleanup_when_due(struct tenant_stream *ts, struct idle_connection *c, struct outbox_error *err)
{
    double now = clock_monotonic_seconds();
    bool report = ts->worker.next_report >= 0 && now >= ts->worker.next_report;
    int rc = 0;

    if (now < ts->worker.next_cleanup && !report)
        return 0;
    if (ts->worker.store == NULL)
        rc = lend_connection(ts, c, err);
    if (rc == 0 && now >= ts->worker.next_cleanup)
        rc = stream_cleanup_turn(&ts->worker, err);
    if (rc == 0 && report)
        rc = stream_report_lag(&ts->worker, err);
    return rc;
}

int
scheduler_stream_serve(struct scheduler *s, struct pipeline *p, struct work *w, double until,
                       struct stream_visit *out, struct outbox_error *err)
{
    double now = clock_monotonic_seconds();
    struct tenant *t = w->tenant;
    struct idle_connection *c = &w->connection;
    struct tenant_stream *ts;
    enum stream_claim claimed;
    int rc;

    *out = (struct stream_visit){0};
    if (c->db.store == NULL)
        return 0;
    claimed = claim(s, t, now);
    if (!runs_them(claimed)) {
        /* the own database's slots each publish their share once another found them */
        out->more = claimed == STREAM_OTHER_LOOKS;
        return 0;
    }
    rc = find_streams(s, t, c, now, err);
    ts = rc == 0 && t->stream != NULL ? stream_of(t, w->role.worker) : NULL;
    if (ts != NULL) {
        bool pending = false;

        rc = lend_connection(ts, c, err);
        if (rc == 0)
            rc = leases_when_due(ts, now, &pending, err);
        if (rc == 0 && pending)
            rc = publish(t, ts, c, p, until, out, err);
        if (rc == 0)
            rc = cleanup_when_due(ts, c, err);
        take_connection_back(ts);
        if (rc != 0)
            ts->worker.next_renew = 0; /* renewed, the cursors read again, on the next */
        if (rc == 0 && leaving(s, t))
            give_partitions_back(t, ts, c, OUTBOX_LOG_INFO);
    }
    unclaim(s, t, claimed);
    return rc;
}

int
scheduler_stream_upkeep(struct scheduler *s, struct tenant *t, struct idle_connection *c,
                        double *next, struct outbox_error *err)
{
    double now = clock_monotonic_seconds();
    enum stream_claim claimed = STREAM_NOT_NOW;
    struct tenant_stream *ts;
    int rc;

    *next = t->stream != NULL ? now + STREAM_REPORT_SECONDS
                              : now + MAINTENANCE_STREAM_CHECK_EVERY_SECONDS;
    if (c->db.store != NULL)
        claimed = claim(s, t, now);
    if (!runs_them(claimed))
        return 0;
    rc = find_streams(s, t, c, now, err);
    if (rc == 0 && t->stream != NULL) {
        ts = &t->stream[t->stream_count - 1];
        rc = cleanup_when_due(ts, c, err);
        take_connection_back(ts);
        *next = ts->worker.next_report < ts->worker.next_cleanup ? ts->worker.next_report
                                                                 : ts->worker.next_cleanup;
    }
    unclaim(s, t, claimed);
    return rc;
}

bool
scheduler_stream_known(struct scheduler *s, struct tenant *t)
{
    bool known;

    pthread_mutex_lock(&s->lock);
    known = t->stream != NULL;
    pthread_mutex_unlock(&s->lock);
    return known;
}

bool
scheduler_stream_looked(struct scheduler *s, struct tenant *t)
{
    bool looked;

    pthread_mutex_lock(&s->lock);
    looked = t->stream_looked;
    pthread_mutex_unlock(&s->lock);
    return looked;
}

void
scheduler_stream_lease_lost(struct scheduler *s, struct tenant *t, struct idle_connection *c)
{
    enum stream_claim claimed = claim(s, t, -1);

    if (!runs_them(claimed))
        return; /* the slot running them gives them back at a later visit */
    scheduler_stream_give_back(s, t, c);
    unclaim(s, t, claimed);
}
