/*
 * scheduler.c - the slots of a relay of many databases: which database a
 * free slot serves next and a connection to it (the budget's count in
 * scheduler_budget.c), a slice of it served, and each database's faults.
 * See scheduler.h.
 *
 * One mutex guards the databases and the connection count; a slot holds
 * it only to pick and to give back, never across I/O (a connect, a slice,
 * a close run outside it).
 */
#include "scheduler.h"
#include "scheduler_state.h"
#include "scheduler_stream.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "cause_log.h"
#include "clock.h"
#include "database_list.h"
#include "ends.h"
#include "error.h"
#include "lock_check.h"
#include "log.h"
#include "maintenance.h"
#include "pipeline.h"
#include "scheduler_watch.h"
#include "store_database_lease.h"
#include "store_identity.h"
#include "stream.h"
#include "timeouts.h"
#include "wait.h"

/* ---- picking ------------------------------------------------------------ */

/*
 * When a visit of t calls the database's lease function: not when this
 * relay holds a lease its watch keeps and the relays watching the server
 * did not change since the last call, a quarter of a lease ago at most;
 * after the slice when that quarter has passed (a pause of the whole
 * database is seen then); else before. Under the lock.
 */
static enum lease_call
lease_call_of(struct scheduler *s, struct tenant *t, double now)
{
    double quarter = s->relay->config->lease_seconds / SCHEDULER_VISIT_PER_LEASE;
    bool kept = t->held && t->lease_watched && t->watched && !t->lease_stale;

    LOCK_ASSERT_HELD(&s->lock);
    t->lease_stale = false;
    if (t->kind == TENANT_OWN)
        return LEASE_KEPT; /* no lease: every relay of the URL serves it */
    if (kept)
        return now < t->lease_taken_at + quarter ? LEASE_KEPT : LEASE_AFTER;
    return LEASE_BEFORE;
}

/*
 * Whether t is not known to answer: never visited nor answering a probe,
 * or its last visit failed. Under the lock.
 */
static bool
doubtful(const struct tenant *t)
{
    return (!t->tried && !t->answered) || t->down;
}

/*
 * The due tenant that waited longest, among those under their share of
 * the slots: the busy ones share three quarters of them, the rest left for
 * quiet ones woken meanwhile, and one busy database takes --concurrency of
 * them at most (its pipelines, as a relay of one database runs: more claim
 * the same rows against each other, and their CPU is the quiet databases'
 * wait), and half of them at most for databases not known to answer.
 * NULL when none is due. *next gets the earliest due time of the others.
 * Under the lock.
 */
static struct tenant *
pick(struct scheduler *s, double now, double *next)
{
    struct tenant *best = NULL;
    int busy = 0, busy_serving = 0, share, room = s->slots - (s->budget >= 4); /* less the watch's */
    /* half the slots at most visit databases not known to answer, never visited or failed
     * (a server that accepts connections and never answers holds a slot until libpq's
     * connect_timeout): the rows of those that answer need the rest */
    int doubtful_serving = 0, doubtful_room = room / 2 > 1 ? room / 2 : 1;

    LOCK_ASSERT_HELD(&s->lock);
    for (size_t i = 0; i < s->count; i++) {
        if (!s->tenants[i]->removed && s->tenants[i]->backlog) {
            busy++;
            busy_serving += s->tenants[i]->serving;
        }
        if (doubtful(s->tenants[i]))
            doubtful_serving += s->tenants[i]->serving;
    }
    /* a quarter of the slots (one at least) stays free for quiet databases woken meanwhile:
     * their rows need not wait for a slice, nor for each other's connects */
    if ((size_t)busy < s->count && room > 2)
        room -= room / 4 > 1 ? room / 4 : 1;
    share = busy > 0 && room / busy > 1 ? room / busy : 1;
    if (share > s->relay->config->concurrency)
        share = s->relay->config->concurrency;
    for (size_t i = 0; i < s->count; i++) {
        struct tenant *t = s->tenants[i];
        /* the relay's own database keeps every slot, whatever it holds */
        bool own = t->kind == TENANT_OWN;
        int limit = own ? s->slots : t->backlog ? share : 1; /* own: its rows', its upkeep's */

        if (t->removed || t->serving >= limit ||
            (!own && t->backlog && busy_serving >= room) ||
            (!own && doubtful(t) && doubtful_serving >= doubtful_room))
            continue;
        if (t->due > now) {
            if (t->due < *next)
                *next = t->due;
            continue;
        }
        if (best == NULL || t->picked_at < best->picked_at)
            best = t;
    }
    return best;
}

/*
 * A connection for t: one of its idle ones, a new one within the budget,
 * or one that replaces an idle connection of another database (see
 * better_victim). False when none can be had now. Under the lock.
 */
static bool
take_connection(struct scheduler *s, struct tenant *t, struct work *w)
{
    LOCK_ASSERT_HELD(&s->lock);
    if (t->idle_count > 0) {
        w->connection = t->idle[--t->idle_count];
        return true;
    }
    return scheduler_count_new_connection(s, &w->to_close);
}

/*
 * Waits for a database to serve and a connection to it, for a slot of
 * role; false when the relay stops.
 */
static bool
take_work(struct scheduler *s, struct slot_role role, struct work *w)
{
    relay *r = s->relay;
    bool taken = false;

    *w = (struct work){.role = role};
    pthread_mutex_lock(&s->lock);
    while (!taken && !relay_stopping(r)) {
        double now = clock_monotonic_seconds();
        double next = now + SCHEDULER_IDLE_MAX_SECONDS;
        struct tenant *t;

        metrics_loop_turned(r->metrics); /* a slot waiting for work is no stall (/livez) */
        scheduler_look_at_list(s, now);
        scheduler_free_released(s); /* lets the lock go while it gives the leases up */
        now = clock_monotonic_seconds();
        if (s->list_look_at < next)
            next = s->list_look_at;
        /* at start, the watch's first look first (after its probe of the servers): visits
         * then record its session, and reach the servers that answer first */
        t = s->watch_looked ||
                    now >= s->started_at + SCHEDULER_WATCH_FIRST_LOOK_SECONDS +
                               SCHEDULER_PROBE_TIMEOUT_MS / 1000.0
                ? pick(s, now, &next)
                : NULL;
        if (t != NULL && take_connection(s, t, w)) {
            if (t->serving++ == 0)
                pthread_cond_signal(&s->served);
            t->picked_at = now;
            w->woken = t->woken;
            t->woken = false;
            w->watched = t->watched;
            w->watch_pid = t->watch_pid;
            w->first = !t->tried;
            w->lease_call = lease_call_of(s, t, now);
            w->streams = t->stream != NULL;
            w->tenant = t;
            taken = true;
            break;
        }
        if (t != NULL)
            /* every connection is held by a slot: one gives back soon */
            next = now + SCHEDULER_CONNECTION_WAIT_SECONDS;
        scheduler_wait(s, &s->changed, next);
    }
    metrics_databases_set_connections(s->database_metrics, s->open, s->budget);
    pthread_mutex_unlock(&s->lock);
    outbox_store_free(w->to_close);
    w->to_close = NULL;
    return taken;
}

/* ---- the scheduler's life ------------------------------------------------ */

void
scheduler_wait(struct scheduler *s, pthread_cond_t *cond, double until)
{
    struct timespec at = {.tv_sec = (time_t)until};

    at.tv_nsec = (long)((until - (double)at.tv_sec) * 1e9);
    pthread_cond_timedwait(cond, &s->lock, &at);
}

int
scheduler_slot_count(const struct relay_config *config)
{
    /* the own database's: --concurrency for its rows, as many for its streams, one for its
     * upkeep, within the budget */
    if (config->databases_file != NULL || 2 * config->concurrency + 1 > config->max_db_connections)
        return config->max_db_connections;
    return 2 * config->concurrency + 1;
}

const char *
scheduler_source(const struct scheduler *s)
{
    return s->kind == TENANT_LISTED ? s->relay->config->databases_file : "--database-url";
}

/* The databases s serves: the list's (--databases), or the relay's own. 0, or -1 with err. */
static int
read_databases(struct scheduler *s, struct outbox_error *err)
{
    const struct relay_config *config = s->relay->config;
    struct database_list list;
    int rc;

    if (s->kind == TENANT_OWN) {
        if (scheduler_add_own(s, config->database_url) != 0)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return 0;
    }
    s->stamp = database_file_stamp(config->databases_file);
    if (database_list_read(config->databases_file, &list, err) != 0)
        return -1;
    rc = scheduler_apply_list(s, &list, LIST_AT_START);
    database_list_clear(&list);
    if (rc != 0)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

struct scheduler *
scheduler_new(relay *r, struct outbox_error *err)
{
    struct scheduler *s = calloc(1, sizeof(*s));
    pthread_condattr_t attributes;

    if (s == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    s->relay = r;
    s->budget = s->slots = scheduler_slot_count(r->config);
    s->kind = r->config->databases_file != NULL ? TENANT_LISTED : TENANT_OWN;
    scheduler_divide_own_slots(s);
    s->database_metrics = s->kind == TENANT_LISTED ? metrics_databases_of(r->metrics) : NULL;
    s->streams = stream_runner_new(r->config, r->worker_prefix, r->metrics, err);
    s->seed = (unsigned int)time(NULL) ^ 0x27d4eb2du;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&s->changed, &attributes);
    pthread_cond_init(&s->served, &attributes);
    pthread_condattr_destroy(&attributes);
    if (s->streams == NULL || read_databases(s, err) != 0) {
        scheduler_free(s);
        return NULL;
    }
    s->started_at = clock_monotonic_seconds();
    s->list_look_at = s->started_at + SCHEDULER_LIST_LOOK_SECONDS;
    /* the uuid of the relay's worker prefix (host:pid:uuid) names its watch's sessions */
    snprintf(s->watch_name, sizeof(s->watch_name), "%s%s", WATCH_NAME_PREFIX,
             strrchr(r->worker_prefix, ':') + 1);
    /* the relay's own database is woken by its NOTIFY, on the connections its slots keep */
    s->watch_looked = s->kind == TENANT_OWN;
    s->watch = s->kind == TENANT_LISTED ? scheduler_watch_new(s->watch_name, r->config->lease_seconds)
                                        : NULL;
    s->watch_started =
        s->watch != NULL && pthread_create(&s->watch_thread, NULL, scheduler_watch_run, s) == 0;
    return s;
}

void
scheduler_free(struct scheduler *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    atomic_store(&s->watch_quit, true);
    pthread_cond_signal(&s->served);
    pthread_mutex_unlock(&s->lock);
    if (s->watch_started)
        pthread_join(s->watch_thread, NULL);
    scheduler_watch_free(s->watch, scheduler_watch_give, s);
    scheduler_release_leases(s);
    for (size_t i = 0; i < s->count; i++)
        scheduler_tenant_free(s, s->tenants[i]);
    pthread_mutex_lock(&s->lock);
    scheduler_free_released(s);
    while (s->released != NULL) { /* waiting for a connection: the relay's watch ends anyway */
        struct tenant *t = s->released;

        s->released = t->released_next;
        scheduler_tenant_free(s, t);
    }
    pthread_mutex_unlock(&s->lock);
    free(s->tenants);
    stream_runner_free(s->streams);
    pthread_cond_destroy(&s->changed);
    pthread_cond_destroy(&s->served);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void
scheduler_stop(struct scheduler *s)
{
    if (s == NULL)
        return;
    stream_runner_stop(s->streams); /* a stream pass ends after its batch in flight */
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->changed);
    pthread_cond_signal(&s->served); /* the watch ends its rest */
    pthread_mutex_unlock(&s->lock);
}

/* Records a failed try of t: backoff, one log line a minute, health. Under the lock. */
static void
record_fault(struct scheduler *s, struct tenant *t, const struct outbox_error *cause, double now)
{
    unsigned long repeats;

    LOCK_ASSERT_HELD(&s->lock);
    t->down = true;
    atomic_store(&t->checked, false);
    t->backlog = false;
    /* the own database's slots each reconnect at once and then at their own pace (ends_connect()):
     * the faults of its many slots at once must not add up to one long wait */
    t->due = t->kind == TENANT_OWN ? now : now + backoff_next(&t->retry);
    /* the own database's faults were logged by the slot that met them (ends.c) */
    if (t->kind == TENANT_LISTED && cause_log_due(&t->log, cause->message, &repeats))
        log_event(OUTBOX_LOG_WARN, "database unavailable, retrying",
                  "database=%s error=\"%s\" repeats=%lu", t->name, cause->message, repeats);
    metrics_databases_set_state(s->database_metrics, t->name, false,
                                cause->message);
}

/* Records whether this relay holds t's lease now. Under the lock. */
static void
record_lease(struct scheduler *s, struct tenant *t, const struct store_database_lease *lease)
{
    bool held = lease->held, paused = lease->paused;

    LOCK_ASSERT_HELD(&s->lock);
    if (t->kind == TENANT_OWN)
        return; /* no lease; a pause holds its claims */
    if (paused != t->paused)
        log_event(OUTBOX_LOG_INFO, paused ? "database paused, not served" : "database resumed",
                  "database=%s", t->name);
    t->paused = paused;
    if (held != t->held)
        log_event(OUTBOX_LOG_INFO, held ? "database lease taken" : "database lease given up",
                  "database=%s", t->name);
    t->held = held;
    t->lease_watched = lease->owner_watched;
    t->wins = lease->wins;
    metrics_databases_set_served(s->database_metrics, t->name, held);
}

/*
 * How long t rests after a slice that found no more rows: its idle wait,
 * or, when the watch covers it and saw no change meanwhile, until its next
 * scheduled row or the next visit its lease asks for, whichever comes first
 * (the watch wakes it earlier on a change), and within a sweep's period
 * while rows wait behind their keys. After a slice that published
 * rows, a watched database is looked at once more a second later: a
 * backend reports its statistics at most once a second, and holds back a
 * commit that came within that second until it has been idle for 10 s
 * (PostgreSQL's PGSTAT_IDLE_INTERVAL), so a burst's last rows may not wake
 * it. Under the lock.
 */
static double
rest_length(const struct scheduler *s, const struct tenant *t, const struct work *w, double now)
{
    double wait = t->lease_watched ? SCHEDULER_WATCHED_VISIT_SECONDS
                                   : s->relay->config->lease_seconds / SCHEDULER_VISIT_PER_LEASE;

    LOCK_ASSERT_HELD(&s->lock);
    if (!w->watched || t->woken || w->streams_wait)
        return t->idle_wait;
    /* a producer's commit within a second of its last reported one shows late */
    if (now < t->rows_at + SCHEDULER_WATCH_AFTER_ROWS_SECONDS)
        return t->rows_at + SCHEDULER_WATCH_AFTER_ROWS_SECONDS - now;
    if (w->next_ready >= 0 && w->next_ready < wait)
        wait = w->next_ready;
    /* rows held behind their keys: the next sweep of them (maintain()) is due by then */
    if (w->held_rows && MAINTENANCE_REAP_EVERY_SECONDS < wait)
        wait = MAINTENANCE_REAP_EVERY_SECONDS;
    return wait > t->idle_wait ? wait : t->idle_wait;
}

/*
 * When t, which another relay holds or none may hold, is looked at again:
 * soon when this relay should hold it (the owner gives it up at its next
 * visit, which the watch wakes), seldom when the owner's (or, for a free
 * lease, the winner's) watch keeps the lease (this relay's watch wakes t
 * when the relays change, and on a resume when it wins), else four times a
 * lease, to stay a member and to take over. Under the lock.
 */
static double
visit_again(struct scheduler *s, struct tenant *t, const struct work *w,
            const struct store_database_lease *lease)
{
    double quarter = s->relay->config->lease_seconds / SCHEDULER_VISIT_PER_LEASE;
    double wait;

    LOCK_ASSERT_HELD(&s->lock);
    if (lease->wins && !lease->paused && lease->owner_watched) {
        wait = t->takeover_wait < quarter ? t->takeover_wait : quarter;
        t->takeover_wait = wait * 2;
        return wait;
    }
    t->takeover_wait = SCHEDULER_TAKEOVER_FIRST_SECONDS;
    return lease->owner_watched && w->watched ? SCHEDULER_WATCHED_VISIT_SECONDS : quarter;
}

/*
 * When t, which this relay holds, is looked at again after a slice: at once
 * while it has rows, else after its idle wait. A change the watch saw while
 * the lease was kept without a call may be the lease's own (a winner
 * recording itself as a member, a pause of the whole database): the
 * lease's function then runs a quarter of a lease after its last call,
 * whatever the database's rows do meanwhile. Under the lock.
 */
static void
rest(struct scheduler *s, struct tenant *t, const struct work *w,
     const struct pipeline_slice *slice, double now)
{
    double recheck_at;

    LOCK_ASSERT_HELD(&s->lock);
    if (w->lease_call != LEASE_KEPT) {
        t->lease_taken_at = now;
        t->lease_recheck = false;
    } else if (w->woken) {
        t->lease_recheck = true;
    }
    if (slice->more) {
        t->rows_at = now;
        t->idle_wait = s->relay->config->poll_interval_ms / 1000.0;
        t->due = now;
        return;
    }
    /* a slice that published rows starts the idle wait afresh: the database's next row,
     * which the watch wakes it for, waits for no longer a rest than the last one did */
    if (slice->claimed > 0) {
        t->rows_at = now;
        t->idle_wait = s->relay->config->poll_interval_ms / 1000.0;
    }
    t->due = now + rest_length(s, t, w, now);
    if (slice->claimed == 0)
        t->idle_wait = t->idle_wait * 2 < SCHEDULER_IDLE_MAX_SECONDS ? t->idle_wait * 2
                                                                     : SCHEDULER_IDLE_MAX_SECONDS;
    recheck_at = t->lease_taken_at + s->relay->config->lease_seconds / SCHEDULER_VISIT_PER_LEASE;
    if (t->lease_recheck && recheck_at < t->due)
        t->due = recheck_at;
}

/* Gives w's database and connection back after a slice. */
static void
give_work_back(struct scheduler *s, struct work *w, const struct pipeline_slice *slice,
               const struct outbox_error *cause, const struct store_database_lease *lease)
{
    struct tenant *t = w->tenant;
    double now = clock_monotonic_seconds();
    outbox_store *to_close = NULL;

    pthread_mutex_lock(&s->lock);
    t->serving--;
    if (w->connection.db.store == NULL) {
        s->open--;
        if (!w->unconnected) {
            record_lease(s, t, &(struct store_database_lease){.paused = t->paused});
            record_fault(s, t, cause, now);
        }
    } else {
        if (t->down || !t->tried)
            log_event(t->down ? OUTBOX_LOG_INFO : OUTBOX_LOG_DEBUG,
                      t->down ? "database available again" : "database connected",
                      "database=%s", t->name);
        t->down = false;
        backoff_reset(&t->retry);
        metrics_databases_set_state(s->database_metrics, t->name, true, NULL);
        record_lease(s, t, lease);
        t->backlog = slice->full;
        if (!lease->held)
            t->due = now + visit_again(s, t, w, lease);
        else
            rest(s, t, w, slice, now);
        t->visited_at = now;
        /* a removed database's is closed by scheduler_release_removed, giving the leases up on it
         */
        if (relay_stopping(s->relay)) {
            to_close = w->connection.db.store;
            s->open--;
        } else {
            w->connection.used_at = now;
            t->idle[t->idle_count++] = w->connection;
        }
    }
    t->tried = true;
    if (t->removed)
        scheduler_release_removed(s);
    metrics_databases_set_connections(s->database_metrics, s->open, s->budget);
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    outbox_store_free(to_close);
}

void *
scheduler_slot_run(void *arg)
{
    struct pipeline *p = arg;
    relay *r = p->relay;
    struct scheduler *s = r->scheduler;
    struct slot_role role;

    p->deferral = backoff_make(PIPELINE_DEFERRED_PAUSE_FIRST_SECONDS,
                               PIPELINE_DEFERRED_PAUSE_MAX_SECONDS, p->db.seed ^ 0x5bd1e995u);
    p->db.faults = DATABASE_FAULT_BACKS_OFF;
    /* the relay's own database's slots are its pipelines and its maintenance, as the log has
     * always named them */
    role = scheduler_slot_role(s, p);
    if (s->kind == TENANT_LISTED)
        snprintf(p->db.who, sizeof(p->db.who), "slot=%d", p->index);
    else if (!role.rows && !role.streams)
        snprintf(p->db.who, sizeof(p->db.who), "thread=maintenance");
    else if (!role.rows)
        snprintf(p->db.who, sizeof(p->db.who), "thread=stream index=%d", role.worker);
    else
        snprintf(p->db.who, sizeof(p->db.who), "pipeline=%d", p->index);
    /* the own database's slots connect their broker with it (connect_tenant) */
    if (s->kind == TENANT_OWN || ends_connect_sink(p, ENDS_FIRST) == 0) {
        struct work w;

        p->progress_at = clock_monotonic_seconds();
        outbox_error_set(&p->cause, OUTBOX_ERR_CONNECTION, "no claim succeeded");
        while (take_work(s, role, &w)) {
            struct outbox_error cause;
            struct store_database_lease lease;
            struct pipeline_idle idle = {0};
            struct pipeline_slice slice = scheduler_serve_slice(p, &w, &cause, &lease);

            while (scheduler_keep_serving(p, &w, &slice, &idle, &cause))
                slice = scheduler_serve_slice(p, &w, &cause, &lease);
            give_work_back(s, &w, &slice, &cause, &lease);
            if (scheduler_once_done(p, &w, &slice))
                break;
        }
    }
    ends_broker_close(p);
    relay_thread_returned(r);
    return NULL;
}
