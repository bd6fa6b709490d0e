/*
 * pipeline.c - a pipeline thread: connect, then turn after turn claim or
 * wait, publish, settle.
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
#include "relay_internal.h"
#include "sink.h"

/* While rows keep coming, an empty claim waits at most this long before the next. */
#define BUSY_POLL_MAX_MS 8
#define BUSY_WINDOW_SECONDS 1.0
/* Longest wait after a turn whose rows the still connected broker deferred. */
#define DEFERRED_PAUSE_MAX_MS 2000
/* The broker connection is serviced (heartbeats) at least this often when idle. */
#define SINK_IDLE_EVERY_SECONDS 1.0

/*
 * One turn of a pipeline. settlements[current] holds a claimed batch (empty
 * on the first turn and after an outage), settlements[previous] the batch
 * before it, published but not yet marked. The marks of the previous batch
 * and the next claim go to the database ahead of their results, then the
 * current batch is published while the database works on them, then their
 * results are collected:
 *
 *   database  | mark N-1, claim N+1 |              | mark N, claim N+2 | ...
 *   broker    | publish N ........  |              | publish N+1 ....  |
 *
 * Afterwards the slots swap: settlements[current] holds the new claim.
 * Returns true when that claim was made (even if it found nothing), false
 * when it was not (stopping, or the database failed).
 */
static bool
relay_turn(struct pipeline *p, double *claimed_at)
{
    relay *r = p->relay;
    const struct relay_config *c = r->config;
    struct settlement *current = &p->settlements[p->current];
    struct settlement *previous = &p->settlements[!p->current];
    struct outbox_batch next = {0};
    struct outbox_error err;
    double next_claimed_at = clock_monotonic_seconds();
    bool marking = false, claiming = false;

    /* before anything is sent ahead, so the claim below sees pauses a fifth of a second old at most */
    if (p->db.store != NULL && outbox_store_refresh_pauses(p->db.store, &err) != 0)
        store_failed(p, &err);
    /* the last round trip before the publish, so the least time passes after it */
    keep_held_rows(p, &current->batch, claimed_at);
    if (p->db.store != NULL && settlement_has_rows(previous))
        marking = settle_send(p, previous) == 0;
    if (p->db.store != NULL && !relay_stopping(r)) {
        if (outbox_claim_send(p->db.store, (const char *const *)c->queues, c->queue_count,
                              c->batch_size, c->lease_seconds, &err) == 0)
            claiming = true;
        else
            store_failed(p, &err);
    }
    publish_batch(p, current);
    if (marking && p->db.store != NULL)
        settle_receive(p, previous);
    if (claiming && p->db.store == NULL)
        claiming = false; /* collecting the marks failed and dropped the connection */
    if (claiming && outbox_claim_receive(p->db.store, &next, &err) != 0) {
        store_failed(p, &err);
        claiming = false;
    }
    if (claiming)
        metrics_add(r->metrics, METRICS_CLAIMS, 1);
    /* marks not confirmed above (the database failed) get one more try */
    settle_now(p, previous);

    previous->batch = next;
    p->current = !p->current;
    *claimed_at = next_claimed_at;
    return claiming;
}

/* Waits for work: a NOTIFY, or the adaptive poll interval. */
static void
wait_for_work(struct pipeline *p, int wait_ms)
{
    relay *r = p->relay;
    struct outbox_error err;
    bool notified = false;

    while (wait_ms > 0 && !relay_stopping(r) && !notified) {
        int slice = wait_ms < WAIT_SLICE_MS ? wait_ms : WAIT_SLICE_MS;

        if (outbox_store_wait(p->db.store, slice, &notified, &err) != 0) {
            store_failed(p, &err);
            return;
        }
        wait_ms -= slice;
    }
    if (clock_monotonic_seconds() - p->last_sink_idle >= SINK_IDLE_EVERY_SECONDS) {
        p->last_sink_idle = clock_monotonic_seconds();
        if (sink_idle(p->sink, &err) != 0)
            broker_lost(p, &err);
    }
}

/*
 * --once must end: a pipeline that connects but moves no row (every claim
 * fails, a lock holds it, the broker defers every row because too few
 * replicas acknowledge) gives up when no turn has published a row (or failed
 * one through its own fault) for ONCE_CONNECT_BUDGET_SECONDS, naming the
 * last cause.
 * True when it gave up (set_fatal done).
 */
static bool
once_stalled(struct pipeline *p)
{
    struct outbox_error err;

    if (!p->relay->config->once ||
        clock_monotonic_seconds() - p->progress_at < ONCE_CONNECT_BUDGET_SECONDS)
        return false;
    if (p->cause.code == OUTBOX_ERR_BUSY || p->cause.code == OUTBOX_ERR_TIMEOUT)
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                         "--once: no row moved for %.0f s (statements waiting, for a lock on"
                         " outbox.job held by another session?), giving up: %s",
                         ONCE_CONNECT_BUDGET_SECONDS, p->cause.message);
    else
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION, "--once: no row moved for %.0f s, giving up: %s",
                         ONCE_CONNECT_BUDGET_SECONDS, p->cause.message);
    relay_set_fatal(p->relay, &err);
    return true;
}

/* --once: pipelines claim only after the maintenance thread reaped expired leases. */
static void
wait_for_first_reap(relay *r)
{
    while (!atomic_load(&r->reaped) && !relay_stopping(r))
        usleep(10 * 1000);
}

/*
 * A broker that defers rows while it stays connected (Redis BUSY or
 * LOADING, a cluster slot nobody serves) would have them claimed again at
 * once: the pipeline waits 50 ms, doubling per turn that defers again, up
 * to DEFERRED_PAUSE_MAX_MS, before the next turn releases them and claims
 * (in that order, so the claim can take them again). A lost connection has
 * its own backoff in connect_sink().
 */
static void
pause_after_deferral(struct pipeline *p)
{
    const struct settlement *last = &p->settlements[!p->current];

    if (last->released == 0 || !sink_is_connected(p->sink)) {
        p->deferred_pause_ms = 0;
        return;
    }
    p->deferred_pause_ms = p->deferred_pause_ms == 0 ? 50 : p->deferred_pause_ms * 2;
    if (p->deferred_pause_ms > DEFERRED_PAUSE_MAX_MS)
        p->deferred_pause_ms = DEFERRED_PAUSE_MAX_MS;
    relay_sleep_ms(p->relay, p->deferred_pause_ms);
}

void *
pipeline_run(void *arg)
{
    struct pipeline *p = arg;
    relay *r = p->relay;
    const struct relay_config *c = r->config;
    int idle_ms = 0;
    double last_work = 0, claimed_at = 0;

    if (connect_ends(&p->db, p, true, true, true) != 0)
        goto done;
    if (c->once)
        wait_for_first_reap(r);
    p->progress_at = clock_monotonic_seconds();
    outbox_error_set(&p->cause, OUTBOX_ERR_CONNECTION, "no claim succeeded");

    while (!relay_stopping(r)) {
        const struct settlement *current, *previous;

        if (once_stalled(p))
            break;
        /* connect */
        if (p->db.store == NULL && connect_store(&p->db, false) != 0)
            break;
        if (!sink_is_connected(p->sink)) {
            /* published rows are marked and claimed ones handed back before the outage */
            settle_now(p, &p->settlements[!p->current]);
            give_back(p, &p->settlements[p->current].batch);
            if (connect_sink(p, false) != 0)
                break;
        }
        metrics_loop_turned(r->metrics);

        /* turn: publish the current batch, mark the previous one, claim the next */
        if (!relay_turn(p, &claimed_at))
            continue; /* no claim made: reconnect, or stop */
        /* the batch just published, not marked yet: some of its rows went out (or failed) */
        if (p->settlements[!p->current].accepted + p->settlements[!p->current].failed > 0)
            p->progress_at = clock_monotonic_seconds();
        pause_after_deferral(p);
        current = &p->settlements[p->current];
        previous = &p->settlements[!p->current];
        if (current->batch.count > 0 || settlement_has_rows(previous)) {
            idle_ms = 0;
            last_work = clock_monotonic_seconds();
            continue;
        }

        /* or wait */
        outbox_batch_release_memory(&p->settlements[p->current].batch);
        if (c->once)
            break;
        /*
         * Adaptive polling: 1, 2, 4 ... ms, up to BUSY_POLL_MAX_MS while
         * rows came in the last BUSY_WINDOW_SECONDS (a lull in a steady
         * stream must not cost its next rows a long sleep), and up to
         * --poll-interval once the queue has been quiet for longer.
         */
        idle_ms = idle_ms == 0 ? 1 : idle_ms * 2;
        if (clock_monotonic_seconds() - last_work < BUSY_WINDOW_SECONDS && idle_ms > BUSY_POLL_MAX_MS)
            idle_ms = BUSY_POLL_MAX_MS;
        if (idle_ms > c->poll_interval_ms)
            idle_ms = c->poll_interval_ms;
        wait_for_work(p, idle_ms);
    }
    /* the last published batch is marked; a claim made for the next turn goes back */
    settle_now(p, &p->settlements[!p->current]);
    give_back(p, &p->settlements[p->current].batch);

done:
    broker_close(p);
    drop_store(&p->db);
    atomic_fetch_sub(&r->pipelines_running, 1);
    relay_thread_returned(r);
    return NULL;
}
