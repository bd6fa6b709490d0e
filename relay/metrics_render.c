/*
 * metrics_render.c - the metrics as Prometheus text format 0.0.4: each
 * family with its HELP and TYPE lines, the broker label on every series,
 * label values escaped (see metrics.h for what is rendered).
 */
#include "metrics.h"
#include "metrics_state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "metrics_database.h"
#include "metrics_stream.h"

static const char *const bucket_labels[] = {"0.001", "0.0025", "0.005", "0.01", "0.025",
                                            "0.05",  "0.1",    "0.25",  "0.5",  "1",
                                            "2.5",   "5",      "10"};

/* Name and help text of a family, indexed by the matching enum. */
struct family_info {
    const char *name;
    const char *help;
};

static const struct family_info queue_counter_info[METRICS_QUEUE_COUNTER_COUNT] = {
    {"outbox_rows_claimed_total", "Rows claimed from the outbox."},
    {"outbox_rows_published_total", "Rows acknowledged by the broker."},
    {"outbox_rows_completed_total", "Rows marked succeeded after publishing."},
    {"outbox_rows_failed_total", "Failed publish attempts given back for a retry."},
    {"outbox_rows_dead_total", "Rows that ran out of attempts and became dead."},
};

static const struct family_info counter_info[METRICS_COUNTER_COUNT] = {
    {"outbox_rows_reaped_total", "Rows whose expired lease was reaped."},
    {"outbox_rows_released_total", "Rows given back without spending an attempt."},
    {"outbox_lease_lost_total", "Rows whose lease was lost before they were marked done."},
    {"outbox_claims_total", "Claim statements run."},
    {"outbox_rows_deleted_total", "Succeeded rows deleted by the retention cleanup."},
    {"outbox_otel_spans_exported_total", "Spans an OpenTelemetry collector accepted."},
    {"outbox_otel_spans_dropped_total",
     "Spans dropped: the export queue was full, or the collector failed or was slow."},
    {"outbox_otel_exports_failed_total", "Span exports that failed (down, slow, an error answer)."},
};

static const struct family_info histogram_info[METRICS_HISTOGRAM_COUNT] = {
    {"outbox_publish_duration_seconds", "Duration of one batch publish round."},
    {"outbox_commit_to_publish_seconds",
     "Time from a row's created_at to the broker's acknowledgement."},
};

/* Appends a label value escaped per the text format: \\, \" and \n. */
static void
out_label_value(struct buffer *o, const char *v)
{
    for (; *v != '\0'; v++) {
        if (*v == '\\')
            buffer_puts(o, "\\\\");
        else if (*v == '"')
            buffer_puts(o, "\\\"");
        else if (*v == '\n')
            buffer_puts(o, "\\n");
        else
            buffer_append(o, v, 1);
    }
}

/* Appends {broker="...",key="value"}; key NULL for none; nothing when no labels. */
static void
out_labels(struct buffer *o, const struct metrics *m, const char *key, const char *value)
{
    bool any = false;

    if (m->broker == NULL && key == NULL)
        return;
    buffer_puts(o, "{");
    if (m->broker != NULL) {
        buffer_puts(o, "broker=\"");
        out_label_value(o, m->broker);
        buffer_puts(o, "\"");
        any = true;
    }
    if (key != NULL) {
        if (any)
            buffer_puts(o, ",");
        buffer_puts(o, key);
        buffer_puts(o, "=\"");
        out_label_value(o, value ? value : "");
        buffer_puts(o, "\"");
    }
    buffer_puts(o, "}");
}

static void
out_header(struct buffer *o, const char *name, const char *help, const char *type)
{
    buffer_puts(o, "# HELP ");
    buffer_puts(o, name);
    buffer_puts(o, " ");
    buffer_puts(o, help);
    buffer_puts(o, "\n# TYPE ");
    buffer_puts(o, name);
    buffer_puts(o, " ");
    buffer_puts(o, type);
    buffer_puts(o, "\n");
}

/* A sample value: integers exactly, others with enough digits, specials as Prometheus spells them.
 */
static void
out_double(struct buffer *o, double v)
{
    if (isnan(v))
        buffer_puts(o, "NaN");
    else if (isinf(v))
        buffer_puts(o, v > 0 ? "+Inf" : "-Inf");
    else
        buffer_printf(o, "%.15g", v);
}

static void
render_histogram(struct buffer *o, const struct metrics *m, const struct family_info *info,
                 const struct histogram *h)
{
    uint64_t cumulative = 0;

    out_header(o, info->name, info->help, "histogram");
    for (size_t i = 0; i <= METRICS_BUCKET_COUNT; i++) {
        cumulative += h->buckets[i];
        buffer_printf(o, "%s_bucket", info->name);
        /* The broker label goes first, then le, as in the other families. */
        if (m->broker != NULL) {
            buffer_puts(o, "{broker=\"");
            out_label_value(o, m->broker);
            buffer_puts(o, "\",le=\"");
        } else {
            buffer_puts(o, "{le=\"");
        }
        buffer_puts(o, i < METRICS_BUCKET_COUNT ? bucket_labels[i] : "+Inf");
        buffer_printf(o, "\"} %llu\n", (unsigned long long)cumulative);
    }
    buffer_printf(o, "%s_sum", info->name);
    out_labels(o, m, NULL, NULL);
    buffer_puts(o, " ");
    out_double(o, h->sum);
    buffer_printf(o, "\n%s_count", info->name);
    out_labels(o, m, NULL, NULL);
    buffer_printf(o, " %llu\n", (unsigned long long)h->count);
}

/* One unlabelled gauge. */
static void
render_gauge(struct buffer *o, const struct metrics *m, const char *name, const char *help,
             double value)
{
    out_header(o, name, help, "gauge");
    buffer_puts(o, name);
    out_labels(o, m, NULL, NULL);
    buffer_puts(o, " ");
    out_double(o, value);
    buffer_puts(o, "\n");
}

/* The size and cleanup gauges of outbox.job. */
static void
render_table_gauges(struct buffer *o, const struct metrics *m)
{
    const struct metrics_table_sample *t = &m->table;

    render_gauge(o, m, "outbox_table_bytes",
                 "Size of outbox.job (heap and TOAST) at the last sample.",
                 (double)t->table_bytes);
    render_gauge(o, m, "outbox_index_bytes", "Size of the indexes of outbox.job at the last sample.",
                 (double)t->index_bytes);
    render_gauge(o, m, "outbox_dead_tuples",
                 "Dead row versions of outbox.job not yet vacuumed, at the last sample.",
                 (double)t->dead_tuples);
    render_gauge(o, m, "outbox_succeeded_rows", "Succeeded rows in outbox.job at the last sample.",
                 (double)t->succeeded_rows);
    render_gauge(o, m, "outbox_succeeded_past_retention_rows",
                 "Succeeded rows older than --retention, still waiting for cleanup.",
                 (double)t->succeeded_past_retention_rows);
    render_gauge(o, m, "outbox_oldest_succeeded_past_retention_seconds",
                 "How long the oldest succeeded row has been past --retention (0: none).",
                 t->oldest_succeeded_past_retention_seconds);
}

/* The counters: per queue, relay-wide, and reconnects per target. */
static void
render_counters(struct buffer *o, const struct metrics *m)
{
    for (size_t c = 0; c < METRICS_QUEUE_COUNTER_COUNT; c++) {
        out_header(o, queue_counter_info[c].name, queue_counter_info[c].help, "counter");
        for (size_t q = 0; q < m->queue_count; q++) {
            buffer_puts(o, queue_counter_info[c].name);
            out_labels(o, m, "queue", m->queues[q].name);
            buffer_printf(o, " %llu\n", (unsigned long long)m->queues[q].counters[c]);
        }
    }
    for (size_t c = 0; c < METRICS_COUNTER_COUNT; c++) {
        out_header(o, counter_info[c].name, counter_info[c].help, "counter");
        buffer_puts(o, counter_info[c].name);
        out_labels(o, m, NULL, NULL);
        buffer_printf(o, " %llu\n", (unsigned long long)m->counters[c]);
    }
    out_header(o, "outbox_reconnects_total", "Reconnects after a lost connection, by target.",
               "counter");
    for (size_t t = 0; t < METRICS_TARGET_COUNT; t++) {
        buffer_puts(o, "outbox_reconnects_total");
        out_labels(o, m, "target", metrics_target_names[t]);
        buffer_printf(o, " %llu\n", (unsigned long long)m->reconnects[t]);
    }
}

/* Rows in flight, then the per-queue gauges of the last sample. */
static void
render_queue_gauges(struct buffer *o, const struct metrics *m)
{
    out_header(o, "outbox_rows_in_flight", "Rows claimed and not yet completed or given back.",
               "gauge");
    buffer_puts(o, "outbox_rows_in_flight");
    out_labels(o, m, NULL, NULL);
    buffer_printf(o, " %lld\n", (long long)m->in_flight);

    out_header(o, "outbox_ready_rows", "Ready rows per queue at the last sample.", "gauge");
    for (size_t q = 0; q < m->queue_count; q++) {
        buffer_puts(o, "outbox_ready_rows");
        out_labels(o, m, "queue", m->queues[q].name);
        buffer_printf(o, " %lld\n", (long long)m->queues[q].ready_rows);
    }
    out_header(o, "outbox_oldest_ready_age_seconds",
               "Age of the oldest ready row per queue at the last sample.", "gauge");
    for (size_t q = 0; q < m->queue_count; q++) {
        buffer_puts(o, "outbox_oldest_ready_age_seconds");
        out_labels(o, m, "queue", m->queues[q].name);
        buffer_puts(o, " ");
        out_double(o, m->queues[q].oldest_ready_age_seconds);
        buffer_puts(o, "\n");
    }
    out_header(o, "outbox_queue_paused",
               "Whether the queue is paused (1) or not (0) at the last sample.", "gauge");
    for (size_t q = 0; q < m->queue_count; q++) {
        buffer_puts(o, "outbox_queue_paused");
        out_labels(o, m, "queue", m->queues[q].name);
        buffer_printf(o, " %d\n", m->queues[q].paused ? 1 : 0);
    }
    out_header(o, "outbox_queue_paused_keys",
               "Ordering keys of the queue paused at the last sample.", "gauge");
    for (size_t q = 0; q < m->queue_count; q++) {
        buffer_puts(o, "outbox_queue_paused_keys");
        out_labels(o, m, "queue", m->queues[q].name);
        buffer_printf(o, " %lld\n", (long long)m->queues[q].paused_keys);
    }
}

/*
 * outbox_last_round_trip_age_seconds{target}: how long ago the last round
 * trip with each end succeeded; +Inf before the first.
 */
static void
render_round_trip_ages(struct buffer *o, const struct metrics *m)
{
    double now = m->now(m->now_context);

    out_header(o, "outbox_last_round_trip_age_seconds",
               "Seconds since the last successful round trip with the target (+Inf: none yet).",
               "gauge");
    for (size_t t = 0; t < METRICS_TARGET_COUNT; t++) {
        buffer_puts(o, "outbox_last_round_trip_age_seconds");
        out_labels(o, m, "target", metrics_target_names[t]);
        buffer_puts(o, " ");
        out_double(o, m->answered[t] ? now - m->last_round_trip[t] : INFINITY);
        buffer_puts(o, "\n");
    }
}

/* Connection state, round-trip ages, the xmin horizon, folded queues and the broker endpoints. */
static void
render_health_gauges(struct buffer *o, const struct metrics *m)
{
    out_header(o, "outbox_up", "Whether the relay is connected to the target (1) or not (0).",
               "gauge");
    for (size_t t = 0; t < METRICS_TARGET_COUNT; t++) {
        buffer_puts(o, "outbox_up");
        out_labels(o, m, "target", metrics_target_names[t]);
        buffer_printf(o, " %d\n", m->up[t] ? 1 : 0);
    }
    render_round_trip_ages(o, m);

    out_header(o, "outbox_xmin_horizon_age_seconds",
               "Age of the oldest transaction holding back vacuum at the last sample (0: none).",
               "gauge");
    buffer_puts(o, "outbox_xmin_horizon_age_seconds");
    out_labels(o, m, NULL, NULL);
    buffer_puts(o, " ");
    out_double(o, m->horizon_age_seconds);
    buffer_puts(o, "\n");

    out_header(o, "outbox_metrics_queues_folded",
               "Queues past --metrics-max-queues, whose figures are summed under queue=\""
               METRICS_OTHER_QUEUE "\".",
               "gauge");
    buffer_puts(o, "outbox_metrics_queues_folded");
    out_labels(o, m, NULL, NULL);
    buffer_printf(o, " %zu\n", m->folded_count);

    if (m->endpoint_count > 0) {
        out_header(o, "outbox_broker_endpoint",
                   "Connections to each broker endpoint (host:port); 0 for one not in use.",
                   "gauge");
        for (size_t i = 0; i < m->endpoint_count; i++) {
            buffer_puts(o, "outbox_broker_endpoint");
            out_labels(o, m, "endpoint", m->endpoints[i]);
            buffer_printf(o, " %lld\n", (long long)m->endpoint_connections[i]);
        }
    }
}

char *
metrics_render(struct metrics *m, size_t *length)
{
    struct buffer o = {0};

    if (m == NULL)
        return NULL;
    pthread_mutex_lock(&m->lock);
    render_counters(&o, m);
    render_queue_gauges(&o, m);
    render_table_gauges(&o, m);
    render_health_gauges(&o, m);
    metrics_stream_render(m->stream, &o, m->broker);
    metrics_databases_render(m->databases, &o, m->broker);
    for (size_t h = 0; h < METRICS_HISTOGRAM_COUNT; h++)
        render_histogram(&o, m, &histogram_info[h], &m->histograms[h]);

    pthread_mutex_unlock(&m->lock);
    if (o.failed) {
        free(o.data);
        return NULL;
    }
    if (length != NULL)
        *length = o.len;
    return o.data;
}
