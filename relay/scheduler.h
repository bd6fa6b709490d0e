/*
 * scheduler.h - the one driver of a relay: slots that serve its databases,
 * the databases of a list (--databases) or its own (--database-url, a list
 * of one). docs/design.md "One relay" says what differs between the two
 * kinds of database (enum tenant_kind); this header speaks of a list.
 *
 * The relay's own database is served by --concurrency slots side by side,
 * as other relays of the URL serve it (SKIP LOCKED, no lease): each keeps
 * its connection between slices and waits on it for a NOTIFY or the
 * adaptive poll (pipeline_wait()); one more slot, its upkeep slot, runs
 * every maintenance phase when due and its stream queues' lag report and
 * cleanup; its faults are the relay's.
 *
 * A list: a connection budget shared by slots, and a fair share among
 * databases. The relay runs --max-db-connections slots, each a pipeline
 * (relay_state.h) with its own broker connection and no database of its
 * own. A slot asks
 * the scheduler for a database, serves it for a bounded slice (claim,
 * publish, mark, as a pipeline does, after the database's reap and cleanup
 * when due), and gives it back. Every connection to a listed database is
 * held by a slot serving it or kept idle for the next slice; together they
 * never pass the budget (an idle one is closed for a slot that needs
 * another database). There is no LISTEN: a database that had no row is
 * looked at again after an interval that grows from --poll-interval to
 * SCHEDULER_IDLE_MAX_SECONDS while it stays empty.
 *
 * Fairness: the due database that waited longest goes first, so a database
 * with a backlog, due again at once after each slice, cannot keep a quiet
 * one waiting for more than a slice; databases whose last claim was a whole
 * batch share the slots equally, the others get one slot at a time.
 *
 * A database that is down, dropped, not migrated or at an old schema costs
 * only itself: its slice ends, it is backed off (one log line a minute
 * naming it), /healthz and outbox_database_up name it, the others flow.
 * The list is looked at every SCHEDULER_LIST_LOOK_SECONDS and re-read when
 * it changed: a database added is served at the next slot free, one
 * removed is released once its slices end (rows marked, claims given back,
 * its connections closed).
 *
 * Relays that share the list divide its databases: each visit of a database
 * first takes, keeps or gives up its lease (store_database_lease.h). A
 * relay's statistics watch session keeps its membership and its leases on
 * its server (sql/019): an idle database whose owner's watch runs is not
 * visited but on a change of its rows or of the relays watching its server
 * (or every SCHEDULER_WATCHED_VISIT_SECONDS). Without a watch, a database
 * is visited SCHEDULER_VISIT_PER_LEASE times a lease, by its owner to keep
 * the lease and by the others to stay members of its rendezvous and to
 * take it over once that relay's lease ends.
 *
 * Stream queues are served too, by the slot serving their database, after
 * its rows, on the same connection and within the same slice (the rows get
 * half of it): see scheduler_stream.h.
 */
#ifndef OUTBOX_RELAY_SCHEDULER_H
#define OUTBOX_RELAY_SCHEDULER_H

#include "relay_state.h"
#include "timeouts.h" /* SCHEDULER_SLICE_SECONDS and the scheduler's other times */

/* A database another relay serves is visited this many times a lease (membership, takeover). */
#define SCHEDULER_VISIT_PER_LEASE 4.0

struct scheduler;

/*
 * The slots a relay runs: --max-db-connections for a list; for its own
 * database --concurrency and one for its upkeep, within --max-db-connections.
 */
int scheduler_slot_count(const struct relay_config *config);

/*
 * Reads the list (r->config->databases_file), or makes the relay's own
 * database (r->config->database_url) a list of one. NULL with err when it
 * cannot.
 */
struct scheduler *scheduler_new(relay *r, struct outbox_error *err);

/* Where its databases come from, for the log: the list's file, or "--database-url". */
const char *scheduler_source(const struct scheduler *s);

/* Closes every idle connection; the slots must have returned. NULL is a no-op. */
void scheduler_free(struct scheduler *s);

/* Ends every slot's wait for a database (relay_stop). */
void scheduler_stop(struct scheduler *s);

/* The body of a slot thread; arg is its struct pipeline. */
void *scheduler_slot_run(void *arg);

#endif
