/*
 * pipeline.h - serving a database: the turns (claim, publish, settle) of
 * pipeline_serve(), which a slot (scheduler.c) runs for a slice on a
 * connection to the database it serves, and pipeline_wait(), the wait of a
 * slot that keeps the relay's own database between its slices.
 */
#ifndef OUTBOX_RELAY_PIPELINE_H
#define OUTBOX_RELAY_PIPELINE_H


#include <stdbool.h>
#include <stddef.h>

#include "relay_state.h"

/* What a serve of a database by pipeline_serve() found. */
struct pipeline_slice {
    size_t claimed; /* rows claimed */
    bool more;      /* the last claim found rows: the database may hold more */
    bool full;      /* the last claim was a whole batch: a backlog */
    bool drained;   /* the serve ended on a turn that found nothing to do (SERVE_DRAINED) */
};

/* How pipeline_serve() ended. */
enum serve_status {
    SERVE_DRAINED, /* a turn found nothing to do: its claim no row, nothing left to mark */
    SERVE_UNTIL,   /* until passed, or a claim failed on a connection the marks then replaced */
    SERVE_STOPPED, /* the relay stops (relay_stop, a fatal error, --once gave up) */
    SERVE_FAILED,  /* the database failed: db->store is NULL, p->cause says why */
};

/*
 * Serves the database of db, connected, on pipeline p (its broker
 * connected as needed), turn after turn, until a turn finds nothing to do
 * or until (monotonic seconds) has passed; then marks what was published
 * and gives back what was claimed, and returns how it ended, what it
 * claimed in *slice. Every failure of the database is the status's to
 * say: the caller reconnects (a pipeline) or backs the database off (a
 * slot).
 */
enum serve_status pipeline_serve(struct pipeline *p, struct database *db, double until,
                                 struct pipeline_slice *slice);

/* What a slot's adaptive poll interval knows (see pipeline_wait). */
struct pipeline_idle {
    int wait_ms;      /* the last wait; 0 after a slice with work */
    double last_work; /* when a slice last had work */
};

/*
 * After a slice that drained the database, waits on db's connection (its
 * LISTEN) for a NOTIFY, or the adaptive poll interval: 1, 2, 4 ... ms, up
 * to PIPELINE_BUSY_POLL_MAX_MS while rows came in the last
 * PIPELINE_BUSY_WINDOW_SECONDS (a lull in a steady stream must not cost its
 * next rows a long sleep), and up to --poll-interval once the queue has
 * been quiet for longer; the interval starts again at 1 ms after a slice
 * that claimed rows. Never past until (the database's maintenance due). A
 * failure of the database drops db's connection; an idle broker
 * connection is serviced.
 */
void pipeline_wait(struct pipeline *p, struct database *db, struct pipeline_idle *idle,
                   const struct pipeline_slice *slice, double until);

#endif
