/*
 * relay_state.h - the state the relay's threads share, private to relay/.
 *
 * A relay owns its slots (scheduler.c: each a thread with a broker
 * connection, serving the databases of its list, a list of one for
 * --database-url, on connections it takes from them). A thread's broker
 * connection is made and dropped in ends.c; a batch's marks are kept in a
 * settlement (settle.c) until the database confirmed them. relay.c starts
 * and stops them all. A thread stops at relay_stopping(), set by relay_stop() or by
 * the first fatal error, which also sets the stop latch that ends every
 * wait (wait.h) at once. The ground floor of the relay's threads:
 * relay_state.c calls none of the files that include this header.
 */
#ifndef OUTBOX_RELAY_STATE_H
#define OUTBOX_RELAY_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backoff.h"
#include "cause_log.h"
#include "cloudevents.h"
#include "otel.h"
#include "config.h"
#include "metrics.h"
#include "order_checks.h"
#include "outbox.h"
#include "sink.h"
#include "store_identity.h"
#include "timeouts.h"
#include "wait.h"

typedef struct relay relay;

/*
 * The rows of one claimed batch, and once it is published, its rows sorted
 * by outcome until the database has marked them: accepted rows are
 * completed, rows that failed through their own fault are failed (an
 * attempt spent), deferred rows (broker connection or channel lost, broker
 * busy: nobody's fault) are given back, their attempt not spent. Queue
 * names point into the batch, error texts into the outcomes, so both live
 * as long as the settlement. guard: the thread of its pipeline alone.
 */
struct settlement {
    struct outbox_batch batch;
    struct sink_outcome *outcomes;
    struct outbox_lease *leases; /* accepted rows */
    const char **lease_queues;
    size_t accepted;                 /* rows in leases[] not marked yet */
    struct outbox_failure *failures; /* rejected or failed rows */
    const char **failure_queues;
    size_t failed;                 /* rows in failures[] not marked yet */
    struct outbox_lease *deferred_leases; /* deferred rows */
    size_t deferred;                      /* rows in deferred_leases[] not given back yet */
    size_t asked; /* of those, rows a broker's order record asked a check of (order_checks.h) */
    size_t published; /* rows published, counted in flight until the settlement is cleared */
    bool *done;
    bool *dead;
};

/*
 * What a fault of a connection to a database means (ends.c), said by the
 * slot that opens it: the relay's own database's faults are the relay's; a
 * database of a list's are that database's.
 */
enum database_faults {
    /* reconnects retried until one works; a refused password at the first, or a
     * missing schema or privilege (but a revoked one), stops the relay */
    DATABASE_FAULT_STOPS_RELAY,
    /* a connect tried once and no fault stops the relay: the scheduler backs the
     * database off and serves the others meanwhile */
    DATABASE_FAULT_BACKS_OFF,
};

/*
 * A connection to a database and how it reconnects: each connection a slot
 * opens to a database (kept between slices in its tenant's idle[], see
 * scheduler_state.h), and a slot's own, which names it in the log. guard:
 * the slot that holds it (that took it out of idle[]).
 */
struct database {
    relay *relay;
    outbox_store *store; /* NULL while disconnected */
    struct store_identity identity; /* the database's, read when store connected */
    char worker_id[192];
    /* leads the slot's log fields: "pipeline=0" (the relay's own database), "database=a slot=0" */
    char who[96];
    const char *notice_who; /* leads its connections' notices; outlives them (database_open) */
    const char *url; /* the database's URL; NULL: --database-url */
    enum database_faults faults; /* what a fault of it means, set by the loop that opens it */
    const struct store_connect_options *steps; /* the connect steps left out; NULL: none */
    bool waits_out_once; /* --once's connect budget is not its own (the own database's upkeep) */
    unsigned long connects; /* connections made: a reconnect within a slot's slice shows */
    unsigned int seed;      /* a pipeline's row retry jitter */
    struct backoff reconnect;
    struct cause_log connect_log, error_log;
    /*
     * whose connect_log and error_log limit its lines: NULL, its own; a
     * listed database's connection, the slot's serving it (set per slice)
     */
    struct database *log_owner;
};

/*
 * A slot: its broker connection and batch buffers. guard: the slot's own
 * thread, every field but thread and started, the main thread's
 * (relay_start, relay_join).
 */
struct pipeline {
    relay *relay;
    int index;
    pthread_t thread;
    bool started;
    struct database db;
    sink *sink;
    bool sink_counted;      /* connected and counted in outbox_broker_endpoint */
    size_t endpoint_in_use; /* the endpoint connected to, while sink_counted */

    /* per-batch scratch, sized for --batch-size */
    struct sink_message *messages;
    cloudevents *cloudevents; /* the batch's CloudEvents; NULL with --cloudevents off */
    otel_batch *otel;         /* the batch's spans (otel.h); NULL with spans off */
    struct outbox_lease *leases; /* for extend and give back */
    bool *done;
    double *lags; /* commit-to-publish seconds of accepted rows */
    /*
     * settlements[current] holds the batch being published, the other slot
     * the one before it, being marked (see relay_turn)
     */
    struct settlement settlements[2];
    int current;

    struct backoff deferral; /* see pause_after_deferral() */
    struct order_checks checks; /* the order records' checks its rows asked, and the verdicts */
    double last_sink_idle;
    struct cause_log deferred_log;
    int connection_losses;   /* publishes in a row that lost the broker connection (publish_rows) */
    uint64_t rows_completed; /* rows marked succeeded (or deleted), for a slot's database */
    /* --once: when rows last moved, and why they did not since (once_stalled) */
    double progress_at;
    struct outbox_error cause;
};

/* The maintenance phases, in the order one visit runs them (maintenance.c). */
enum maintenance_phase {
    PHASE_REAP = 0,        /* expired leases back to ready (or dead) */
    PHASE_RELEASE_WAITING, /* held rows whose key's head finished while they were inserted */
    PHASE_CLEANUP,         /* succeeded rows older than --retention */
    PHASE_SAMPLE,          /* backlog gauges and the xmin horizon warning */
    PHASE_TABLE_SAMPLE,    /* size, dead tuples and succeeded rows of outbox.job */
    PHASE_COUNT,
};

/* When each maintenance phase of one database runs next. guard: whoever maintains it. */
struct maintenance_schedule {
    double due[PHASE_COUNT]; /* monotonic seconds when each phase runs next */
    size_t cleaned;          /* rows deleted by the cleanup runs since it last caught up */
    double cleanup_started;  /* when those runs began */
};

/*
 * The guard of each field is the comment "guard:" before it, good until the
 * next (docs/design.md: threads and locks).
 */
struct relay {
    /* guard: none needed: set by relay_new() and relay_start() before the threads, read-only */
    const struct relay_config *config;
    struct metrics *metrics;
    char worker_prefix[160];
    struct pipeline *pipelines;  /* the slots */
    int pipeline_count;          /* scheduler_slot_count() */
    struct scheduler *scheduler; /* which database each slot serves (scheduler.c) */
    /* guard: atomic */
    atomic_int stopping;
    atomic_int running;          /* slots not yet returned */
    atomic_int broker_logged_in;  /* a pipeline's broker login succeeded once: the credentials work */
    /* guard: none needed: a latch is set and read from any thread (wait.h) */
    struct wait_latch stop;           /* set by relay_stop() and the first fatal error */
    struct wait_latch reaped;         /* the own database was reaped once (--once waits for it) */
    /* guard: none needed: set by relay_start() before the threads, read-only */
    void (*finished)(void *arg);  /* called by the last thread to return */
    void *finished_arg;
    /* guard: atomic */
    atomic_int fatal;
    pthread_mutex_t fatal_lock;
    /* guard: fatal_lock */
    struct outbox_error fatal_error;
};

/* The stop flag and the first fatal error (relay_state.c) */

/* True once relay_stop() was called or a thread met a fatal error. */
bool relay_stopping(const relay *r);
/* Records the first fatal error; every thread stops. */
void relay_set_fatal(relay *r, const struct outbox_error *err);
/* Called by each thread as it returns; the last one tells relay_start's caller. */
void relay_thread_returned(relay *r);

#endif
