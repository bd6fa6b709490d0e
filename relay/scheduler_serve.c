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

/*
 * Calls the database's lease function on w's connection when the visit's
 * call comes at this step (when), into *lease; before the slice, a lease
 * not called then is the one this relay's watch keeps. A lease not held
 * gives the database's stream partitions up. -1 with why in *cause when
 * the call failed: the connection is dropped.
 */
static int
lease_step(struct pipeline *p, struct work *w, enum lease_call when,
           struct store_database_lease *lease, struct outbox_error *cause)
{
    if (w->lease_call != when) {
        if (when == LEASE_BEFORE)
            *lease =
                (struct store_database_lease){.held = true, .wins = true, .owner_watched = true};
        return 0;
    }
    if (store_database_lease_take(outbox_store_conn(w->connection.db.store),
                                  p->relay->worker_prefix, p->relay->config->lease_seconds,
                                  w->watched ? p->relay->scheduler->watch_name : NULL,
                                  w->watched ? w->watch_pid : 0, lease, cause) != 0) {
        outbox_store_free(w->connection.db.store);
        w->connection.db.store = NULL;
        return -1;
    }
    if (!lease->held)
        scheduler_stream_lease_lost(p->relay->scheduler, w->tenant, &w->connection);
    return 0;
}

/*
 * The stream part of a visit on slot p, after the rows, until `until`: its
 * rows count in the slice's (rows read as claimed; more when a pass ran
 * out of time). Returns the rows it settled. A failure drops the
 * connection, cause saying why.
 */
static uint64_t
serve_streams(struct pipeline *p, struct work *w, double until, struct pipeline_slice *slice,
              struct outbox_error *cause)
{
    struct stream_visit visit;

    if (w->connection.db.store == NULL || !w->role.streams)
        return 0;
    if (scheduler_stream_serve(p->relay->scheduler, p, w, until, &visit, cause) != 0) {
        outbox_store_free(w->connection.db.store); /* it may hold the statement still */
        w->connection.db.store = NULL;
        return 0;
    }
    slice->claimed += visit.rows;
    slice->more |= visit.more;
    w->streams_wait = visit.waiting;
    return visit.settled;
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

/*
 * The rows' part of a visit of w's database on slot p, on the connection
 * w holds: reaped before the slice when the lease was not held (a stopped
 * relay's claimed rows go out in this visit), else after it (the woken
 * rows first); the slice is timed from its first claim (a slow connect,
 * lease call or maintenance left no time for one, and the database rested
 * as if empty: stranded, rows ready). Its findings into *slice; the time
 * it started.
 */
static double
serve_rows(struct pipeline *p, struct work *w, struct pipeline_slice *slice,
           struct outbox_error *cause)
{
    struct database *db = &w->connection.db;
    bool own = w->tenant->kind == TENANT_OWN;
    double started;
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
    started = clock_monotonic_seconds();
    *slice = (struct pipeline_slice){0};
    if (db->store == NULL ||
        pipeline_serve(p, db, slice_end(w, started, streams), slice) == SERVE_FAILED) {
        *cause = p->cause.code != OUTBOX_OK ? p->cause : *cause;
        return started;
    }
    /* rows the sweep freed after the slice are due now */
    if (w->lease_call != LEASE_BEFORE && !own && maintain(p, db, w->tenant) > 0)
        slice->more = true;
    if (db->store == NULL)
        *cause = p->cause;
    return started;
}

/*
 * The upkeep slot's turn of the relay's own database: its maintenance
 * phases due, then its streams' (scheduler_stream_upkeep()); when it is due
 * again into w->look_at. A failure drops the connection, why in *cause.
 */
static struct pipeline_slice
serve_upkeep(struct pipeline *p, struct work *w, struct outbox_error *cause)
{
    struct tenant *t = w->tenant;
    struct database *db = &w->connection.db;
    struct pipeline_slice slice = {.drained = true};
    double next = clock_monotonic_seconds() + MAINTENANCE_REAP_EVERY_SECONDS;

    if (db->store == NULL && connect_tenant(p, w, cause) != 0)
        return slice;
    snprintf(db->who, sizeof(db->who), "%s", p->db.who);
    db->log_owner = &p->db;
    maintain(p, db, t);
    if (db->store != NULL &&
        scheduler_stream_upkeep(p->relay->scheduler, t, &w->connection, &next, cause) != 0) {
        ends_store_failed(p, db, cause); /* logged as the relay's; it may hold the statement */
        return slice;
    }
    if (db->store == NULL) {
        *cause = p->cause;
        return slice;
    }
    w->look_at = next;
    if (maintenance_next_due(&t->maintenance) < next)
        w->look_at = maintenance_next_due(&t->maintenance);
    return slice;
}

/*
 * A stream slot's turn of the relay's own database: its share of the stream
 * partitions published, pass after pass, for a second at most, on a
 * connection whose stream statements keep generic plans. None while the
 * database has no stream queue (its upkeep slot looks for one): the slot
 * then holds no connection, and waits for w->look_at.
 */
static struct pipeline_slice
serve_stream_slot(struct pipeline *p, struct work *w, struct outbox_error *cause)
{
    struct scheduler *s = p->relay->scheduler;
    struct tenant *t = w->tenant;
    struct pipeline_slice slice = {.drained = true};
    struct stream_visit visit;
    double now = clock_monotonic_seconds();

    /* the upkeep slot looks for a stream queue at once, then every few seconds */
    w->look_at = now + (p->relay->config->once ? 0.05 : MAINTENANCE_STREAM_CHECK_EVERY_SECONDS / 4);
    w->unconnected = !scheduler_stream_known(s, t);
    if (w->unconnected)
        return slice;
    if (w->connection.db.store == NULL && connect_tenant(p, w, cause) != 0)
        return slice;
    w->connection.streams_only = true;
    w->connection.db.log_owner = &p->db;
    snprintf(w->connection.db.who, sizeof(w->connection.db.who), "%s", p->db.who);
    if (scheduler_stream_serve(s, p, w, now + SCHEDULER_STREAM_TURN_SECONDS, &visit, cause) !=
        0) {
        ends_store_failed(p, &w->connection.db, cause); /* it may hold the statement still */
        return slice;
    }
    slice.claimed = visit.rows;
    slice.more = visit.more;
    slice.drained = !visit.more;
    return slice;
}

/*
 * Serves w's database for one slice on slot p. The slice's findings; the
 * connection is left in w (store NULL when the database failed, with why in
 * *cause).
 */
struct pipeline_slice
scheduler_serve_slice(struct pipeline *p, struct work *w, struct outbox_error *cause,
                      struct store_database_lease *lease)
{
    struct tenant *t = w->tenant;
    struct pipeline_slice slice = {0};
    uint64_t completed = p->rows_completed, settled;
    struct outbox_error next_err;
    double started;
    unsigned long connects;

    *lease = (struct store_database_lease){0};
    outbox_error_set(cause, OUTBOX_ERR_CONNECTION, "no cause recorded");
    if (upkeep_slot(w))
        return serve_upkeep(p, w, cause);
    if (stream_slot(w))
        return serve_stream_slot(p, w, cause);
    if (w->connection.db.store == NULL &&
        connect_tenant(p, w, cause) != 0)
        return slice;
    /* the lease first: a database another relay serves is only visited, to stay a member */
    if (lease_step(p, w, LEASE_BEFORE, lease, cause) != 0 || !lease->held)
        return slice;
    connects = w->connection.db.connects;
    started = serve_rows(p, w, &slice, cause);
    /* a reconnect within the slice (settle_now) may have replaced the connection */
    w->connection.stream_ready &= w->connection.db.connects == connects;
    settled = serve_streams(p, w, started + SCHEDULER_SLICE_SECONDS, &slice, cause);
    /* its backlog and identity, when due or as it goes to rest (scheduler_sample.c); before
     * next_ready, whose forced statistics report stays the visit's last statement */
    if (w->connection.db.store != NULL && lease->held && t->kind == TENANT_LISTED &&
        scheduler_sample(p->relay->scheduler, t, &w->connection, w->watched && !slice.more,
                         slice.claimed > 0, cause) != 0) {
        outbox_store_free(w->connection.db.store);
        w->connection.db.store = NULL;
    }
    w->next_ready = -1;
    if (w->connection.db.store != NULL && lease_step(p, w, LEASE_AFTER, lease, cause) == 0 &&
        w->watched && !slice.more &&
        store_database_next_ready(outbox_store_conn(w->connection.db.store), &w->next_ready,
                                  &w->held_rows, &next_err) != 0) {
        /* the connection may hold the statement still: dropped, the database tried again */
        outbox_store_free(w->connection.db.store);
        w->connection.db.store = NULL;
        *cause = next_err;
    }
    metrics_databases_add(p->relay->scheduler->database_metrics, t->name, slice.claimed,
                          p->rows_completed - completed + settled);
    return slice;
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
