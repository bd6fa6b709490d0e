/*
 * metrics.c - the metrics' state and its fixed families: what the relay
 * counts, observes and samples, under one lock. The health state is in
 * metrics_health.c, the text rendering in metrics_render.c.
 */
#include "metrics.h"
#include "metrics_state.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buffer.h"
#include "clock.h"
#include "lock_check.h"

const char *const metrics_target_names[METRICS_TARGET_COUNT] = {"database", "broker"};

static const double bucket_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25,  0.5,    1,     2.5,  5,     10};
_Static_assert(sizeof(bucket_bounds) / sizeof(bucket_bounds[0]) == METRICS_BUCKET_COUNT,
               "one bound per bucket");

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

    LOCK_ASSERT_HELD(&m->lock);
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

    LOCK_ASSERT_HELD(&m->lock);
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
    for (i = 0; i < METRICS_BUCKET_COUNT && seconds > bucket_bounds[i]; i++)
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

struct metrics_databases *
metrics_databases_of(struct metrics *m)
{
    return m != NULL ? m->databases : NULL;
}
