/*
 * scheduler_state.h - what the scheduler's files share: its databases, their
 * connections and the lock over them. Private to relay/scheduler*.c.
 */
#ifndef OUTBOX_RELAY_SCHEDULER_STATE_H
#define OUTBOX_RELAY_SCHEDULER_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backoff.h"
#include "cause_log.h"
#include "database_list.h"
#include "outbox.h"
#include "pipeline.h"
#include "relay_state.h"
#include "scheduler_watch.h"
#include "store_database_lease.h"
#include "store_identity.h"

/*
 * A connection to a database of the list, kept open between its slices.
 * guard: s->lock while in its tenant's idle[]; the slot that took it out
 * owns it alone, and serves the database on it (pipeline_serve()).
 */
struct idle_connection {
    struct database db; /* db.store NULL: not connected (connect_tenant() first) */
    double used_at; /* the least recently used one is closed first */
    bool stream_ready; /* the stream statements are prepared on it (scheduler_stream.c) */
    bool streams_only; /* it runs stream statements only: they keep generic plans */
    unsigned identity_generation; /* its tenant's when identity was read (scheduler_sample.c) */
};

/*
 * Whose a database of the scheduler is. A relay serves either the
 * databases of a list (--databases) or its own (--database-url, a list of
 * one); docs/design.md "One relay" says what differs.
 */
enum tenant_kind {
    /*
     * leased to one relay of those sharing the list; woken by the statistics
     * watch; a slot serves it a slice at a time; its faults are its own
     */
    TENANT_LISTED,
    /*
     * no lease: every relay of the URL serves it side by side (SKIP LOCKED);
     * --concurrency slots keep it, each on its connection, waiting on LISTEN
     * between slices; its faults are the relay's; every maintenance phase
     */
    TENANT_OWN,
};

/*
 * One database of the list. The guard of each field is the comment "guard:"
 * before it, good until the next; docs/design.md's table of threads and
 * locks says who takes which lock.
 */
struct tenant {
    /* guard: none needed: set when listed, read-only until freed (no slot serves it then) */
    char name[DATABASE_NAME_MAX];
    char who[DATABASE_NAME_MAX + 16]; /* "database=NAME": leads its connections' notices */
    char *url;
    enum tenant_kind kind;
    /* guard: s->lock */
    char database_id[STORE_DATABASE_ID_MAX]; /* its identity as last read, "" before */
    bool identity_shared; /* another database of the list was seen with the same identity */
    bool removed; /* gone from the list: freed once no slot serves it */
    struct tenant *released_next; /* set aside by scheduler_release_removed(), freed by a slot */
    int serving;  /* slots serving it now */
    struct idle_connection *idle;
    size_t idle_count;
    double due;        /* monotonic seconds from when a slot may take it */
    double picked_at;  /* when a slot last took it: the longest waiting goes first */
    double idle_wait;  /* the wait after a slice that found no row; grows while empty */
    bool backlog;      /* its last claim was a whole batch */
    /*
     * guard: upkeep: the slot that took it (scheduler_upkeep_take()) alone, outside
     * the lock; a backlog served by two slots at once is maintained and sampled by one
     */
    struct maintenance_schedule maintenance; /* when its phases of a visit run next */
    double counted_at; /* scheduler_sample() last counted its ready rows */
    bool counted_rows; /* and found some */
    bool claimed_since_count; /* a visit claimed rows since */
    /* guard: s->lock */
    bool tried, down;  /* tried at least once; its last connect or slice failed */
    bool probed;       /* its server was probed before its first visit (scheduler_probe.c) */
    bool answered;     /* ... and answered: not doubtful though never visited */
    bool held;         /* this relay holds the database's lease (sql/018_database_lease.sql) */
    bool lease_watched; /* the lease is kept by its owner's statistics watch (sql/019) */
    bool wins;          /* this relay should hold the lease (it may be paused, or not given up yet) */
    bool lease_stale;   /* the relays watching its server changed since the lease was last taken */
    double lease_taken_at; /* when a visit last called the lease function */
    bool lease_recheck; /* the watch saw a change since that call, which a visit did not make */
    double takeover_wait; /* a winner's wait for the owner to give the lease up; doubles */
    bool paused;       /* outboxctl pause --database: no relay serves it */
    bool watched;      /* the statistics watch covers it: no poll while idle */
    int watch_pid;     /* the backend pid of the watch's session on its server, 0 for none */
    bool woken;        /* the watch saw an insert since a slot last took it */
    double visited_at; /* when its last slice ended */
    double rows_at;    /* when its last slice that claimed rows ended */
    /* guard: atomic */
    atomic_uint identity_generation; /* bumped when a sample finds the identity changed */
    atomic_bool checked;          /* a connection passed the schema check and the privilege audit
                                   * since it last failed: later ones skip them */
    atomic_bool upkeep;           /* a slot maintains or samples it now (the fields above) */
    /*
     * guard: s->lock for the pointer and stream_busy; a list's database's worker
     * belongs to the slot that set stream_busy (scheduler_stream.c's claim()),
     * each of the own database's to the slot whose role names it (struct slot_role)
     */
    struct tenant_stream *stream; /* its stream queues' workers, once one was found */
    size_t stream_count;          /* 1, or the own database's: one a slot (scheduler_stream.c) */
    bool stream_busy;             /* one slot alone runs the worker or looks for one */
    double stream_check_due;      /* when a visit looks for a stream queue again (none yet) */
    bool stream_looked;           /* a visit looked for one once (--once waits for that) */
    /* guard: s->lock */
    struct backoff retry;
    struct cause_log log;
};

/*
 * Takes t's upkeep (its maintenance schedule and its sample's counts) for
 * the calling slot: false when another slot serving t has it now, which
 * then does that work for both. scheduler_upkeep_give() hands it back.
 */
static inline bool
scheduler_upkeep_take(struct tenant *t)
{
    return !atomic_exchange(&t->upkeep, true);
}

static inline void
scheduler_upkeep_give(struct tenant *t)
{
    atomic_store(&t->upkeep, false);
}

/* The scheduler of a relay; each field's guard as in struct tenant. */
struct scheduler {
    /* guard: none needed: set by scheduler_new(), read-only while the threads run */
    relay *relay;
    pthread_mutex_t lock;
    /* guard: waited on and signalled with lock held */
    pthread_cond_t changed; /* a database became due, or the relay stops */
    pthread_cond_t served;  /* a database is served: the watch rests the shorter interval */
    /* guard: lock */
    struct tenant **tenants;
    size_t count;
    struct tenant *released; /* removed ones no slot serves, to free outside the lock */
    int open;   /* connections open: held by slots and idle */
    /* guard: none needed: set by scheduler_new(), read-only after */
    int budget; /* --max-db-connections */
    int slots;
    /* guard: lock */
    double list_look_at;
    struct database_file_stamp stamp;
    unsigned int seed;
    /* guard: the watch thread alone (the main thread makes and frees it around the thread) */
    struct watch *watch; /* driven by watch_thread alone */
    /* guard: the main thread: scheduler_new() starts it, scheduler_free() joins it */
    pthread_t watch_thread;
    bool watch_started;
    /* guard: atomic */
    atomic_bool watch_quit;
    atomic_bool probe_due; /* the list added databases: the watch probes their servers */
    /* guard: lock */
    bool watch_stale; /* the list changed: the watch follows at its next look */
    int watch_open;   /* connections the watch holds, within open */
    /* guard: none needed: set by scheduler_new(), read-only after */
    char watch_name[WATCH_NAME_MAX]; /* the application_name of the watch's sessions */
    /* guard: lock */
    bool watch_looked; /* the watch's first look is done */
    /* guard: none needed: set by scheduler_new(), read-only after */
    double started_at;
    struct stream_runner *streams; /* the owner name and stop flag of the databases' streams */
    enum tenant_kind kind; /* of its databases: a list's, or the relay's own */
    int own_rows, own_streams; /* the own database's slots for its rows and its streams */
    struct metrics_databases *database_metrics; /* a list's per-database series; NULL: own */
};

/*
 * Waits on cond (made with the monotonic clock) under s's lock until it is
 * signalled or the monotonic clock reaches until (seconds).
 */
void scheduler_wait(struct scheduler *s, pthread_cond_t *cond, double until);

/*
 * When a visit calls the database's lease function, which takes, keeps or
 * gives up the lease: not at all (a lease this relay's watch keeps, called
 * lately), before the slice (a lease not held or not kept), or after it (a
 * kept lease, called again a quarter of a lease on: the rows need not wait).
 */
enum lease_call { LEASE_KEPT, LEASE_BEFORE, LEASE_AFTER };

/*
 * What a slot does with the databases it serves. A list's slots do all of
 * it, the maintenance a bounded step a visit. The relay's own database
 * divides its slots (scheduler_slot_count(), docs/design.md "One relay"):
 * --concurrency slots for its rows, as many for its stream partitions, and
 * the last for its upkeep (its maintenance, its streams' lag report and
 * cleanup), each on a connection of its own so that none holds up the
 * others; a smaller budget gives the rows' slots the streams, and one slot
 * does all three.
 */
struct slot_role {
    bool rows;    /* claims, publishes and marks rows */
    bool streams; /* publishes stream partitions (its stream worker's) */
    bool upkeep;  /* runs the maintenance (and for the own database the streams' upkeep) */
    int worker;   /* its stream worker's index among the database's (scheduler_stream.c) */
};

/* What a slot took: a database and a connection to it (store NULL: connect first). */
struct work {
    struct slot_role role;  /* the slot's part, the same for all its work */
    enum lease_call lease_call;
    bool streams;      /* the database has stream queues: the rows get half the slice (read
                        * again at each slice of a database the slot keeps) */
    bool streams_wait; /* stream rows wait that no pass could read: polled, not watched */
    struct tenant *tenant;
    struct idle_connection connection;
    outbox_store *to_close; /* an idle connection of another database, closed for this one */
    bool watched;           /* the watch covered the database when the slot took it */
    int watch_pid;          /* the backend pid of the watch's session on its server */
    bool first;             /* the database was never tried: a fault of the own is fatal */
    bool woken;             /* the watch saw a change of the database since its last slice */
    double next_ready;      /* after an empty slice of a watched one: see store_database_next_ready */
    bool held_rows;         /* and whether rows wait behind their keys then */
    double look_at;         /* the own database's upkeep or stream slot looks again then */
    bool unconnected;       /* the slice wanted no connection (a stream slot of a database
                             * without a stream queue): no fault of the database's */
};

/* ---- a slice served (scheduler_serve.c), outside the lock ------------------- */

/*
 * Serves w's database for one slice on slot p. The slice's findings; the
 * connection is left in w (store NULL when the database failed, with why in
 * *cause), what the lease call said in *lease.
 */
struct pipeline_slice scheduler_serve_slice(struct pipeline *p, struct work *w,
                                            struct outbox_error *cause,
                                            struct store_database_lease *lease);

/*
 * Whether slot p goes on serving w's database after slice, keeping its
 * connection (the relay's own database), after waiting for its rows in
 * idle's pace; a failure meanwhile drops the connection, why in *cause.
 */
bool scheduler_keep_serving(struct pipeline *p, struct work *w, const struct pipeline_slice *slice,
                            struct pipeline_idle *idle, struct outbox_error *cause);

/* Slot p's part (scheduler_budget.c, as what follows). */
struct slot_role scheduler_slot_role(const struct scheduler *s, const struct pipeline *p);

/*
 * Sets s->own_rows and s->own_streams: with three slots or more, the upkeep
 * slot aside, the streams get half of the others (the rows the odd one);
 * with two, the rows' slot publishes the streams too. Before the slots start.
 */
void scheduler_divide_own_slots(struct scheduler *s);

/* The stream workers the relay's own database has (one for each slot publishing its streams,
 * and the upkeep slot's). */
size_t scheduler_own_stream_workers(const struct scheduler *s);

/* --once: whether slot p is done after slice of w's database. */
bool scheduler_once_done(struct pipeline *p, const struct work *w,
                         const struct pipeline_slice *slice);

/* ---- the list (scheduler_list.c); each under the lock ---------------------- */

/* When the list was read: at the relay's start, or again after its file changed. */
enum list_reading { LIST_AT_START, LIST_CHANGED };

/* Follows the list as read when: databases added and removed. 0 or -1. */
int scheduler_apply_list(struct scheduler *s, const struct database_list *list,
                         enum list_reading when);

/*
 * Makes url, the relay's own database, the one database of s (a list of
 * one, TENANT_OWN). 0, or -1 when out of memory.
 */
int scheduler_add_own(struct scheduler *s, const char *url);

/* Re-reads the list when its file changed, at most every SCHEDULER_LIST_LOOK_SECONDS. */
void scheduler_look_at_list(struct scheduler *s, double now);

/*
 * Sets the removed databases no slot serves any more aside, for a slot to
 * free with scheduler_free_released() outside the lock.
 */
void scheduler_release_removed(struct scheduler *s);

/*
 * Frees what scheduler_release_removed() set aside: each lease given up, this
 * relay's membership of the database's rendezvous left and stream handed
 * back, over the database's idle connection or one within the budget (one
 * waits for a connection a slot gives back), then the connections closed.
 * Called with the lock held, it lets the lock go for that I/O (a database
 * that does not answer holds up this slot alone) and counts the
 * connections out of the budget after they closed.
 */
void scheduler_free_released(struct scheduler *s);

/*
 * Closes t's idle connections, giving up through one its lease and its
 * stream partitions when it holds them.
 */
void scheduler_tenant_close_idle(struct scheduler *s, struct tenant *t);

/*
 * Counts a new connection in s->open, within the budget, or takes an idle
 * connection of another database for it into *to_close (the caller closes
 * it outside the lock; the count stays). False when every connection is
 * serving. Under the lock.
 */
bool scheduler_count_new_connection(struct scheduler *s, outbox_store **to_close);

/*
 * Counts a connection of the statistics watch (one per four of the budget
 * at most): within the budget, or in place of an idle connection of a
 * database, into *to_close, which the caller closes outside the lock and
 * before the watch connects (the slots keep one connection for the watch,
 * and a second server's watch would otherwise wait for a slot's idle
 * connection to be closed for another reason). False when none can be had.
 * Under the lock.
 */
bool scheduler_count_watch_connection(struct scheduler *s, outbox_store **to_close);

/*
 * A stopping relay gives up the leases and stream partitions it holds,
 * through each database's idle connection or else a new one, one at a
 * time. The slots must have returned.
 */
void scheduler_release_leases(struct scheduler *s);

void scheduler_tenant_free(struct scheduler *s, struct tenant *t);

/* ---- identities (scheduler_identity.c) ------------------------------------- */

/*
 * Records database_id as t's identity, read at a connect; logs an error
 * naming both when another database of the list has the same. Takes the lock.
 */
void scheduler_identity_seen(struct scheduler *s, struct tenant *t, const char *database_id);

/* ---- samples (scheduler_sample.c) ------------------------------------------- */

/*
 * After a slice of t on c, by the slot serving it, outside the lock: samples
 * t's backlog for /metrics when due (SCHEDULER_SAMPLE_SECONDS), and probes
 * whether a claim would take a row when the visit leaves t resting
 * (resting: a watched database, not due again until a wake; such rows keep
 * it polled), counting again when the visit claimed rows (claimed) of a
 * backlog the last count found; takes the identity again on c when a sample found it changed
 * (outboxctl identity set), on this connection or another of t's. -1 with
 * err when the database failed: the caller drops c.
 */
int scheduler_sample(struct scheduler *s, struct tenant *t, struct idle_connection *c,
                     bool resting, bool claimed, struct outbox_error *err);

/* ---- servers probed before a first visit (scheduler_probe.c) --------------- */

/*
 * Probes the servers of the databases never visited nor probed, all at
 * once (probe.h), outside the lock: one that does not answer within
 * SCHEDULER_PROBE_TIMEOUT_MS is backed off as if a visit had failed, so
 * the slots reach the healthy ones first; one that answers is no longer
 * doubtful (pick() in scheduler.c). Run by the watch thread before a look.
 */
void scheduler_probe_new(struct scheduler *s);

/* ---- the statistics watch's thread (scheduler_wake.c) --------------------- */

/* The watch thread's body: looks, and makes the databases it woke due. arg: the scheduler. */
void *scheduler_watch_run(void *arg);

/* Gives a connection of the watch back to the budget (a watch_give_fn). */
void scheduler_watch_give(void *arg);

#endif
