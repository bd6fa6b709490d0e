/*
 * stream_worker.h - a stream thread's state, shared by stream.c (the
 * threads, their waits and their lifecycle) and stream_partition.c (the
 * partitions a thread holds: their leases and each one's publishing turn).
 * No other file includes this header.
 */
#ifndef OUTBOX_STREAM_WORKER_H
#define OUTBOX_STREAM_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"
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
 * One stream thread: its own database and broker connections, and the
 * partitions p with p % worker_count == index, so the threads of a relay
 * publish side by side under the relay's one owner name.
 */
struct stream_worker {
    struct stream_runner *runner;
    const struct relay_config *config;
    const char *owner;
    int index;
    pthread_t thread;
    bool started;
    stream_store *store;
    struct store_identity identity; /* the database's, read when store connected */
    sink *sink;
    struct owned owned[STREAM_MAX_PARTITIONS];
    size_t owned_count;
    double lease_seconds;
    char *queues; /* --queues as a text[] literal; NULL: every stream */
    double next_renew, next_report, next_cleanup;
    bool reload_cursors; /* a new connection: the next renewal reads the held cursors again */
    unsigned int seed;
    struct sink_message *messages;
    char (*places)[STREAM_PLACE_SIZE]; /* each message's place.at */
    char floor[STREAM_PLACE_SIZE];     /* the cursor as a place */
    struct sink_outcome *outcomes;
    struct stream_refusal *refusals;
    double *lags; /* commit-to-publish seconds of accepted rows */
};

struct stream_runner {
    const struct relay_config *config;
    struct metrics *metrics;
    char owner[192];
    atomic_int stopping;
    atomic_int checked;      /* stream_runner_check ran once (or never will) */
    atomic_int streams_seen; /* ... and found a stream queue: the threads connect */
    struct stream_worker *workers; /* worker_count publishing threads, then the watch thread */
    int worker_count;
};

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
