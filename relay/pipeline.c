/*
 * pipeline.c - serving a database turn after turn (claim, publish,
 * settle) for a slot's slice, and the wait of a slot that keeps its
 * database between two slices (NOTIFY or the adaptive poll).
 *
 * A turn sends the marks of the batch published last and the claim of the
 * next batch to the database ahead of their results, publishes the current
 * batch meanwhile, then collects the results: the database and the broker
 * work at the same time, and no row is marked before the broker confirmed
 * it. On the way out the last batch is settled and a claim not published
 * is given back.
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
#include "pipeline.h"
#include "publish.h"
#include "settle.h"
#include "sink.h"
#include "wait.h"

/*
 * A turn of a pipeline. settlements[current] holds a claimed batch (empty
 * on the first turn and after an outage), settlements[previous] the batch
 * before it, published but not yet marked. The marks of the previous batch
 * and the next claim go to the database ahead of their results
 * (turn_claim), then the current batch is published while the database
 * works on them (publish_batch), then their results are collected
 * (turn_settle):
 *
 *   database  | mark N-1, claim N+1 |              | mark N, claim N+2 | ...
 *   broker    | publish N ........  |              | publish N+1 ....  |
 *
 * Afterwards the slots swap: settlements[current] holds the new claim.
 */
struct turn {
    bool marking;          /* the previous batch's marks were sent */
    bool claiming;         /* the next claim was sent */
    double next_claimed_at; /* taken before the claim was sent, so its lease began later */
};

/* connect: the broker, settling what was in flight before its outage. False when the relay stops.
 */
static bool
connect_broker(struct pipeline *p, struct database *db)
{
    if (sink_is_connected(p->sink))
        return true;
    /* published rows are marked and claimed ones given back before the outage */
    settle_now(p, db, &p->settlements[!p->current]);
    publish_give_back(p, db, &p->settlements[p->current].batch);
    return ends_connect_sink(p, ENDS_AGAIN) == 0;
}

/*
 * claim: sends the previous batch's marks and the next claim ahead of their
 * results; no claim once until has passed.
 */
static struct turn
turn_claim(struct pipeline *p, struct database *db, double *claimed_at, double until)
{
    relay *r = p->relay;
    const struct relay_config *c = r->config;
    struct settlement *current = &p->settlements[p->current];
    struct settlement *previous = &p->settlements[!p->current];
    struct turn t = {.next_claimed_at = clock_monotonic_seconds()};
    struct outbox_error err;

    /* before anything is sent ahead, so the claim below sees pauses a fifth of a second old at most */
    if (db->store != NULL && outbox_store_refresh_pauses(db->store, &err) != 0)
        ends_store_failed(p, db, &err);
    /* the last round trip before the publish, so the least time passes after it */
    publish_keep_held_rows(p, db, &current->batch, claimed_at);
    if (db->store != NULL && settlement_has_rows(previous))
        t.marking = settle_send(p, db, previous) == 0;
    if (db->store != NULL && !relay_stopping(r) && t.next_claimed_at < until) {
        if (outbox_claim_send(db->store, (const char *const *)c->queues, c->queue_count,
                              c->batch_size, c->lease_seconds, &err) == 0)
            t.claiming = true;
        else
            ends_store_failed(p, db, &err);
    }
    return t;
}

/*
 * settle: collects the marks and the claim sent by turn_claim(), then swaps
 * the slots. True when the claim was made (even if it found nothing), false
 * when it was not (until passed, stopping, or the database failed).
 */
static bool
turn_settle(struct pipeline *p, struct database *db, struct turn *t, double *claimed_at)
{
    relay *r = p->relay;
    struct settlement *previous = &p->settlements[!p->current];
    struct outbox_batch next = {0};
    struct outbox_error err;

    /* collecting the marks failed and dropped the connection: the claim is lost with it */
    if (t->marking && db->store != NULL && settle_receive(p, db, previous) != 0)
        t->claiming = false;
    if (t->claiming && outbox_claim_receive(db->store, &next, &err) != 0) {
        ends_store_failed(p, db, &err);
        t->claiming = false;
    }
    if (t->claiming) {
        metrics_add(r->metrics, METRICS_CLAIMS, 1);
        metrics_round_trip(r->metrics, METRICS_DATABASE);
    }
    /* marks not confirmed above (the database failed) get one more try */
    settle_now(p, db, previous);

    previous->batch = next;
    p->current = !p->current;
    *claimed_at = t->next_claimed_at;
    return t->claiming;
}

/*
 * --once must end: a pipeline that connects but moves no row (every claim
 * fails, a lock holds it, the broker defers every row because too few
 * replicas acknowledge) gives up when no turn has published a row (or failed
 * one through its own fault) for RELAY_ONCE_CONNECT_BUDGET_SECONDS, naming
 * the last cause.
 * True when it gave up (relay_set_fatal done).
 */
static bool
once_stalled(struct pipeline *p)
{
    struct outbox_error err;

    if (!p->relay->config->once ||
        clock_monotonic_seconds() - p->progress_at < RELAY_ONCE_CONNECT_BUDGET_SECONDS)
        return false;
    if (p->cause.code == OUTBOX_ERR_BUSY || p->cause.code == OUTBOX_ERR_TIMEOUT)
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                         "--once: no row moved for %.0f s (statements waiting, for a lock on"
                         " outbox.job held by another session?), giving up: %s",
                         RELAY_ONCE_CONNECT_BUDGET_SECONDS, p->cause.message);
    else
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION, "--once: no row moved for %.0f s, giving up: %s",
                         RELAY_ONCE_CONNECT_BUDGET_SECONDS, p->cause.message);
    relay_set_fatal(p->relay, &err);
    return true;
}

/*
 * A broker that defers rows while it stays connected (Redis BUSY or
 * LOADING, a cluster slot nobody serves) would have them claimed again at
 * once: the pipeline pauses, the pause backing off per turn that defers
 * again, before the next turn gives them back and claims (in that order,
 * so the claim can take them again). A lost connection has its own backoff
 * in ends_connect_sink(). Rows given back to ask a check are no broker's
 * fault: they go out again at once, with the answer.
 */
static void
pause_after_deferral(struct pipeline *p)
{
    const struct settlement *last = &p->settlements[!p->current];

    if (last->deferred == last->asked || !sink_is_connected(p->sink)) {
        backoff_reset(&p->deferral);
        return;
    }
    wait_until(&p->relay->stop, -1, clock_monotonic_seconds() + backoff_next(&p->deferral));
}

/*
 * The checks a broker's order records asked of the batch just published
 * (order_checks.h), answered on db's connection, idle between two turns; a
 * failed look-up drops it.
 */
static void
answer_checks(struct pipeline *p, struct database *db)
{
    struct outbox_error err;

    if (p->checks.asked && db->store != NULL &&
        order_checks_answer(&p->checks, outbox_store_conn(db->store), db->who, &err) != 0)
        ends_store_failed(p, db, &err);
}

/*
 * What a turn's claim found, into the serve's findings; a turn that
 * published a row (or failed one through its own fault) is progress for
 * --once. True when the turn found nothing to do: its claim no row, and
 * nothing published is left to mark.
 */
static bool
note_turn(struct pipeline *p, struct pipeline_slice *slice)
{
    const struct settlement *published = &p->settlements[!p->current];
    size_t count = p->settlements[p->current].batch.count;

    slice->claimed += count;
    slice->more = count > 0;
    slice->full = count == (size_t)p->relay->config->batch_size;
    if (published->accepted + published->failed > 0)
        p->progress_at = clock_monotonic_seconds();
    return count == 0 && !settlement_has_rows(published);
}

enum serve_status
pipeline_serve(struct pipeline *p, struct database *db, double until, struct pipeline_slice *slice)
{
    relay *r = p->relay;
    double claimed_at = 0;
    bool drained = false, claimed;

    *slice = (struct pipeline_slice){0};
    while (!drained && db->store != NULL && !relay_stopping(r) && !once_stalled(p) &&
           connect_broker(p, db)) {
        struct turn t;

        metrics_loop_turned(r->metrics);
        t = turn_claim(p, db, &claimed_at, until);
        publish_batch(p, db, &p->settlements[p->current]);
        claimed = turn_settle(p, db, &t, &claimed_at);
        answer_checks(p, db);
        if (!claimed)
            break; /* no claim made: until passed, the database failed, or the relay stops */
        drained = note_turn(p, slice);
        pause_after_deferral(p);
    }
    /* the last published batch is marked; a claim made for the next turn goes back */
    settle_now(p, db, &p->settlements[!p->current]);
    publish_give_back(p, db, &p->settlements[p->current].batch);
    if (db->store == NULL)
        return SERVE_FAILED;
    if (relay_stopping(r))
        return SERVE_STOPPED;
    slice->drained = drained;
    return drained ? SERVE_DRAINED : SERVE_UNTIL;
}

/* ---- between two slices of a database kept ---------------------------------- */

/*
 * Waits on db's connection for a NOTIFY, the stop latch, or deadline,
 * whichever comes first, then services an idle broker connection.
 */
static void
wait_for_notify(struct pipeline *p, struct database *db, double deadline)
{
    struct outbox_error err;
    bool notified = false;
    int fd;

    /* LISTEN before the first wait; a notification may have come with an earlier result */
    if (outbox_store_wait(db->store, 0, &notified, &err) != 0) {
        ends_store_failed(p, db, &err);
        return;
    }
    fd = PQsocket(outbox_store_conn(db->store));
    if (fd < 0) {
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION, "database connection is closed");
        ends_store_failed(p, db, &err);
        return;
    }
    while (!notified && wait_until(&p->relay->stop, fd, deadline) == WAIT_READY) {
        /* the socket is readable: read it; a notice or a status message is not a notification */
        if (outbox_store_wait(db->store, 1, &notified, &err) != 0) {
            ends_store_failed(p, db, &err);
            return;
        }
    }
    if (clock_monotonic_seconds() - p->last_sink_idle >= PIPELINE_SINK_IDLE_EVERY_SECONDS) {
        p->last_sink_idle = clock_monotonic_seconds();
        if (sink_idle(p->sink, &err) != 0)
            ends_broker_lost(p, &err);
        else if (sink_is_connected(p->sink))
            metrics_round_trip(p->relay->metrics, METRICS_BROKER); /* serviced: it answers */
    }
}

void
pipeline_wait(struct pipeline *p, struct database *db, struct pipeline_idle *idle,
              const struct pipeline_slice *slice, double until)
{
    const struct relay_config *c = p->relay->config;
    double now = clock_monotonic_seconds();

    if (slice->claimed > 0) {
        idle->wait_ms = 0;
        idle->last_work = now;
    }
    idle->wait_ms = idle->wait_ms == 0 ? 1 : idle->wait_ms * 2;
    if (now - idle->last_work < PIPELINE_BUSY_WINDOW_SECONDS &&
        idle->wait_ms > PIPELINE_BUSY_POLL_MAX_MS)
        idle->wait_ms = PIPELINE_BUSY_POLL_MAX_MS;
    if (idle->wait_ms > c->poll_interval_ms)
        idle->wait_ms = c->poll_interval_ms;
    if (now + idle->wait_ms / 1000.0 < until)
        until = now + idle->wait_ms / 1000.0;
    wait_for_notify(p, db, until);
}
