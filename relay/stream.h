/*
 * stream.h - the stream pipeline: publishing stream queues from their cursors.
 *
 * Beside the row-state pipelines, a relay runs --concurrency stream
 * threads, each with its own database connection (a stream_store) and
 * broker connection (a sink), under one owner name for the relay; thread i
 * takes the free partitions p with p % concurrency == i, up to a fair share
 * of all partitions among the relays holding one. For each of its
 * partitions in turn it reads the rows after the cursor, publishes them and
 * moves the cursor past what the broker confirmed, in one fenced write. A
 * refused row leaves the stream for the row-state path (ready with a
 * backoff, then dead), unless --ordering-dead-policy block and a later row
 * of its key waits behind it in the batch: then the partition stops at it
 * and tries it again after the backoff. Between turns the threads renew
 * their leases; the first one also logs lagging partitions with the
 * transaction holding the horizon, and deletes published rows older than
 * --retention.
 *
 * With no stream queue the threads hold no connection at all: the
 * maintenance thread, on the connection it holds anyway, looks for a stream
 * queue among --queues (stream_runner_check), and the threads connect once
 * one exists; a thread opens its broker connection once it holds a
 * partition. Stopping: the batch in flight is published and recorded, the
 * leases are given back, so another relay takes over at once.
 */
#ifndef OUTBOX_RELAY_STREAM_H
#define OUTBOX_RELAY_STREAM_H

#include <libpq-fe.h>

#include "config.h"
#include "metrics.h"

typedef struct stream_runner stream_runner;

/* NULL with err on failure (bad broker options, out of memory). */
stream_runner *stream_runner_new(const struct relay_config *config, const char *worker_prefix,
                                 struct metrics *m, struct outbox_error *err);
void stream_runner_free(stream_runner *sr);

/*
 * A runner of no thread, for a relay of a list (scheduler_stream.c): the
 * owner name, the metrics and the stop flag the stream workers of its
 * databases share, each run by the slot serving its database. Never
 * started nor joined; stream_runner_stop and _free as above. NULL with err.
 */
stream_runner *stream_runner_new_shared(const struct relay_config *config,
                                        const char *worker_prefix, struct metrics *m,
                                        struct outbox_error *err);

/* Starts the thread. 0, or -1 with err. */
int stream_runner_start(stream_runner *sr, struct outbox_error *err);

/*
 * Looks on conn, a connection the caller holds, for a stream queue among
 * --queues; once one is found the threads connect (and later calls return
 * at once). 0, or -1 with err when the query failed.
 */
int stream_runner_check(stream_runner *sr, PGconn *conn, struct outbox_error *err);

/* No check will come any more: with --once, threads still waiting for one return. */
void stream_runner_checks_over(stream_runner *sr);

/* Asks the thread to stop after its batch in flight; async-signal-safe. */
void stream_runner_stop(stream_runner *sr);

/* Waits for the thread (a no-op when it was never started). */
void stream_runner_join(stream_runner *sr);

#endif
