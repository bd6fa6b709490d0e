/*
 * metrics_families.h - what the metrics count and sample, by name: the enums
 * that index the fixed families (counters, targets, histograms), the samples
 * the relay hands in, and the endpoint limit. metrics.h includes it, and so
 * does metrics_state.h, the state behind struct metrics.
 */
#ifndef OUTBOX_METRICS_FAMILIES_H
#define OUTBOX_METRICS_FAMILIES_H

#include <stdbool.h>
#include <stdint.h>

/* Counters labelled {queue}: rows moving through the relay. */
enum metrics_queue_counter {
    METRICS_ROWS_CLAIMED = 0, /* outbox_rows_claimed_total: rows claimed */
    METRICS_ROWS_PUBLISHED,   /* outbox_rows_published_total: rows acknowledged by the broker */
    METRICS_ROWS_COMPLETED,   /* outbox_rows_completed_total: rows marked succeeded */
    METRICS_ROWS_FAILED,      /* outbox_rows_failed_total: failed attempts given back to retry */
    METRICS_ROWS_DEAD,        /* outbox_rows_dead_total: rows that ran out of attempts */
    METRICS_QUEUE_COUNTER_COUNT,
};

/* Counters without labels. */
enum metrics_counter {
    METRICS_ROWS_REAPED = 0, /* outbox_rows_reaped_total: expired leases recovered */
    METRICS_ROWS_RELEASED,   /* outbox_rows_released_total: rows given back without an attempt */
    METRICS_LEASE_LOST,      /* outbox_lease_lost_total: rows whose lease was lost before done */
    METRICS_CLAIMS,          /* outbox_claims_total: claim statements run */
    METRICS_ROWS_DELETED,    /* outbox_rows_deleted_total: succeeded rows deleted by retention */
    METRICS_SPANS_EXPORTED,  /* outbox_otel_spans_exported_total: spans a collector took */
    METRICS_SPANS_DROPPED,   /* outbox_otel_spans_dropped_total: queue full or export failed */
    METRICS_SPAN_EXPORTS_FAILED, /* outbox_otel_exports_failed_total: exports that failed */
    METRICS_COUNTER_COUNT,
};

/* The two ends of the relay, the {target} label. */
enum metrics_target {
    METRICS_DATABASE = 0, /* target="database" */
    METRICS_BROKER,       /* target="broker" */
    METRICS_TARGET_COUNT,
};

/* Histograms of durations in seconds (buckets 0.001 .. 10, then +Inf). */
enum metrics_histogram {
    METRICS_PUBLISH_DURATION = 0, /* outbox_publish_duration_seconds: one batch publish round */
    METRICS_COMMIT_TO_PUBLISH,    /* outbox_commit_to_publish_seconds: created_at to broker ack */
    METRICS_HISTOGRAM_COUNT,
};

/* One queue's backlog and pauses, as sampled from the database. */
struct metrics_queue_sample {
    const char *queue;
    int64_t ready_rows;
    double oldest_ready_age_seconds;
    bool paused;         /* outbox_queue_paused{queue} */
    int64_t paused_keys; /* outbox_queue_paused_keys{queue} */
};

/* Size and cleanup figures of outbox.job, as sampled from the database. */
struct metrics_table_sample {
    int64_t table_bytes;                            /* outbox_table_bytes */
    int64_t index_bytes;                            /* outbox_index_bytes */
    int64_t dead_tuples;                            /* outbox_dead_tuples */
    int64_t succeeded_rows;                         /* outbox_succeeded_rows */
    int64_t succeeded_past_retention_rows;          /* outbox_succeeded_past_retention_rows */
    double oldest_succeeded_past_retention_seconds; /* outbox_oldest_succeeded_past_retention_seconds */
};

/* Most broker endpoints outbox_broker_endpoint{endpoint} tracks (a URL's limit). */
#define METRICS_MAX_ENDPOINTS 16

#endif
