/*
 * metrics.c - fixed metric families, health state, Prometheus text rendering.
 */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buffer.h"
#include "clock.h"

static const double bucket_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25,  0.5,    1,     2.5,  5,     10};
static const char *const bucket_labels[] = {"0.001", "0.0025", "0.005", "0.01", "0.025",
                                            "0.05",  "0.1",    "0.25",  "0.5",  "1",
                                            "2.5",   "5",      "10"};
#define BUCKET_COUNT (sizeof(bucket_bounds) / sizeof(bucket_bounds[0]))

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
};

static const struct family_info histogram_info[METRICS_HISTOGRAM_COUNT] = {
    {"outbox_publish_duration_seconds", "Duration of one batch publish round."},
    {"outbox_commit_to_publish_seconds",
     "Time from a row's created_at to the broker's acknowledgement."},
};

static const char *const target_names[METRICS_TARGET_COUNT] = {"database", "broker"};

/* The series of one queue; created on first use, kept sorted by name. */
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
    uint64_t buckets[BUCKET_COUNT + 1];
    uint64_t count;
    double sum;
};

struct metrics {
    pthread_mutex_t lock;
    char *broker; /* constant label value, or NULL */
    double (*now)(void *context);
    void *now_context;

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
    struct metrics_stream *stream; /* stream partitions and horizon (metrics_stream.c) */
    struct metrics_databases *databases; /* per database of --databases (metrics_database.c) */
};

/* A growable output buffer; `failed` records an allocation failure. */
static double
monotonic_seconds(void *context)
{
    (void)context;
    return clock_monotonic_seconds();
}

struct metrics *
metrics_new(const char *broker)
{
    struct metrics *m = calloc(1, sizeof(*m));

    if (m == NULL)
        return NULL;
    if ((broker != NULL && (m->broker = strdup(broker)) == NULL) ||
        (m->stream = metrics_stream_new()) == NULL ||
        (m->databases = metrics_databases_new()) == NULL) {
        metrics_stream_free(m->stream);
        free(m->broker);
        free(m);
        return NULL;
    }
    pthread_mutex_init(&m->lock, NULL);
    m->now = monotonic_seconds;
    m->round_trip_window = METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS;
    return m;
}

void
metrics_free(struct metrics *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->queue_count; i++)
        free(m->queues[i].name);
    free(m->queues);
    for (size_t i = 0; i < m->folded_count; i++)
        free(m->folded[i]);
    free(m->folded);
    for (size_t i = 0; i < m->endpoint_count; i++)
        free(m->endpoints[i]);
    free(m->broker);
    metrics_stream_free(m->stream);
    metrics_databases_free(m->databases);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void
metrics_set_clock(struct metrics *m, double (*now)(void *context), void *context)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->now = now ? now : monotonic_seconds;
    m->now_context = now ? context : NULL;
    pthread_mutex_unlock(&m->lock);
}

/*
 * Binary search of the sorted names[0..count-1] (strings at a stride of
 * size bytes from first): the index of name, or where it would go.
 */
static size_t
sorted_position(const void *first, size_t size, size_t count, const char *name, bool *found)
{
    size_t low = 0, high = count;

    *found = false;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        int cmp = strcmp(*(char *const *)((const char *)first + mid * size), name);

        if (cmp == 0) {
            *found = true;
            return mid;
        }
        if (cmp < 0)
            low = mid + 1;
        else
            high = mid;
    }
    return low;
}

/* Remembers that queue was folded, once per name; caller holds the lock. */
static void
note_folded(struct metrics *m, const char *queue)
{
    bool found;
    size_t at = sorted_position(m->folded, sizeof(*m->folded), m->folded_count, queue, &found);
    char **grown;
    char *copy;

    if (found)
        return;
    grown = array_grow(m->folded, &m->folded_capacity, m->folded_count, sizeof(*m->folded));
    if (grown == NULL)
        return;
    m->folded = grown;
    copy = strdup(queue);
    if (copy == NULL)
        return;
    memmove(m->folded + at + 1, m->folded + at, (m->folded_count - at) * sizeof(*m->folded));
    m->folded[at] = copy;
    m->folded_count++;
}

static struct queue_series *series_find_or_add(struct metrics *m, const char *queue);

/*
 * The series a queue's figures go to: its own, or past max_queues named
 * series, METRICS_OTHER_QUEUE's. Caller holds the lock. NULL when out of
 * memory (the update is then dropped: metrics never fail the relay).
 */
static struct queue_series *
queue_series_get(struct metrics *m, const char *queue)
{
    bool found;

    if (queue == NULL)
        queue = "";
    if (m->max_queues == 0 || m->named_queues < m->max_queues ||
        strcmp(queue, METRICS_OTHER_QUEUE) == 0)
        return series_find_or_add(m, queue);
    (void)sorted_position(m->queues, sizeof(*m->queues), m->queue_count, queue, &found);
    if (found)
        return series_find_or_add(m, queue);
    note_folded(m, queue);
    return series_find_or_add(m, METRICS_OTHER_QUEUE);
}

/* Finds or creates the series named queue; caller holds the lock. NULL when out of memory. */
static struct queue_series *
series_find_or_add(struct metrics *m, const char *queue)
{
    size_t low = 0, high = m->queue_count;
    struct queue_series *series, *grown;

    while (low < high) {
        size_t mid = low + (high - low) / 2;
        int cmp = strcmp(m->queues[mid].name, queue);

        if (cmp == 0)
            return &m->queues[mid];
        if (cmp < 0)
            low = mid + 1;
        else
            high = mid;
    }
    grown = array_grow(m->queues, &m->queue_capacity, m->queue_count, sizeof(*m->queues));
    if (grown == NULL)
        return NULL;
    m->queues = grown;
    series = &m->queues[low];
    memmove(series + 1, series, (m->queue_count - low) * sizeof(*series));
    memset(series, 0, sizeof(*series));
    series->name = strdup(queue);
    if (series->name == NULL) {
        memmove(series, series + 1, (m->queue_count - low) * sizeof(*series));
        return NULL;
    }
    m->queue_count++;
    m->named_queues += strcmp(queue, METRICS_OTHER_QUEUE) != 0;
    return series;
}

void
metrics_set_max_queues(struct metrics *m, size_t max_queues)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->max_queues = max_queues;
    metrics_databases_set_max(m->databases, max_queues);
    pthread_mutex_unlock(&m->lock);
}

void
metrics_add_queue(struct metrics *m, enum metrics_queue_counter counter, const char *queue,
                  uint64_t n)
{
    struct queue_series *series;

    if (m == NULL || (unsigned)counter >= METRICS_QUEUE_COUNTER_COUNT)
        return;
    pthread_mutex_lock(&m->lock);
    series = queue_series_get(m, queue);
    if (series != NULL)
        series->counters[counter] += n;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_add(struct metrics *m, enum metrics_counter counter, uint64_t n)
{
    if (m == NULL || (unsigned)counter >= METRICS_COUNTER_COUNT)
        return;
    pthread_mutex_lock(&m->lock);
    m->counters[counter] += n;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_reconnected(struct metrics *m, enum metrics_target target)
{
    if (m == NULL || (unsigned)target >= METRICS_TARGET_COUNT)
        return;
    pthread_mutex_lock(&m->lock);
    m->reconnects[target]++;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_add_in_flight(struct metrics *m, int64_t delta)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->in_flight += delta;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_queue_samples(struct metrics *m, const struct metrics_queue_sample *samples,
                          size_t count)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->queue_count; i++) {
        m->queues[i].ready_rows = 0;
        m->queues[i].oldest_ready_age_seconds = 0;
        m->queues[i].paused = false;
        m->queues[i].paused_keys = 0;
    }
    for (size_t i = 0; i < count; i++) {
        struct queue_series *series = queue_series_get(m, samples[i].queue);

        if (series == NULL)
            continue;
        /* sums, so that the folded queues add up in METRICS_OTHER_QUEUE */
        series->ready_rows += samples[i].ready_rows;
        if (samples[i].oldest_ready_age_seconds > series->oldest_ready_age_seconds)
            series->oldest_ready_age_seconds = samples[i].oldest_ready_age_seconds;
        series->paused = series->paused || samples[i].paused;
        series->paused_keys += samples[i].paused_keys;
    }
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_table_sample(struct metrics *m, const struct metrics_table_sample *sample)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->table = *sample;
    pthread_mutex_unlock(&m->lock);
}

/* Adds one observation; caller holds the lock. NaN is ignored, negatives count as 0. */
static void
histogram_add(struct histogram *h, double seconds)
{
    size_t i;

    if (isnan(seconds))
        return;
    if (seconds < 0)
        seconds = 0;
    for (i = 0; i < BUCKET_COUNT && seconds > bucket_bounds[i]; i++)
        ;
    h->buckets[i]++;
    h->count++;
    h->sum += seconds;
}

void
metrics_observe(struct metrics *m, enum metrics_histogram histogram, double seconds)
{
    metrics_observe_many(m, histogram, &seconds, 1);
}

void
metrics_observe_many(struct metrics *m, enum metrics_histogram histogram, const double *seconds,
                     size_t count)
{
    if (m == NULL || (unsigned)histogram >= METRICS_HISTOGRAM_COUNT)
        return;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < count; i++)
        histogram_add(&m->histograms[histogram], seconds[i]);
    pthread_mutex_unlock(&m->lock);
}

int
metrics_set_endpoints(struct metrics *m, const char *const *names, size_t count)
{
    int rc = 0;

    if (m == NULL)
        return 0;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->endpoint_count; i++)
        free(m->endpoints[i]);
    m->endpoint_count = 0;
    for (size_t i = 0; i < count && i < METRICS_MAX_ENDPOINTS; i++) {
        m->endpoints[i] = strdup(names[i]);
        if (m->endpoints[i] == NULL) {
            rc = -1;
            break;
        }
        m->endpoint_connections[i] = 0;
        m->endpoint_count++;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void
metrics_add_endpoint_connections(struct metrics *m, size_t index, int delta)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    if (index < m->endpoint_count)
        m->endpoint_connections[index] += delta;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_up(struct metrics *m, enum metrics_target target, bool up)
{
    if (m == NULL || (unsigned)target >= METRICS_TARGET_COUNT)
        return;
    pthread_mutex_lock(&m->lock);
    m->up[target] = up;
    m->known[target] = true;
    if (up) {
        m->last_round_trip[target] = m->now(m->now_context);
        m->answered[target] = true;
    }
    pthread_mutex_unlock(&m->lock);
}

void
metrics_round_trip(struct metrics *m, enum metrics_target target)
{
    if (m == NULL || (unsigned)target >= METRICS_TARGET_COUNT)
        return;
    pthread_mutex_lock(&m->lock);
    m->last_round_trip[target] = m->now(m->now_context);
    m->answered[target] = true;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_idle_wait(struct metrics *m, double seconds)
{
    double window = METRICS_ROUND_TRIP_IDLE_FACTOR * seconds;

    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->round_trip_window = window > METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS
                               ? window
                               : METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS;
    pthread_mutex_unlock(&m->lock);
}

/* Whether target had a round trip within the window; caller holds the lock. */
static bool
end_up(const struct metrics *m, enum metrics_target target, double now)
{
    return m->answered[target] && now - m->last_round_trip[target] <= m->round_trip_window;
}

void
metrics_describe_ends(struct metrics *m, char *text, size_t size)
{
    size_t used = 0;

    if (size == 0)
        return;
    text[0] = '\0';
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    for (size_t t = 0; t < METRICS_TARGET_COUNT && used < size; t++) {
        int n = m->answered[t]
                    ? snprintf(text + used, size - used, "%s: last round trip %.1f s ago\n",
                               target_names[t], m->now(m->now_context) - m->last_round_trip[t])
                    : snprintf(text + used, size - used, "%s: no round trip yet\n",
                               target_names[t]);

        if (n < 0)
            break;
        used += (size_t)n;
    }
    pthread_mutex_unlock(&m->lock);
}

void
metrics_loop_turned(struct metrics *m)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->last_loop_turn = m->now(m->now_context);
    m->loop_turned = true;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_health(struct metrics *m, bool database_up, bool broker_up)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->up[METRICS_DATABASE] = m->answered[METRICS_DATABASE] = database_up;
    m->up[METRICS_BROKER] = m->answered[METRICS_BROKER] = broker_up;
    m->known[METRICS_DATABASE] = m->known[METRICS_BROKER] = true;
    m->last_loop_turn = m->now(m->now_context);
    m->last_round_trip[METRICS_DATABASE] = m->last_round_trip[METRICS_BROKER] = m->last_loop_turn;
    m->loop_turned = true;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_broker_held(struct metrics *m, const char *reason)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    snprintf(m->held, sizeof(m->held), "%s", reason != NULL ? reason : "");
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_horizon_age(struct metrics *m, double seconds)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    m->horizon_age_seconds = seconds;
    pthread_mutex_unlock(&m->lock);
}

void
metrics_set_stream_sample(struct metrics *m, const struct metrics_stream_partition *partitions,
                          size_t count, const struct metrics_stream_horizon *horizon)
{
    size_t max_queues;

    if (m == NULL)
        return;
    pthread_mutex_lock(&m->lock);
    max_queues = m->max_queues;
    pthread_mutex_unlock(&m->lock);
    metrics_stream_set(m->stream, partitions, count, horizon, max_queues);
}

bool
metrics_loop_alive(struct metrics *m)
{
    bool alive;

    if (m == NULL)
        return false;
    pthread_mutex_lock(&m->lock);
    alive = m->loop_turned &&
            m->now(m->now_context) - m->last_loop_turn <= METRICS_HEALTH_STALE_SECONDS;
    pthread_mutex_unlock(&m->lock);
    return alive;
}

bool
metrics_health(struct metrics *m, char *reason, size_t reason_size, bool *ready)
{
    char why[128] = "";
    bool healthy = false, database_up, broker_up;
    double now;

    if (m == NULL) {
        snprintf(why, sizeof(why), "no metrics");
        if (ready != NULL)
            *ready = false;
        goto done;
    }
    pthread_mutex_lock(&m->lock);
    now = m->now(m->now_context);
    database_up = end_up(m, METRICS_DATABASE, now);
    broker_up = end_up(m, METRICS_BROKER, now);
    if (ready != NULL)
        *ready = database_up && broker_up;
    if (!database_up || !broker_up) {
        /* an end not tried yet is not called down: the reason names only what is known */
        bool database_known = m->known[METRICS_DATABASE] || m->answered[METRICS_DATABASE];
        bool broker_known = m->known[METRICS_BROKER] || m->answered[METRICS_BROKER];
        const char *database = database_up     ? NULL
                               : database_known ? "database down"
                                                : "database not connected yet";
        const char *broker = broker_up     ? NULL
                             : broker_known ? "broker down"
                                            : "broker not connected yet";

        if (database != NULL && broker != NULL && database_known && broker_known)
            snprintf(why, sizeof(why), "database and broker down");
        else if (database != NULL && broker != NULL)
            snprintf(why, sizeof(why), "%s; %s", database, broker);
        else
            snprintf(why, sizeof(why), "%s", database != NULL ? database : broker);
    } else if (!m->loop_turned) {
        snprintf(why, sizeof(why), "relay loop not started");
    } else {
        double idle = now - m->last_loop_turn;

        if (idle > METRICS_HEALTH_STALE_SECONDS)
            snprintf(why, sizeof(why), "relay loop stalled for %.0f s", idle);
        else if (m->held[0] != '\0')
            snprintf(why, sizeof(why), "broker holds rows back: %.100s", m->held);
        else
            healthy = true;
    }
    pthread_mutex_unlock(&m->lock);
done:
    if (reason != NULL && reason_size > 0)
        snprintf(reason, reason_size, "%s", healthy ? "ok" : why);
    return healthy;
}

/* ---- rendering ---------------------------------------------------------- */

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
    for (size_t i = 0; i <= BUCKET_COUNT; i++) {
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
        buffer_puts(o, i < BUCKET_COUNT ? bucket_labels[i] : "+Inf");
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
        out_labels(o, m, "target", target_names[t]);
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
        out_labels(o, m, "target", target_names[t]);
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
        out_labels(o, m, "target", target_names[t]);
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

struct metrics_databases *
metrics_databases_of(struct metrics *m)
{
    return m != NULL ? m->databases : NULL;
}
