/*
 * pipeline.h - the body of one pipeline thread: connect, claim or wait,
 * publish, settle; started by relay.c, one per --concurrency.
 */
#ifndef OUTBOX_RELAY_PIPELINE_H
#define OUTBOX_RELAY_PIPELINE_H


#include <stdbool.h>
#include <stddef.h>

#include "relay_state.h"

/* arg is the struct pipeline to run. */
void *pipeline_run(void *arg);

/* What a slice of a database served by pipeline_serve() found. */
struct pipeline_slice {
    size_t claimed; /* rows claimed */
    bool more;      /* the last claim found rows: the database may hold more */
    bool full;      /* the last claim was a whole batch: a backlog */
};

/*
 * Serves the database whose connection p->db holds (the broker connected
 * as needed) until a claim finds no row or until (monotonic seconds) has
 * passed; then marks what was published and gives back what was claimed.
 * p->db.store is NULL afterwards when the database failed (p->cause says
 * why).
 */
struct pipeline_slice pipeline_serve(struct pipeline *p, double until);

#endif
