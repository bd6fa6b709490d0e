/*
 * maintenance.h - a database's maintenance: one phase table (reap, release
 * waiting, cleanup, samples), run by the slot serving the database between
 * two slices (scheduler.c).
 */
#ifndef OUTBOX_RELAY_MAINTENANCE_H
#define OUTBOX_RELAY_MAINTENANCE_H

#include <stddef.h>

#include "relay_state.h"

/* How far a visit takes each phase due. */
enum maintenance_pace {
    /*
     * a database of a list: its phases of a list, one bounded step each
     * (one reap round, one cleanup batch): its rows and the others' wait
     */
    MAINTENANCE_STEP,
    /*
     * the relay's own database: every phase, each to its bound (reap rounds,
     * cleanup batches for MAINTENANCE_CLEANUP_RUN_SECONDS); a reap that caught
     * up sets the relay's reaped latch
     */
    MAINTENANCE_RUN,
    /* --once's pass: every phase until it is done */
    MAINTENANCE_WHOLE,
};

/*
 * A visit of one database on the slot's connection store: the phases of
 * pace that schedule says are due; who leads their log lines
 * ("database=NAME", or "" for the relay's own). 0 with *readied the rows the
 * sweep made ready (they can be claimed at once), or -1 with err when the
 * database failed: the caller drops the connection.
 */
int maintenance_visit(relay *r, outbox_store *store, const char *who, enum maintenance_pace pace,
                      struct maintenance_schedule *schedule, size_t *readied,
                      struct outbox_error *err);

/* When the first phase of schedule is due (monotonic seconds). */
double maintenance_next_due(const struct maintenance_schedule *schedule);

#endif
