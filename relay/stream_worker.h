/*
 * stream_worker.h - a database's stream worker, shared by stream.c (between
 * turns, its lifecycle), stream_partition.c (the partitions it holds: their
 * leases and each one's publishing turn) and scheduler_stream.c, which
 * keeps one for each database with a stream queue and runs it on the slot
 * serving the database, on the slot's connections: no thread of its own.
 */
#ifndef OUTBOX_STREAM_WORKER_H
#define OUTBOX_STREAM_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cloudevents.h"
#include "otel.h"
#include "config.h"
#include "log.h"
#include "sink.h"
#include "store_identity.h"
#include "store_stream.h"

/* Partitions one relay may hold at once. */
#define STREAM_MAX_PARTITIONS 256

/* A held partition and when it may be read again (a row waiting out its backoff). */
struct owned {
    struct stream_partition p;
    double wait_until;
};

/*
 * One database's stream worker: the partitions it holds and its batch
 * buffers; the database and broker connections are the slot's, lent for
 * the slot's turn. guard: the slot that claimed its streams
 * (scheduler_stream.c's claim()).
 */
struct stream_worker {
    struct stream_runner *runner;
    const struct relay_config *config;
    const char *owner;
    const char *who; /* what log lines name it by: "thread=stream", or "database=NAME" */
    enum log_level acquired_log; /* of "stream partition acquired": DEBUG where it is routine */
    int modulus, residue; /* it takes the partitions p with p % modulus == residue */
    stream_store *store;  /* on the connection a slot lends */
    struct store_identity identity; /* the database's, read when store connected */
    sink *sink;
    struct owned owned[STREAM_MAX_PARTITIONS];
    size_t owned_count;
    double lease_seconds;
    char *queues; /* --queues as a text[] literal; NULL: every stream */
    double next_renew, next_report, next_cleanup; /* next_report < 0: never (a list's) */
    bool reload_cursors; /* a new connection: the next renewal reads the held cursors again */
    unsigned int seed;
    struct sink_message *messages;
    cloudevents *cloudevents; /* the batch's CloudEvents; NULL with --cloudevents off */
    otel_batch *otel;         /* the batch's spans (otel.h); NULL with spans off */
    bool traced;              /* otel_prepare() succeeded for the batch */
    char (*places)[STREAM_PLACE_SIZE]; /* each message's place.at */
    char floor[STREAM_PLACE_SIZE];     /* the cursor as a place */
    char (*verdicts)[SINK_CHECK_SIZE + 8]; /* each message's answer to its broker's check */
    struct sink_outcome *outcomes;
    struct stream_refusal *refusals;
    double *lags; /* commit-to-publish seconds of accepted rows */
    double turn_until; /* monotonic seconds when a pass ends between batches (0: never) */
    size_t next_turn;  /* the held partition a pass starts at (one cut short by turn_until) */
    uint64_t settled;  /* rows whose outcome the cursor's advance recorded */
};

/* The guard of each field is the comment "guard:" before it, good until the next. */
struct stream_runner {
    /* guard: none needed: set by stream_runner_new(), read-only */
    const struct relay_config *config;
    struct metrics *metrics;
    char owner[192];
    char *queues; /* --queues as a text[] literal; NULL: every stream */
    /* guard: atomic */
    atomic_int stopping;
};

/*
 * Sets sr up as a worker of runner, its batches sized for --batch-size; it
 * publishes through the broker of the slot that runs it. 0, or -1 with err.
 */
int stream_worker_init(struct stream_runner *runner, struct stream_worker *sr,
                       struct outbox_error *err);

/* Frees what sr holds. */
void stream_worker_clear(struct stream_worker *sr);

/*
 * Samples the lag of every partition and the transaction holding the
 * horizon for the gauges; logs lagging partitions and, when one lags, that
 * transaction. Sets when it is due next. 0, or -1 with err.
 */
int stream_report_lag(struct stream_worker *sr, struct outbox_error *err);
/*
 * One pass over the held partitions, a partition's turn each (those waiting
 * out a backoff skipped), ended at sr->turn_until after one turn at least;
 * the next pass starts with the partition it did not reach, so every
 * partition gets its turn however short the passes. *rows: rows read in
 * all. 0, or -1 with err on a database failure.
 */
int stream_partitions_pass(struct stream_worker *sr, size_t *rows, struct outbox_error *err);

/*
 * Deletes the places of ordering keys below the horizon and, with a
 * --retention, published rows older than it, STREAM_CLEANUP_ROWS a
 * statement (each its own short transaction); sets when it is due next (at
 * once while a statement found a full batch). 0, or -1 with err.
 */
int stream_cleanup_turn(struct stream_worker *sr, struct outbox_error *err);

/* Gives every lease and the membership back so that another relay takes over at once. */
void stream_worker_release_all(struct stream_worker *sr);

/* The runner was told to stop: every thread ends its turn and returns. */
bool stream_worker_stopping(const struct stream_worker *sr);

/*
 * Renews the held leases, gives back a surplus and takes free partitions
 * (see stream_partition.c), and sets when the next renewal is due. 0, or
 * -1 with err on a database failure.
 */
int stream_leases_turn(struct stream_worker *sr, struct outbox_error *err);

/*
 * One turn of held partition index: a few batches read, published in order
 * and settled, the cursor advanced past what the broker took; *rows counts
 * the rows read. 0, or -1 with err on a database failure.
 */
int stream_partition_turn(struct stream_worker *sr, size_t index, size_t *rows,
                          struct outbox_error *err);

#endif
