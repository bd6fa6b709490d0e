/*
 * metrics_database.h - the per-database series of a relay serving a list of
 * databases (--databases), and the faults /healthz names.
 *
 * Part of struct metrics (metrics.c creates, renders and frees it; see
 * metrics_databases_of). Series carry database="NAME" as the list names
 * it. The gauges (up, served, ready rows, oldest ready age, stranded) are
 * rendered for every database of the list: the list bounds them, and no
 * tenant's state hides in a sum. In the counters at most max databases
 * (--metrics-max-queues, 0 no cap) have their own series, the later ones
 * are summed under database="(other)". A database removed from the list drops out.
 * Nothing is rendered for a relay of one database.
 * Thread-safe (own mutex).
 */
#ifndef OUTBOX_METRICS_DATABASE_H
#define OUTBOX_METRICS_DATABASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buffer.h"
#include "store_database_lease.h"

struct metrics_databases;

/* NULL when out of memory. */
struct metrics_databases *metrics_databases_new(void);
void metrics_databases_free(struct metrics_databases *d);

/* Most databases with series of their own; 0: no cap. */
void metrics_databases_set_max(struct metrics_databases *d, size_t max);

/* The databases listed now, in the list's order; others drop out. */
void metrics_databases_set_list(struct metrics_databases *d, const char *const *names,
                                size_t count);

/*
 * A database's state: up (its last connect or slice worked), or down with
 * cause (one line, no secret). A database not yet tried is neither.
 */
void metrics_databases_set_state(struct metrics_databases *d, const char *name, bool up,
                                 const char *cause);

/* Whether this relay serves the database now (it holds its lease); not: its sample is dropped. */
void metrics_databases_set_served(struct metrics_databases *d, const char *name, bool served);

/*
 * A sample of a database this relay serves (relay/scheduler_sample.c):
 * whether a claim would take a row, and when counted its ready rows and
 * the oldest one's age (an uncounted sample keeps the last count).
 * Rendered until the database is no longer served. The age grows from the
 * count on while no row of the database is claimed: the oldest row is
 * still there. A database whose claimable rows saw no claim for
 * SCHEDULER_STRANDED_SECONDS is stranded.
 */
void metrics_databases_set_sample(struct metrics_databases *d, const char *name,
                                  const struct store_database_sample *sample);

/* Adds a slice's rows claimed and completed. */
void metrics_databases_add(struct metrics_databases *d, const char *name, uint64_t claimed,
                           uint64_t completed);

/* Connections open to the listed databases now, and the budget. */
void metrics_databases_set_connections(struct metrics_databases *d, int open, int budget);

/*
 * Writes one line per database down, "database NAME down: CAUSE\n", for
 * /healthz (truncated to size; "" when none). The number down.
 */
size_t metrics_databases_describe_faults(struct metrics_databases *d, char *text, size_t size);

/* Appends the families (nothing before the first list). */
void metrics_databases_render(struct metrics_databases *d, struct buffer *o, const char *broker);

#endif
