/*
 * metrics_stream.c - the stream gauges (see metrics_stream.h).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_stream.h"

struct stream_series {
    char *queue;
    int partition;
    char *owner;
    int64_t lag_rows;
    double lag_seconds;
};

/* guard: lock, every field and every series */
struct metrics_stream {
    pthread_mutex_t lock;
    bool sampled; /* a sample came: the families are rendered */
    struct stream_series *series;
    size_t count;
    size_t folded; /* partitions of queues past the cap */
    struct metrics_stream_horizon horizon;
};

struct metrics_stream *
metrics_stream_new(void)
{
    struct metrics_stream *s = calloc(1, sizeof(*s));

    if (s != NULL)
        pthread_mutex_init(&s->lock, NULL);
    return s;
}

static void
series_free(struct stream_series *series, size_t count)
{
    for (size_t i = 0; series != NULL && i < count; i++) {
        free(series[i].queue);
        free(series[i].owner);
    }
    free(series);
}

void
metrics_stream_free(struct metrics_stream *s)
{
    if (s == NULL)
        return;
    series_free(s->series, s->count);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Copies the partitions of the first max_queues queues; -1 when out of memory. */
static int
series_copy(const struct metrics_stream_partition *partitions, size_t count, size_t max_queues,
            struct stream_series **out, size_t *kept, size_t *folded)
{
    struct stream_series *series = calloc(count > 0 ? count : 1, sizeof(*series));
    size_t queues = 0;

    *kept = 0;
    *folded = 0;
    if (series == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        const struct metrics_stream_partition *p = &partitions[i];
        struct stream_series *s = &series[*kept];

        if (i == 0 || strcmp(p->queue, partitions[i - 1].queue) != 0)
            queues++;
        if (max_queues > 0 && queues > max_queues) {
            (*folded)++;
            continue;
        }
        s->queue = strdup(p->queue);
        s->owner = strdup(p->owner != NULL ? p->owner : "");
        if (s->queue == NULL || s->owner == NULL) {
            series_free(series, *kept + 1);
            return -1;
        }
        s->partition = p->partition;
        s->lag_rows = p->lag_rows;
        s->lag_seconds = p->lag_seconds;
        (*kept)++;
    }
    *out = series;
    return 0;
}

void
metrics_stream_set(struct metrics_stream *s, const struct metrics_stream_partition *partitions,
                   size_t count, const struct metrics_stream_horizon *horizon, size_t max_queues)
{
    struct stream_series *series = NULL;
    size_t kept = 0, folded = 0;

    if (s == NULL || series_copy(partitions, count, max_queues, &series, &kept, &folded) != 0)
        return;
    pthread_mutex_lock(&s->lock);
    series_free(s->series, s->count);
    s->series = series;
    s->count = kept;
    s->folded = folded;
    s->horizon = horizon != NULL ? *horizon : (struct metrics_stream_horizon){0};
    s->sampled = true;
    pthread_mutex_unlock(&s->lock);
}

/* ---- rendering ---------------------------------------------------------- */

/* A label value escaped per the text format: \\, \" and \n. */
static void
out_value(struct buffer *o, const char *v)
{
    for (; *v != '\0'; v++) {
        if (*v == '\\' || *v == '"')
            buffer_putc(o, '\\');
        if (*v == '\n')
            buffer_puts(o, "\\n");
        else
            buffer_putc(o, *v);
    }
}

static void
out_stream_family(struct buffer *o, const char *name, const char *help)
{
    buffer_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

/* Whether a series carries its partition's owner label. */
enum series_owner { SERIES_WITH_OWNER, SERIES_NO_OWNER };

/* name{broker="...",queue="...",partition="..."[,owner="..."]} */
static void
out_stream_series(struct buffer *o, const char *name, const char *broker,
                  const struct stream_series *s, enum series_owner owner)
{
    buffer_printf(o, "%s{", name);
    if (broker != NULL) {
        buffer_puts(o, "broker=\"");
        out_value(o, broker);
        buffer_puts(o, "\",");
    }
    buffer_puts(o, "queue=\"");
    out_value(o, s->queue);
    buffer_printf(o, "\",partition=\"%d\"", s->partition);
    if (owner == SERIES_WITH_OWNER) {
        buffer_puts(o, ",owner=\"");
        out_value(o, s->owner);
        buffer_puts(o, "\"");
    }
    buffer_puts(o, "} ");
}

/* name{broker="..."} or name */
static void
out_plain(struct buffer *o, const char *name, const char *broker)
{
    buffer_puts(o, name);
    if (broker != NULL) {
        buffer_puts(o, "{broker=\"");
        out_value(o, broker);
        buffer_puts(o, "\"}");
    }
    buffer_puts(o, " ");
}

static void
render_partitions(const struct metrics_stream *s, struct buffer *o, const char *broker)
{
    out_stream_family(o, "outbox_stream_lag_rows",
                      "Rows after the cursor of a stream partition (counted up to 100000).");
    for (size_t i = 0; i < s->count; i++) {
        out_stream_series(o, "outbox_stream_lag_rows", broker, &s->series[i], SERIES_NO_OWNER);
        buffer_printf(o, "%lld\n", (long long)s->series[i].lag_rows);
    }
    out_stream_family(o, "outbox_stream_lag_seconds",
                      "Age of the oldest row after the cursor of a stream partition (0: none).");
    for (size_t i = 0; i < s->count; i++) {
        out_stream_series(o, "outbox_stream_lag_seconds", broker, &s->series[i], SERIES_NO_OWNER);
        buffer_printf(o, "%.3f\n", s->series[i].lag_seconds);
    }
    out_stream_family(
        o, "outbox_stream_partition_owned",
        "1 for the relay holding a live lease on a stream partition (owner=\"\": none).");
    for (size_t i = 0; i < s->count; i++) {
        out_stream_series(o, "outbox_stream_partition_owned", broker, &s->series[i],
                          SERIES_WITH_OWNER);
        buffer_puts(o, s->series[i].owner[0] != '\0' ? "1\n" : "0\n");
    }
}

void
metrics_stream_render(struct metrics_stream *s, struct buffer *o, const char *broker)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    if (!s->sampled) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    render_partitions(s, o, broker);
    out_stream_family(o, "outbox_stream_partitions_folded",
                      "Stream partitions of queues past --metrics-max-queues, not exported.");
    out_plain(o, "outbox_stream_partitions_folded", broker);
    buffer_printf(o, "%zu\n", s->folded);
    out_stream_family(o, "outbox_stream_horizon_age_seconds",
                      "Age of the oldest transaction with an xid, which every stream read waits for"
                      " (0: none).");
    out_plain(o, "outbox_stream_horizon_age_seconds", broker);
    buffer_printf(o, "%.3f\n", s->horizon.found ? s->horizon.age_seconds : 0.0);
    out_stream_family(
        o, "outbox_stream_horizon_pid",
        "Backend pid of the transaction holding the stream horizon (0: none, or a prepared"
        " transaction).");
    out_plain(o, "outbox_stream_horizon_pid", broker);
    buffer_printf(o, "%d\n", s->horizon.found ? s->horizon.pid : 0);
    out_stream_family(
        o, "outbox_stream_horizon_prepared",
        "1 when a prepared transaction holds the stream horizon (pid 0; the relay's log"
        " names its gid), else 0.");
    out_plain(o, "outbox_stream_horizon_prepared", broker);
    buffer_printf(o, "%d\n", s->horizon.found && s->horizon.prepared ? 1 : 0);
    pthread_mutex_unlock(&s->lock);
}
