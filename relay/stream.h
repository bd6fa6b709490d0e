/*
 * stream.h - the stream queues: publishing them from their cursors.
 *
 * Each database with a stream queue among --queues has a stream worker
 * (stream_worker.h), run by the slot serving the database on the slot's
 * connections (scheduler_stream.c), under one owner name for the relay: it
 * takes the free partitions, up to a fair share of all partitions among the
 * relays holding one. For each of its partitions in turn it reads the rows
 * after the cursor, publishes them and moves the cursor past what the
 * broker confirmed, in one fenced write. A refused row leaves the stream
 * for the row-state path (ready with a backoff, then dead), unless
 * --ordering-dead-policy block and a later row of its key waits behind it
 * in the batch: then the partition stops at it and tries it again after
 * the backoff. Between passes the worker renews its leases, reports the
 * lag of the relay's own database's partitions, and deletes published rows
 * older than --retention. Stopping: the batch in flight is published and
 * recorded, the leases are given back, so another relay takes over at once.
 */
#ifndef OUTBOX_RELAY_STREAM_H
#define OUTBOX_RELAY_STREAM_H

#include "config.h"
#include "metrics.h"

typedef struct stream_runner stream_runner;

/*
 * What the stream workers of a relay share: the owner name of their
 * leases, the metrics, --queues and the stop flag. NULL with err.
 */
stream_runner *stream_runner_new(const struct relay_config *config, const char *worker_prefix,
                                 struct metrics *m, struct outbox_error *err);
void stream_runner_free(stream_runner *sr);

/* Asks every worker to stop after its batch in flight; async-signal-safe. */
void stream_runner_stop(stream_runner *sr);

#endif
