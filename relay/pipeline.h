/*
 * pipeline.h - serving a database: the turns (claim, publish, settle) of
 * pipeline_serve(), which a pipeline thread (started by relay.c, one per
 * --concurrency) runs on its own connection between its waits, and a slot
 * (scheduler.c) on a listed database's for a slice.
 */
#ifndef OUTBOX_RELAY_PIPELINE_H
#define OUTBOX_RELAY_PIPELINE_H


#include <stdbool.h>
#include <stddef.h>

#include "relay_state.h"

/* arg is the struct pipeline to run. */
void *pipeline_run(void *arg);

/* What a serve of a database by pipeline_serve() found. */
struct pipeline_slice {
    size_t claimed; /* rows claimed */
    bool more;      /* the last claim found rows: the database may hold more */
    bool full;      /* the last claim was a whole batch: a backlog */
};

/* How pipeline_serve() ended. */
enum serve_status {
    SERVE_DRAINED, /* a turn found nothing to do: its claim no row, nothing left to mark */
    SERVE_UNTIL,   /* until passed, or a claim failed on a connection the marks then replaced */
    SERVE_STOPPED, /* the relay stops (relay_stop, a fatal error, --once gave up) */
    SERVE_FAILED,  /* the database failed: db->store is NULL, p->cause says why */
};

/* Never: a serve without an end of its own (a relay's pipelines). */
#define PIPELINE_SERVE_FOREVER 1e300

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

#endif
