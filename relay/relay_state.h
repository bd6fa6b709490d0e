/*
 * relay_state.h - the state the relay's threads share, private to relay/.
 *
 * A relay owns its pipelines (pipeline.c, each a thread with a database
 * connection and a broker connection) and a maintenance thread
 * (maintenance.c, its own database connection). A thread's connections are
 * made and dropped in ends.c only; a batch's marks are kept in a settlement
 * (settle.c) until the database confirmed them. relay.c starts and stops
 * them all. A thread stops at relay_stopping(), set by relay_stop() or by
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
    size_t published; /* rows published, counted in flight until the settlement is cleared */
    bool *done;
    bool *dead;
};

/*
 * What a fault of a connection to a database means (ends.c). Each loop
 * says it for the connections it opens: a pipeline or the maintenance
 * thread of a relay of one database, whose faults are the relay's; a slot
 * serving a database of a list, whose faults are that database's.
 */
enum database_faults {
    /* connects retried until one works; a refused password at the first, or a
     * missing schema or privilege (but a revoked one), stops the relay */
    DATABASE_FAULT_STOPS_RELAY,
    /* a connect tried once and no fault stops the relay: the scheduler backs the
     * database off and serves the others meanwhile */
    DATABASE_FAULT_BACKS_OFF,
};

/*
 * A connection to a database and how it reconnects: each pipeline's and
 * the maintenance thread's own, and each connection a slot opens to a
 * database of a list (kept between slices in its tenant's idle[], see
 * scheduler_state.h). guard: the thread that holds it (a pipeline, the
 * maintenance thread, the slot that took it out of idle[]).
 */
struct database {
    relay *relay;
    outbox_store *store; /* NULL while disconnected */
    struct store_identity identity; /* the database's, read when store connected */
    char worker_id[192];
    /* leads the thread's log fields: "pipeline=0", "thread=maintenance", "database=a slot=0" */
    char who[96];
    const char *notice_who; /* leads its connections' notices; outlives them (database_open) */
    const char *url; /* the database's URL; NULL: --database-url */
    enum database_faults faults; /* what a fault of it means, set by the loop that opens it */
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
 * guard: the pipeline's own thread (a slot's with --databases), every field
 * but thread and started, the main thread's (relay_start, relay_join).
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
    double last_sink_idle;
    struct cause_log deferred_log;
    int connection_losses;   /* publishes in a row that lost the broker connection (publish_rows) */
    uint64_t rows_completed; /* rows marked succeeded (or deleted), for a slot's database */
    /* --once: when rows last moved, and why they did not since (once_stalled) */
    double progress_at;
    struct outbox_error cause;
};

/* The maintenance phases, in the order one pass of the loop runs them. */
enum maintenance_phase {
    PHASE_STREAM_CHECK = 0, /* a stream queue exists: the stream threads connect */
    PHASE_REAP,            /* expired leases back to ready (or dead) */
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

/* guard: the maintenance thread, but thread and started: the main thread's. */
struct maintenance {
    pthread_t thread;
    bool started;
    struct database db;
    struct maintenance_schedule schedule;
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
    struct pipeline *pipelines;
    int pipeline_count;              /* --concurrency, or with --databases --max-db-connections */
    struct scheduler *scheduler;     /* with --databases: the slots' scheduler (scheduler.c) */
    /* guard: its own (struct maintenance) */
    struct maintenance maintenance;
    /* guard: none needed: set by relay_new(), read-only */
    struct stream_runner *streams; /* stream queues (relay/stream.c) */
    /* guard: atomic */
    atomic_int stopping;
    atomic_int running;           /* threads (pipelines and maintenance) not yet returned */
    atomic_int pipelines_running; /* pipelines not yet returned; maintenance ends with them */
    atomic_int broker_logged_in;  /* a pipeline's broker login succeeded once: the credentials work */
    /* guard: none needed: a latch is set and read from any thread (wait.h) */
    struct wait_latch stop;           /* set by relay_stop() and the first fatal error */
    struct wait_latch reaped;         /* the maintenance thread reaped once (--once waits for it) */
    struct wait_latch pipelines_done; /* the last pipeline returned: maintenance ends */
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
