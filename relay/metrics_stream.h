/*
 * metrics_stream.h - the stream gauges: per-partition lag and owner, and
 * the transaction holding the stream horizon.
 *
 * Part of struct metrics (metrics.c creates, renders and frees it); the
 * stream thread that reports lag replaces the whole sample at once, so a
 * partition or owner gone drops out of /metrics. Series are bounded: at
 * most max_queues stream queues (--metrics-max-queues, 0 no cap) of at most
 * 256 partitions each; partitions of queues past the cap are counted in
 * outbox_stream_partitions_folded, not exported. Thread-safe (own mutex).
 */
#ifndef OUTBOX_METRICS_STREAM_H
#define OUTBOX_METRICS_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buffer.h"

/* One stream partition at a sample. */
struct metrics_stream_partition {
    const char *queue;
    int partition;
    const char *owner; /* "" when no relay holds a live lease */
    int64_t lag_rows;
    double lag_seconds; /* age of the oldest row after the cursor, 0 when none */
};

/* The oldest transaction with an xid, which every stream read waits for. */
struct metrics_stream_horizon {
    bool found;
    int pid;       /* 0 for a prepared transaction */
    bool prepared; /* a prepared transaction (no backend) holds it */
    double age_seconds;
};

struct metrics_stream;

/* NULL when out of memory. */
struct metrics_stream *metrics_stream_new(void);
void metrics_stream_free(struct metrics_stream *s);

/*
 * Replaces the sample (partitions in queue order, as the lag query gives
 * them). Keeps the previous one when out of memory.
 */
void metrics_stream_set(struct metrics_stream *s, const struct metrics_stream_partition *partitions,
                        size_t count, const struct metrics_stream_horizon *horizon,
                        size_t max_queues);

/*
 * Appends the stream families; broker is the constant label value or NULL.
 * Nothing before the first sample (a relay with no stream shows no family).
 */
void metrics_stream_render(struct metrics_stream *s, struct buffer *o, const char *broker);

#endif
