/*
 * metrics_database.c - see metrics_database.h.
 */
#include "metrics_database.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "database_list.h"
#include "lock_check.h"
#include "timeouts.h"

#define OTHER "(other)"

struct database_series {
    char name[DATABASE_NAME_MAX];
    bool known;  /* tried at least once */
    bool up;
    bool served;
    char cause[200];
    uint64_t claimed;
    uint64_t completed;
    /* the last sample, monotonic seconds; sampled false: none since served */
    bool sampled;
    long long ready;
    bool claimable;
    double oldest_ready_age;
    double sampled_at;
    double claimable_since; /* the first of the samples in a row that found claimable rows */
    double claimed_at;      /* a slice last claimed rows */
};

/* guard: lock, every field and every series */
struct metrics_databases {
    pthread_mutex_t lock;
    bool listed; /* a list came: the families are rendered */
    struct database_series *series;
    size_t count;
    size_t max;
    uint64_t other_claimed, other_completed; /* databases past the cap, and removed ones */
    int open, budget;
};

struct metrics_databases *
metrics_databases_new(void)
{
    struct metrics_databases *d = calloc(1, sizeof(*d));

    if (d != NULL)
        pthread_mutex_init(&d->lock, NULL);
    return d;
}

void
metrics_databases_free(struct metrics_databases *d)
{
    if (d == NULL)
        return;
    pthread_mutex_destroy(&d->lock);
    free(d->series);
    free(d);
}

void
metrics_databases_set_max(struct metrics_databases *d, size_t max)
{
    if (d == NULL)
        return;
    pthread_mutex_lock(&d->lock);
    d->max = max;
    pthread_mutex_unlock(&d->lock);
}

/* The series of name; NULL when unknown. Under the lock. */
static struct database_series *
find(struct metrics_databases *d, const char *name)
{
    LOCK_ASSERT_HELD(&d->lock);
    for (size_t i = 0; i < d->count; i++)
        if (strcmp(d->series[i].name, name) == 0)
            return &d->series[i];
    return NULL;
}

void
metrics_databases_set_list(struct metrics_databases *d, const char *const *names, size_t count)
{
    struct database_series *next;

    if (d == NULL)
        return;
    next = calloc(count > 0 ? count : 1, sizeof(*next));
    if (next == NULL)
        return; /* the old list stays */
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; i < count; i++) {
        const struct database_series *old = find(d, names[i]);

        if (old != NULL)
            next[i] = *old;
        else
            snprintf(next[i].name, sizeof(next[i].name), "%s", names[i]);
    }
    free(d->series);
    d->series = next;
    d->count = count;
    d->listed = true;
    pthread_mutex_unlock(&d->lock);
}

void
metrics_databases_set_state(struct metrics_databases *d, const char *name, bool up,
                            const char *cause)
{
    struct database_series *s;

    if (d == NULL)
        return;
    pthread_mutex_lock(&d->lock);
    if ((s = find(d, name)) != NULL) {
        s->known = true;
        s->up = up;
        snprintf(s->cause, sizeof(s->cause), "%s", up || cause == NULL ? "" : cause);
    }
    pthread_mutex_unlock(&d->lock);
}

void
metrics_databases_set_served(struct metrics_databases *d, const char *name, bool served)
{
    struct database_series *s;

    if (d == NULL)
        return;
    pthread_mutex_lock(&d->lock);
    if ((s = find(d, name)) != NULL) {
        s->served = served;
        s->sampled &= served;
    }
    pthread_mutex_unlock(&d->lock);
}

void
metrics_databases_set_sample(struct metrics_databases *d, const char *name,
                             const struct store_database_sample *sample)
{
    double now = clock_monotonic_seconds();
    struct database_series *s;

    if (d == NULL)
        return;
    pthread_mutex_lock(&d->lock);
    if ((s = find(d, name)) != NULL && (s->sampled || sample->counted)) {
        if (sample->claimable && (!s->sampled || !s->claimable))
            s->claimable_since = now;
        s->sampled = true;
        s->claimable = sample->claimable;
        if (sample->counted) {
            s->ready = sample->ready;
            s->oldest_ready_age = sample->oldest_ready_age;
            s->sampled_at = now;
        }
    }
    pthread_mutex_unlock(&d->lock);
}

void
metrics_databases_add(struct metrics_databases *d, const char *name, uint64_t claimed,
                      uint64_t completed)
{
    struct database_series *s;

    if (d == NULL)
        return;
    pthread_mutex_lock(&d->lock);
    s = find(d, name);
    if (s != NULL && claimed > 0)
        s->claimed_at = clock_monotonic_seconds();
    if (s != NULL && (d->max == 0 || (size_t)(s - d->series) < d->max)) {
        s->claimed += claimed;
        s->completed += completed;
    } else {
        d->other_claimed += claimed;
        d->other_completed += completed;
    }
    pthread_mutex_unlock(&d->lock);
}

void
metrics_databases_set_connections(struct metrics_databases *d, int open, int budget)
{
    if (d == NULL)
        return;
    pthread_mutex_lock(&d->lock);
    d->open = open;
    d->budget = budget;
    pthread_mutex_unlock(&d->lock);
}

size_t
metrics_databases_describe_faults(struct metrics_databases *d, char *text, size_t size)
{
    size_t used = 0, down = 0;

    if (size > 0)
        text[0] = '\0';
    if (d == NULL)
        return 0;
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; i < d->count; i++) {
        const struct database_series *s = &d->series[i];

        if (!s->known || s->up)
            continue;
        down++;
        if (used < size)
            used += (size_t)snprintf(text + used, size - used, "database %s down: %s\n", s->name,
                                     s->cause);
    }
    pthread_mutex_unlock(&d->lock);
    return down;
}

/* ---- rendering ---------------------------------------------------------- */

static void
out_database_family(struct buffer *o, const char *name, const char *help, const char *type)
{
    buffer_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{broker="b",database="n"} (the names are of [A-Za-z0-9_.-()]: nothing to escape) */
static void
out_database_series(struct buffer *o, const char *name, const char *broker, const char *database)
{
    buffer_puts(o, name);
    if (broker == NULL && database == NULL)
        return;
    buffer_puts(o, "{");
    if (broker != NULL)
        buffer_printf(o, "broker=\"%s\"%s", broker, database != NULL ? "," : "");
    if (database != NULL)
        buffer_printf(o, "database=\"%s\"", database);
    buffer_puts(o, "}");
}

/* A counter per database (the capped ones), then (other). */
static void
render_counter(const struct metrics_databases *d, struct buffer *o, const char *broker,
               const char *name, const char *help, bool completed)
{
    size_t shown = d->max == 0 || d->count < d->max ? d->count : d->max;

    out_database_family(o, name, help, "counter");
    for (size_t i = 0; i < shown; i++) {
        out_database_series(o, name, broker, d->series[i].name);
        buffer_printf(o, " %llu\n", (unsigned long long)(completed ? d->series[i].completed
                                                                   : d->series[i].claimed));
    }
    out_database_series(o, name, broker, OTHER);
    buffer_printf(o, " %llu\n",
                  (unsigned long long)(completed ? d->other_completed : d->other_claimed));
}

/*
 * The oldest ready row's age now: the sample's, grown since it while no row
 * was claimed (the row is still there).
 */
static double
oldest_age_now(const struct database_series *s, double now)
{
    if (s->ready > 0 && s->claimed_at <= s->sampled_at)
        return s->oldest_ready_age + (now - s->sampled_at);
    return s->oldest_ready_age;
}

/* Claimable rows at the last sample, and no claim since they were first seen for long. */
static bool
stranded(const struct database_series *s, double now)
{
    double since = s->claimed_at > s->claimable_since ? s->claimed_at : s->claimable_since;

    return s->served && s->sampled && s->claimable && now - since >= SCHEDULER_STRANDED_SECONDS;
}

/* The backlog gauges of every listed database (no cap: the list bounds them). Under the lock. */
static void
render_backlog(struct metrics_databases *d, struct buffer *o, const char *broker)
{
    double now = clock_monotonic_seconds();

    LOCK_ASSERT_HELD(&d->lock);
    out_database_family(o, "outbox_database_ready_rows",
                        "ready rows of a database this relay serves, at its last sample", "gauge");
    for (size_t i = 0; i < d->count; i++)
        if (d->series[i].sampled) {
            out_database_series(o, "outbox_database_ready_rows", broker, d->series[i].name);
            buffer_printf(o, " %lld\n", d->series[i].ready);
        }
    out_database_family(o, "outbox_database_oldest_ready_age_seconds",
                        "age of the oldest ready row of a database this relay serves", "gauge");
    for (size_t i = 0; i < d->count; i++)
        if (d->series[i].sampled) {
            out_database_series(o, "outbox_database_oldest_ready_age_seconds", broker,
                                d->series[i].name);
            buffer_printf(o, " %.3f\n", oldest_age_now(&d->series[i], now));
        }
    out_database_family(o, "outbox_database_stranded",
                        "1 while a database this relay serves has claimable rows that saw no"
                        " claim for 30 s",
                        "gauge");
    for (size_t i = 0; i < d->count; i++) {
        out_database_series(o, "outbox_database_stranded", broker, d->series[i].name);
        buffer_printf(o, " %d\n", stranded(&d->series[i], now) ? 1 : 0);
    }
}

void
metrics_databases_render(struct metrics_databases *d, struct buffer *o, const char *broker)
{
    size_t down = 0;

    if (d == NULL)
        return;
    pthread_mutex_lock(&d->lock);
    if (!d->listed) {
        pthread_mutex_unlock(&d->lock);
        return;
    }
    /* the gauges of every listed database (the list bounds them); the counters capped */
    out_database_family(
        o, "outbox_database_up",
        "1 when the listed database's last connect or slice worked, 0 when it failed", "gauge");
    for (size_t i = 0; i < d->count; i++) {
        if (!d->series[i].known)
            continue;
        out_database_series(o, "outbox_database_up", broker, d->series[i].name);
        buffer_printf(o, " %d\n", d->series[i].up ? 1 : 0);
    }
    out_database_family(o, "outbox_database_served",
                        "1 while this relay holds the database's lease", "gauge");
    for (size_t i = 0; i < d->count; i++) {
        out_database_series(o, "outbox_database_served", broker, d->series[i].name);
        buffer_printf(o, " %d\n", d->series[i].served ? 1 : 0);
    }
    render_backlog(d, o, broker);
    render_counter(d, o, broker, "outbox_database_rows_claimed_total",
                   "rows claimed from the database", false);
    render_counter(d, o, broker, "outbox_database_rows_completed_total",
                   "rows of the database marked succeeded after the broker confirmed them", true);
    for (size_t i = 0; i < d->count; i++)
        down += d->series[i].known && !d->series[i].up;
    out_database_family(o, "outbox_databases", "databases of the list", "gauge");
    out_database_series(o, "outbox_databases", broker, NULL);
    buffer_printf(o, " %zu\n", d->count);
    out_database_family(o, "outbox_databases_down", "databases of the list whose last try failed",
                        "gauge");
    out_database_series(o, "outbox_databases_down", broker, NULL);
    buffer_printf(o, " %zu\n", down);
    out_database_family(o, "outbox_database_connections",
                        "connections open to the listed databases (listeners included)", "gauge");
    out_database_series(o, "outbox_database_connections", broker, NULL);
    buffer_printf(o, " %d\n", d->open);
    out_database_family(o, "outbox_database_connection_budget", "--max-db-connections", "gauge");
    out_database_series(o, "outbox_database_connection_budget", broker, NULL);
    buffer_printf(o, " %d\n", d->budget);
    pthread_mutex_unlock(&d->lock);
}
