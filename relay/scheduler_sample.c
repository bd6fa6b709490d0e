/*
 * scheduler_sample.c - what a visit of a listed database samples: its
 * backlog for /metrics (outbox_database_ready_rows, _oldest_ready_age_seconds,
 * _stranded) and its identity, which `outboxctl identity set` may have
 * changed since a connection read it. A statement or two on the visit's own
 * connection, after its slice: a database that no wake and no poll visits
 * costs nothing.
 */
#include "scheduler_state.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "store_database_lease.h"
#include "stream_worker.h"
#include "timeouts.h"

/*
 * Reads c's identity again (outbox.identity_observe()) and records it as
 * t's: rows of the next slice on c carry the new id. -1 with err.
 */
static int
take_identity(struct scheduler *s, struct tenant *t, struct idle_connection *c,
              unsigned generation, struct outbox_error *err)
{
    struct store_identity identity;

    if (store_identity_observe(outbox_store_conn(c->db.store), &identity, err) != 0)
        return -1;
    if (strcmp(identity.database_id, c->db.identity.database_id) != 0 ||
        identity.form != c->db.identity.form)
        log_event(OUTBOX_LOG_INFO, "database identity changed, taken without a restart",
                  "database=%s database_id=%s id_form=%s", t->name, identity.database_id,
                  store_id_form_name(identity.form));
    c->db.identity = identity;
    c->identity_generation = generation;
    scheduler_identity_seen(s, t, identity.database_id);
    return 0;
}

/*
 * Samples t on c: counted when due, else the probe alone, counted too when
 * the last count is a second old and the probe finds rows a claim would
 * take (rare at rest: another session locks them, or they came that
 * instant) or rows were claimed since a count that found a backlog (its
 * gauge falls to 0 as the backlog drains, not 15 s later; a paused queue's
 * rows, which no claim takes, are not counted again at each wake). Records it for
 * /metrics. -1 with err.
 */
static int
sample(struct scheduler *s, struct tenant *t, struct idle_connection *c, double now, bool claimed,
       struct store_database_sample *found, struct outbox_error *err)
{
    PGconn *conn = outbox_store_conn(c->db.store);
    bool count = now >= t->counted_at + SCHEDULER_SAMPLE_SECONDS;

    t->claimed_since_count |= claimed;
    if (store_database_sample(conn, s->streams->queues, count, found, err) != 0)
        return -1;
    if (!count && (found->claimable || (t->claimed_since_count && t->counted_rows)) &&
        now >= t->counted_at + SCHEDULER_SAMPLE_CLAIMABLE_SECONDS) {
        count = true;
        if (store_database_sample(conn, s->streams->queues, true, found, err) != 0)
            return -1;
    }
    if (count) {
        t->counted_at = now;
        t->counted_rows = found->ready > 0;
        t->claimed_since_count = false;
    }
    metrics_databases_set_sample(s->database_metrics, t->name, found);
    return 0;
}

/*
 * The sample of t on c, when due, and what it found: rows a resting visit
 * left claimable wake t; an identity changed since c read it moves t's
 * generation (*generation). Under t's upkeep. -1 with err.
 */
static int
sample_and_wake(struct scheduler *s, struct tenant *t, struct idle_connection *c, double now,
                bool resting, bool claimed, unsigned *generation, struct outbox_error *err)
{
    struct store_database_sample found;

    if (sample(s, t, c, now, claimed, &found, err) != 0)
        return -1;
    /* rows a claim would take, left by a visit that claimed none (another session
     * held them locked): polled until claimed, as nothing changes to wake it */
    if (resting && found.claimable) {
        pthread_mutex_lock(&s->lock);
        t->woken = true;
        pthread_mutex_unlock(&s->lock);
    }
    if (strcmp(found.database_id, c->db.identity.database_id) != 0 ||
        strcmp(found.id_form, store_id_form_name(c->db.identity.form)) != 0)
        *generation = atomic_fetch_add(&t->identity_generation, 1) + 1;
    return 0;
}

int
scheduler_sample(struct scheduler *s, struct tenant *t, struct idle_connection *c, bool resting,
                 bool claimed, struct outbox_error *err)
{
    double now = clock_monotonic_seconds();
    unsigned generation = atomic_load(&t->identity_generation);

    /* another slot serving t samples it now: this one reads the identity alone */
    if (scheduler_upkeep_take(t)) {
        int rc = 0;

        if (resting || now >= t->counted_at + SCHEDULER_SAMPLE_SECONDS)
            rc = sample_and_wake(s, t, c, now, resting, claimed, &generation, err);
        scheduler_upkeep_give(t);
        if (rc != 0)
            return -1;
    }
    /* a connection that read the identity before another's sample found it changed */
    if (c->identity_generation != generation)
        return take_identity(s, t, c, generation, err);
    return 0;
}
