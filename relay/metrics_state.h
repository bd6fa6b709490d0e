/*
 * metrics_state.h - the state behind struct metrics, shared by metrics.c
 * (which changes it under m->lock) and metrics_render.c (which reads it,
 * under the same lock, into the Prometheus text). No other file includes
 * this header.
 */
#ifndef OUTBOX_METRICS_STATE_H
#define OUTBOX_METRICS_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics_database.h"
#include "metrics_families.h"
#include "metrics_stream.h"

/* Histogram buckets: upper bounds 0.001 s to 10 s (metrics.c), one slot more above. */
#define METRICS_BUCKET_COUNT 13

/* The label value of each enum metrics_target ("database", "broker"). */
extern const char *const metrics_target_names[METRICS_TARGET_COUNT];

/* The series of one queue; created on first use, kept sorted by name. guard: metrics' lock. */
struct queue_series {
    char *name;
    uint64_t counters[METRICS_QUEUE_COUNTER_COUNT];
    int64_t ready_rows;
    double oldest_ready_age_seconds;
    bool paused;         /* the whole queue is paused */
    int64_t paused_keys; /* ordering keys of it paused */
};

/* Non-cumulative bucket counts; the last slot counts observations above the top bound. */
struct histogram {
    uint64_t buckets[METRICS_BUCKET_COUNT + 1];
    uint64_t count;
    double sum;
};

struct metrics {
    pthread_mutex_t lock;
    /* guard: set by metrics_new() before any thread starts, read-only after */
    char *broker; /* constant label value, or NULL */
    /* guard: lock (metrics_set_clock changes it in tests) */
    double (*now)(void *context);
    void *now_context;
    /* guard: lock, every field from here to the end but where marked */

    struct queue_series *queues;
    size_t queue_count;
    size_t queue_capacity;
    size_t named_queues; /* series of queues by name, METRICS_OTHER_QUEUE not counted */
    size_t max_queues;   /* named series at most; later queues fold into METRICS_OTHER_QUEUE */
    char **folded;       /* names of the queues folded, sorted: counted once each */
    size_t folded_count;
    size_t folded_capacity;

    uint64_t counters[METRICS_COUNTER_COUNT];
    uint64_t reconnects[METRICS_TARGET_COUNT];
    bool up[METRICS_TARGET_COUNT];
    bool known[METRICS_TARGET_COUNT]; /* up[] was set at least once: the end was tried */
    bool answered[METRICS_TARGET_COUNT];    /* a round trip succeeded (last_round_trip is set) */
    double last_round_trip[METRICS_TARGET_COUNT]; /* by the metrics clock */
    double round_trip_window; /* an end without a round trip for longer is down */
    int64_t in_flight;
    struct metrics_table_sample table;
    struct histogram histograms[METRICS_HISTOGRAM_COUNT];

    char *endpoints[METRICS_MAX_ENDPOINTS]; /* broker endpoint names, "host:port" */
    int64_t endpoint_connections[METRICS_MAX_ENDPOINTS];
    size_t endpoint_count;

    char held[128];   /* why the broker holds rows back ("" when it takes them) */
    bool loop_turned; /* false until the first metrics_loop_turned() */
    double last_loop_turn;
    double horizon_age_seconds; /* oldest transaction holding back vacuum; 0 none */
    /* guard: the pointers set by metrics_new(), read-only; what they point to has its own lock */
    struct metrics_stream *stream; /* stream partitions and horizon (metrics_stream.c) */
    struct metrics_databases *databases; /* per database of --databases (metrics_database.c) */
};

#endif
