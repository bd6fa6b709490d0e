/*
 * maintenance.h - a database's maintenance: one phase table (reap, release
 * waiting, cleanup, samples), run in turn by the maintenance thread of a
 * relay of one database (started by relay.c) and, its phases of a visit,
 * by the slot visiting a database of a list (scheduler.c).
 */
#ifndef OUTBOX_RELAY_MAINTENANCE_H
#define OUTBOX_RELAY_MAINTENANCE_H

#include <stddef.h>

#include "relay_state.h"

/* arg is the relay whose maintenance to run. */
void *maintenance_run(void *arg);

/*
 * A visit of one database of a list, on the slot's connection store: the
 * phases a visit runs (reap, release waiting, cleanup) that schedule says
 * are due, each one bounded step; who leads their log
 * lines ("database=NAME"). 0 with *readied the rows the sweep made ready (they can be claimed
 * at once), or -1 with err when the database failed: the caller drops the
 * connection.
 */
int maintenance_visit(relay *r, outbox_store *store, const char *who,
                      struct maintenance_schedule *schedule, size_t *readied,
                      struct outbox_error *err);

#endif
