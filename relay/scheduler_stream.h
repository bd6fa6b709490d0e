/*
 * scheduler_stream.h - the stream queues of the databases a relay serves.
 * Private to relay/scheduler*.c. What follows speaks of a list's database;
 * the relay's own keeps its partitions while it runs, publishes them from
 * its stream slots side by side (struct slot_role), and reports their lag
 * from its upkeep slot (docs/design.md "One relay").
 *
 * Each database with a stream queue gets a stream worker of its own
 * (stream_worker.h), with no thread and no connection of its own: the slot
 * serving the database runs it after the row slice, on the connection it
 * holds for the database (the stream statements prepared on it once) and
 * through its own broker connection, so streams cost no connection beyond
 * the budget. One slot at a time runs a database's worker. A visit renews,
 * gives back and takes the partitions when due (as a stream thread does),
 * then publishes them in turns until the visit's slice ends.
 *
 * The partitions are held only while their rows come: a visit that finds
 * no row to publish gives them back, and one that holds none takes them
 * (fenced: a new generation, the cursor where it was) only when rows wait.
 * A quiet database thus holds no lease to renew, and its visits write
 * nothing that the statistics watch would wake it for: it is visited as a
 * row database is. While rows wait that cannot be read (behind the horizon,
 * a backoff, another relay's lease), it is polled instead. The partitions
 * are also given back when the relay gives the database up (its lease
 * lost, the database removed from the list, the relay stopping), so the
 * next owner takes them at once rather than after a lease.
 */
#ifndef OUTBOX_RELAY_SCHEDULER_STREAM_H
#define OUTBOX_RELAY_SCHEDULER_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay_state.h"
#include "scheduler_state.h"

/* What the stream part of a visit found. */
struct stream_visit {
    bool more;        /* the last pass read rows, and the slice ended first: there may be more */
    bool waiting;     /* rows wait that could not be read now: look again as a polled database */
    size_t rows;      /* stream rows read */
    uint64_t settled; /* rows whose outcome was recorded (published or refused) */
};

/*
 * Serves the stream queues of w's database on its connection for slot p,
 * through the stream worker of w's role, until `until` (monotonic
 * seconds): looks for a stream queue when it knows of none (every
 * MAINTENANCE_STREAM_CHECK_EVERY_SECONDS), then publishes. Nothing while
 * another slot runs them. At the end of a visit of a database removed from
 * the list, or of a stopping relay, the partitions are given back. 0, or -1
 * with err when the database failed (the caller drops the connection; the
 * partitions stay held and are renewed, their cursors read again, on the next).
 */
int scheduler_stream_serve(struct scheduler *s, struct pipeline *p, struct work *w, double until,
                           struct stream_visit *out, struct outbox_error *err);

/*
 * The stream upkeep of the relay's own database on its upkeep slot's
 * connection c: looks for a stream queue when it knows of none, then
 * reports the partitions' lag and deletes published rows past --retention
 * when due; *next is when it is due again. 0, or -1 with err when the
 * database failed.
 */
int scheduler_stream_upkeep(struct scheduler *s, struct tenant *t, struct idle_connection *c,
                            double *next, struct outbox_error *err);

/* Whether t has a stream queue (its workers are made). */
bool scheduler_stream_known(struct scheduler *s, struct tenant *t);

/* Whether a slot looked for t's stream queues once (found or not; set with its workers, so
 * read before scheduler_stream_known()). */
bool scheduler_stream_looked(struct scheduler *s, struct tenant *t);

/* A visit found t's lease lost (or t paused): its partitions are given back through c. */
void scheduler_stream_lease_lost(struct scheduler *s, struct tenant *t, struct idle_connection *c);

/*
 * Gives t's partitions and its membership back through c, when it holds
 * any. For a caller no slot can race: under the lock with t not served, or
 * once the slots returned.
 */
void scheduler_stream_give_back(struct scheduler *s, struct tenant *t, struct idle_connection *c);

/* Whether t's stream worker holds partitions (no slot running it). */
bool scheduler_stream_holds(const struct tenant *t);

/* Frees t's stream worker; NULL is a no-op. */
void scheduler_stream_free(struct tenant *t);

#endif
