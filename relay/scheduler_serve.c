/*
 * scheduler_serve.c - a slice of a database served by a slot: its
 * connection opened, its lease called, its maintenance due, its rows and
 * its stream queues served, its backlog sampled; and whether the slot keeps
 * the database for another slice. See scheduler.h and docs/design.md
 * "One relay".
 */
#include "scheduler_state.h"
#include "scheduler_stream.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "ends.h"
#include "error.h"
#include "log.h"
#include "maintenance.h"
#include "pipeline.h"
#include "store_database_lease.h"
#include "timeouts.h"
#include "wait.h"

/* The own database's slot of w does its upkeep alone (the last of two or more). */
static bool
upkeep_slot(const struct work *w)
{
    return w->tenant->kind == TENANT_OWN && !w->role.rows && !w->role.streams;
}

/* The own database's slot of w publishes its stream partitions alone. */
static bool
stream_slot(const struct work *w)
{
    return w->tenant->kind == TENANT_OWN && w->role.streams && !w->role.rows;
}

/*
 * Opens a connection to w's database t for slot p into w->connection
 * (ends_connect(), database_open()), and records t's identity. A connection
 * to a database of a list is tried once (the scheduler backs the database
 * off), its notices logged under t's name. One to the relay's own database
 * is a pipeline's: its faults the relay's, its notices under the slot's
 * name, tried until it connects with the slot's broker (at the first try a
 * fault no retry mends, a refused password or no schema, stops the relay;
 * --once gives up after its budget). -1 with err.
 */
static int
connect_tenant(struct pipeline *p, struct work *w, struct outbox_error *err)
{
    struct tenant *t = w->tenant;
    struct idle_connection *c = &w->connection;
    bool own = t->kind == TENANT_OWN;
    /* a visit runs few statements: each is prepared when first run, and the schema
     * and privileges are checked again only after the database failed (a revoke or
     * an older schema meanwhile fails its statement with PostgreSQL's message) */
    const struct store_connect_options visit = {.prepare_lazily = true,
                                                .checked = atomic_load(&t->checked),
                                                .lock_timeout_ms = SCHEDULER_LOCK_TIMEOUT_MS};

    c->db = (struct database){.relay = p->relay,
                              .url = t->url,
                              .notice_who = own ? p->db.who : t->who,
                              .faults = own ? DATABASE_FAULT_STOPS_RELAY : DATABASE_FAULT_BACKS_OFF,
                              .steps = own ? NULL : &visit,
                              .seed = p->db.seed,
                              .reconnect = p->db.reconnect,
                              .log_owner = &p->db};
    snprintf(c->db.worker_id, sizeof(c->db.worker_id), "%s", p->db.worker_id);
    snprintf(c->db.who, sizeof(c->db.who), "%s", own ? p->db.who : t->who);
    /* the own database's slots connect their broker with it, but the upkeep slot, which leaves
     * --once's budget to them (it gives up naming the ends they could not reach) */
    c->db.waits_out_once = upkeep_slot(w);
    if (ends_connect(&c->db, p, own && !upkeep_slot(w) ? ENDS_STORE | ENDS_SINK : ENDS_STORE,
                     own && w->first ? ENDS_FIRST : ENDS_AGAIN) != 0) {
        *err = p->cause;
        outbox_store_free(c->db.store);
        c->db.store = NULL;
        return -1;
    }
    c->db.steps = NULL;
    atomic_store(&t->checked, true);
    scheduler_identity_seen(p->relay->scheduler, t, c->db.identity.database_id);
    return 0;
}

/*
 * The maintenance phases due on t (maintenance_visit()), on db that slot p
 * serves, unless another slot serving t runs them now: a list's database's
 * phases a step each, the own database's all of them, each to its bound
 * (with --once, until done). The rows the sweep released: they can be
 * claimed at once. A failure drops the connection.
 */
static size_t
maintain(struct pipeline *p, struct database *db, struct tenant *t)
{
    enum maintenance_pace pace = t->kind == TENANT_LISTED ? MAINTENANCE_STEP
                                 : p->relay->config->once ? MAINTENANCE_WHOLE
                                                          : MAINTENANCE_RUN;
    struct outbox_error err;
    size_t readied = 0;
    int rc;

    if (!scheduler_upkeep_take(t))
        return 0;
    rc = maintenance_visit(p->relay, db->store, t->who, pace, &t->maintenance, &readied, &err);
    scheduler_upkeep_give(t);
    if (rc != 0) {
        ends_store_failed(p, db, &err);
        return 0;
    }
    return readied;
}

/* One slice of w's database on slot p, as its steps pass it on. */
struct slice {
    struct pipeline *p;
    struct work *w;
    struct pipeline_slice found;        /* what the slice found: its result */
    struct outbox_error *cause;         /* why its connection was dropped */
    struct store_database_lease *lease; /* what the database's lease function said */
    uint64_t completed;                 /* the slot's rows completed before the slice */
    uint64_t settled;                   /* the stream rows the slice settled */
    double started;                     /* when its rows' part started */
};

/*
 * A step of a slice. False ends the slice there (its connection kept, or
 * dropped with why in s->cause); a step after a failure finds no connection
 * and passes.
 */
typedef bool slice_step(struct slice *s);

/* Drops the slice's connection, which may hold a statement still (why is in s->cause). */
static void
slice_drop(struct slice *s)
{
    outbox_store_free(s->w->connection.db.store);
    s->w->connection.db.store = NULL;
}

/*
 * Calls the database's lease function on the slice's connection when the
 * visit's call comes at this step (when), into s->lease; before the slice,
 * a lease not called then is the one this relay's watch keeps. A lease not
 * held gives the database's stream partitions up. -1 when the call failed:
 * the connection is dropped.
 */
static int
lease_step(struct slice *s, enum lease_call when)
{
    struct pipeline *p = s->p;
    struct work *w = s->w;

    if (w->lease_call != when) {
        if (when == LEASE_BEFORE)
            *s->lease =
                (struct store_database_lease){.held = true, .wins = true, .owner_watched = true};
        return 0;
    }
    if (store_database_lease_take(outbox_store_conn(w->connection.db.store),
                                  p->relay->worker_prefix, p->relay->config->lease_seconds,
                                  w->watched ? p->relay->scheduler->watch_name : NULL,
                                  w->watched ? w->watch_pid : 0, s->lease, s->cause) != 0) {
        slice_drop(s);
        return -1;
    }
    if (!s->lease->held)
        scheduler_stream_lease_lost(p->relay->scheduler, w->tenant, &w->connection);
    return 0;
}

/*
 * When the rows' part of a slice that starts at started ends: a slot that
 * serves the own database's rows alone serves them until they are drained
 * (its turns keep the database and the broker busy at once, which a slice's
 * end interrupts; nothing else waits for the slot); else after a slice, half
 * of it when the slot publishes the database's streams next.
 */
static double
slice_end(const struct work *w, double started, bool streams)
{
    if (w->tenant->kind == TENANT_OWN && !w->role.streams && !w->role.upkeep)
        return 1e300;
    return started + SCHEDULER_SLICE_SECONDS / (streams ? 2 : 1);
}

/* ---- the steps ----------------------------------------------------------- */

/* Connects to w's database, unless the slot kept its connection. */
static bool
step_connect(struct slice *s)
{
    return s->w->connection.db.store != NULL || connect_tenant(s->p, s->w, s->cause) == 0;
}

/* The lease first: a database another relay serves is only visited, to stay a member. */
static bool
step_lease(struct slice *s)
{
    return lease_step(s, LEASE_BEFORE) == 0 && s->lease->held;
}

/*
 * The rows' part of the visit, on the connection w holds: reaped before the
 * slice when the lease was not held (a stopped relay's claimed rows go out
 * in this visit), else after it (the woken rows first); the slice is timed
 * from its first claim (a slow connect, lease call or maintenance left no
 * time for one, and the database rested as if empty: stranded, rows ready).
 */
static bool
step_rows(struct slice *s)
{
    struct pipeline *p = s->p;
    struct work *w = s->w;
    struct database *db = &w->connection.db;
    bool own = w->tenant->kind == TENANT_OWN;
    unsigned long connects = db->connects;
    bool streams;

    if (own)
        snprintf(db->who, sizeof(db->who), "%s", p->db.who);
    else
        snprintf(db->who, sizeof(db->who), "database=%s slot=%d", w->tenant->name, p->index);
    db->log_owner = &p->db; /* its lines limited per slot */
    if (own && w->role.streams && !w->streams) /* a stream queue may have come since */
        w->streams = scheduler_stream_known(p->relay->scheduler, w->tenant);
    streams = w->streams && w->role.streams;
    p->cause = (struct outbox_error){.code = OUTBOX_OK};
    if (w->lease_call == LEASE_BEFORE || (own && p->relay->scheduler->slots == 1))
        maintain(p, db, w->tenant);
    /* --once: no claim before the first reap (by the upkeep slot) */
    if (own && p->relay->config->once && db->store != NULL)
        wait_until(&p->relay->stop, p->relay->reaped.fd, WAIT_FOREVER);
    s->started = clock_monotonic_seconds();
    if (db->store == NULL ||
        pipeline_serve(p, db, slice_end(w, s->started, streams), &s->found) == SERVE_FAILED) {
        *s->cause = p->cause.code != OUTBOX_OK ? p->cause : *s->cause;
    } else {
        /* rows the sweep freed after the slice are due now */
        if (w->lease_call != LEASE_BEFORE && !own && maintain(p, db, w->tenant) > 0)
            s->found.more = true;
        if (db->store == NULL)
            *s->cause = p->cause;
    }
    /* a reconnect within the slice (settle_now) may have replaced the connection */
    w->connection.stream_ready &= db->connects == connects;
    return true;
}

/*
 * The stream part of the visit, after the rows, until a slice after they
 * started: its rows count in the slice's (rows read as claimed; more when a
 * pass ran out of time).
 */
static bool
step_streams(struct slice *s)
{
    struct work *w = s->w;
    struct stream_visit visit;

    if (w->connection.db.store == NULL || !w->role.streams)
        return true;
    if (scheduler_stream_serve(s->p->relay->scheduler, s->p, w,
                               s->started + SCHEDULER_SLICE_SECONDS, &visit, s->cause) != 0) {
        slice_drop(s);
        return true;
    }
    s->found.claimed += visit.rows;
    s->found.more |= visit.more;
    w->streams_wait = visit.waiting;
    s->settled = visit.settled;
    return true;
}

/*
 * A listed database's backlog and identity, when due or as it goes to rest
 * (scheduler_sample.c); before next_ready, whose forced statistics report
 * stays the visit's last statement.
 */
static bool
step_sample(struct slice *s)
{
    struct work *w = s->w;

    if (w->connection.db.store != NULL && w->tenant->kind == TENANT_LISTED &&
        scheduler_sample(s->p->relay->scheduler, w->tenant, &w->connection,
                         w->watched && !s->found.more, s->found.claimed > 0, s->cause) != 0)
        slice_drop(s);
    return true;
}

/*
 * The lease called after the slice when the visit calls it then; as a
 * watched database goes to rest, when its next row is due and whether rows
 * wait behind their keys (store_database_next_ready()).
 */
static bool
step_next_ready(struct slice *s)
{
    struct work *w = s->w;

    w->next_ready = -1;
    if (w->connection.db.store != NULL && lease_step(s, LEASE_AFTER) == 0 && w->watched &&
        !s->found.more &&
        store_database_next_ready(outbox_store_conn(w->connection.db.store), &w->next_ready,
                                  &w->held_rows, s->cause) != 0)
        slice_drop(s); /* the database tried again */
    return true;
}

/* The rows the slice claimed and completed, into the database's counters. */
static bool
step_count(struct slice *s)
{
    metrics_databases_add(s->p->relay->scheduler->database_metrics, s->w->tenant->name,
                          s->found.claimed, s->p->rows_completed - s->completed + s->settled);
    return true;
}

/*
 * The upkeep slot's turn of the relay's own database: its maintenance
 * phases due, then its streams' (scheduler_stream_upkeep()); when it is due
 * again into w->look_at.
 */
static bool
step_upkeep(struct slice *s)
{
    struct pipeline *p = s->p;
    struct work *w = s->w;
    struct tenant *t = w->tenant;
    struct database *db = &w->connection.db;
    double next = clock_monotonic_seconds() + MAINTENANCE_REAP_EVERY_SECONDS;

    s->found.drained = true;
    snprintf(db->who, sizeof(db->who), "%s", p->db.who);
    db->log_owner = &p->db;
    maintain(p, db, t);
    if (db->store != NULL &&
        scheduler_stream_upkeep(p->relay->scheduler, t, &w->connection, &next, s->cause) != 0) {
        ends_store_failed(p, db, s->cause); /* logged as the relay's; it may hold the statement */
        return false;
    }
    if (db->store == NULL) {
        *s->cause = p->cause;
        return false;
    }
    w->look_at = next;
    if (maintenance_next_due(&t->maintenance) < next)
        w->look_at = maintenance_next_due(&t->maintenance);
    return true;
}

/*
 * Whether a stream slot has stream partitions to publish: none while the
 * database has no stream queue (its upkeep slot looks for one, at once,
 * then every few seconds); the slot then holds no connection, and waits for
 * w->look_at.
 */
static bool
step_stream_look(struct slice *s)
{
    struct work *w = s->w;

    w->look_at = clock_monotonic_seconds() +
                 (s->p->relay->config->once ? 0.05 : MAINTENANCE_STREAM_CHECK_EVERY_SECONDS / 4);
    w->unconnected = !scheduler_stream_known(s->p->relay->scheduler, w->tenant);
    s->found.drained = true;
    return !w->unconnected;
}

/*
 * A stream slot's share of the own database's stream partitions published,
 * pass after pass, for a second at most, on a connection whose stream
 * statements keep generic plans.
 */
static bool
step_stream_pass(struct slice *s)
{
    struct pipeline *p = s->p;
    struct idle_connection *c = &s->w->connection;
    struct stream_visit visit;

    c->streams_only = true;
    c->db.log_owner = &p->db;
    snprintf(c->db.who, sizeof(c->db.who), "%s", p->db.who);
    if (scheduler_stream_serve(p->relay->scheduler, p, s->w,
                               clock_monotonic_seconds() + SCHEDULER_STREAM_TURN_SECONDS, &visit,
                               s->cause) != 0) {
        ends_store_failed(p, &c->db, s->cause); /* it may hold the statement still */
        return false;
    }
    s->found.claimed = visit.rows;
    s->found.more = visit.more;
    s->found.drained = !visit.more;
    return true;
}

/* A slice of each part a slot may have, step by step. */
static slice_step *const rows_slice[] = {step_connect, step_lease,      step_rows,  step_streams,
                                         step_sample,  step_next_ready, step_count, NULL};
static slice_step *const upkeep_slice[] = {step_connect, step_upkeep, NULL};
static slice_step *const stream_slice[] = {step_stream_look, step_connect, step_stream_pass, NULL};

/*
 * Serves w's database for one slice on slot p: the steps of the slot's
 * part, until one ends the slice. The slice's findings; the connection is
 * left in w (store NULL when the database failed, with why in *cause), what
 * the lease call said in *lease.
 */
struct pipeline_slice
scheduler_serve_slice(struct pipeline *p, struct work *w, struct outbox_error *cause,
                      struct store_database_lease *lease)
{
    slice_step *const *steps = upkeep_slot(w)   ? upkeep_slice
                               : stream_slot(w) ? stream_slice
                                                : rows_slice;
    struct slice s = {.p = p, .w = w, .cause = cause, .lease = lease,
                      .completed = p->rows_completed};

    *lease = (struct store_database_lease){0};
    outbox_error_set(cause, OUTBOX_ERR_CONNECTION, "no cause recorded");
    for (size_t i = 0; steps[i] != NULL && steps[i](&s); i++)
        ;
    return s.found;
}

/*
 * Whether slot p goes on serving w's database after a slice, keeping its
 * connection: the relay's own database does while it stays connected, the
 * next slice at once while rows come, else after pipeline_wait() (its
 * NOTIFY, or the adaptive poll, and no later than its maintenance is due);
 * with --once, not after a slice that drained it. A database of a list goes
 * back to the scheduler after each slice.
 */
bool
scheduler_keep_serving(struct pipeline *p, struct work *w, const struct pipeline_slice *slice,
                       struct pipeline_idle *idle, struct outbox_error *cause)
{
    struct tenant *t = w->tenant;
    double until = clock_monotonic_seconds() + MAINTENANCE_REAP_EVERY_SECONDS;

    if (t->kind != TENANT_OWN || relay_stopping(p->relay))
        return false;
    if (stream_slot(w) && w->connection.db.store == NULL) {
        /* read first: a look that found a stream queue has made its workers by then */
        bool looked = scheduler_stream_looked(p->relay->scheduler, t);

        if (!scheduler_stream_known(p->relay->scheduler, t)) { /* no stream queue yet */
            if (p->relay->config->once && looked)
                return false; /* and none when --once looked */
            wait_until(&p->relay->stop, -1, w->look_at);
            return !relay_stopping(p->relay);
        }
    }
    if (w->connection.db.store == NULL)
        return false;
    if (slice->more || !slice->drained) /* rows come, or the slice ended before they did */
        return true;
    if (p->relay->config->once)
        return false;
    if (upkeep_slot(w)) { /* until its next phase or stream upkeep is due */
        wait_until(&p->relay->stop, -1, w->look_at);
        return !relay_stopping(p->relay);
    }
    if (p->relay->scheduler->slots == 1 && scheduler_upkeep_take(t)) {
        until = maintenance_next_due(&t->maintenance);
        scheduler_upkeep_give(t);
    }
    pipeline_wait(p, &w->connection.db, idle, slice, until);
    if (w->connection.db.store == NULL)
        *cause = p->cause;
    return w->connection.db.store != NULL;
}

/*
 * --once: slot p is done once a slice drained the relay's own database (a
 * connect that gave up stopped the relay: ends_connect()).
 */
bool
scheduler_once_done(struct pipeline *p, const struct work *w, const struct pipeline_slice *slice)
{
    if (!p->relay->config->once || w->tenant->kind != TENANT_OWN)
        return false;
    /* a stream slot of a database without a stream queue, once its upkeep slot looked */
    if (stream_slot(w) && w->connection.db.store == NULL)
        return scheduler_stream_looked(p->relay->scheduler, w->tenant);
    return w->connection.db.store != NULL && !slice->more && slice->drained;
}
