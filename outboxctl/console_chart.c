/*
 * console_chart.c - the chart of the last hour, its finished minutes kept
 * between requests (see console_chart.h). The kept minutes are shared by
 * the workers under one lock, held only to copy them in or out.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "console_chart.h"
#include "console_request.h"

/* One database's kept minutes: those before final_until, counted at counted_ms. */
struct kept_chart {
    char database[DATABASE_NAME_MAX]; /* "" for a free entry */
    int64_t counted_ms;               /* when the whole hour was last counted (monotonic) */
    int64_t final_until;              /* epoch: the minutes before it are kept */
    struct store_console_chart chart;
};

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept_chart kept[CONSOLE_CHART_DATABASES];

/* The entry of database, or the stalest (then emptied) when it has none; under kept_lock. */
static struct kept_chart *
entry_of(const char *database)
{
    struct kept_chart *stalest = &kept[0];

    for (size_t i = 0; i < CONSOLE_CHART_DATABASES; i++) {
        if (strcmp(kept[i].database, database) == 0 && kept[i].database[0] != '\0')
            return &kept[i];
        if (kept[i].counted_ms < stalest->counted_ms)
            stalest = &kept[i];
    }
    memset(stalest, 0, sizeof(*stalest));
    snprintf(stalest->database, sizeof(stalest->database), "%s", database);
    return stalest;
}

/* Copies the kept minutes (those before final_until) of from into the same minutes of to. */
static void
take_kept(struct store_console_chart *to, const struct store_console_chart *from,
          int64_t final_until)
{
    for (int i = 0; i < STORE_CONSOLE_CHART_MINUTES; i++) {
        int64_t index = (to->minute_epoch[i] - from->minute_epoch[0]) / 60;

        if (to->minute_epoch[i] >= final_until || index < 0 ||
            index >= STORE_CONSOLE_CHART_MINUTES)
            continue;
        to->enqueued[i] = from->enqueued[index];
        to->published[i] = from->published[index];
    }
}

int
console_chart(PGconn *conn, const char *database, struct store_console_chart *chart,
              struct outbox_error *err)
{
    int64_t now_ms = clock_monotonic_ms(), from = 0, counted_ms = now_ms;
    struct kept_chart copy = {0};
    /* the current minute and those that ended less than FINAL_SECONDS ago: counted each time */
    const int open_minutes = 1 + (CONSOLE_CHART_FINAL_SECONDS + 59) / 60;

    pthread_mutex_lock(&kept_lock);
    copy = *entry_of(database);
    pthread_mutex_unlock(&kept_lock);
    if (copy.final_until > 0 && now_ms - copy.counted_ms < CONSOLE_CHART_RECOUNT_SECONDS * 1000) {
        from = copy.final_until;
        counted_ms = copy.counted_ms;
    }
    if (store_console_chart(conn, from, chart, err) < 0)
        return -1;
    if (from > 0)
        take_kept(chart, &copy.chart, from);
    pthread_mutex_lock(&kept_lock);
    {
        struct kept_chart *entry = entry_of(database);

        entry->chart = *chart;
        entry->counted_ms = counted_ms;
        entry->final_until = chart->minute_epoch[STORE_CONSOLE_CHART_MINUTES - open_minutes];
    }
    pthread_mutex_unlock(&kept_lock);
    return 0;
}
