/*
 * scheduler_wake.c - the scheduler's side of the statistics watch
 * (scheduler_watch.h): the watch's connections within the budget, the list
 * handed to it, and the databases it woke made due. See scheduler.h.
 */
#include "scheduler_state.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "lock_check.h"
#include "relay_state.h"
#include "timeouts.h"

/*
 * A connection for the watch (scheduler_count_watch_connection): an idle
 * one it takes the place of is closed here, before the watch connects.
 */
static bool
watch_take(void *arg)
{
    struct scheduler *s = arg;
    outbox_store *to_close;
    bool taken;

    pthread_mutex_lock(&s->lock);
    taken = scheduler_count_watch_connection(s, &to_close);
    pthread_mutex_unlock(&s->lock);
    outbox_store_free(to_close);
    return taken;
}

void
scheduler_watch_give(void *arg)
{
    struct scheduler *s = arg;

    pthread_mutex_lock(&s->lock);
    s->open--;
    s->watch_open--;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
}

/* Hands the list to the watch when it changed. */
static void
watch_follow_list(struct scheduler *s)
{
    const char **names, **urls;
    size_t count = 0;
    bool stale;

    pthread_mutex_lock(&s->lock);
    stale = s->watch_stale;
    s->watch_stale = false;
    names = stale ? calloc(s->count + 1, sizeof(*names)) : NULL;
    urls = stale ? calloc(s->count + 1, sizeof(*urls)) : NULL;
    for (size_t i = 0; names != NULL && urls != NULL && i < s->count; i++) {
        if (s->tenants[i]->removed)
            continue;
        names[count] = strdup(s->tenants[i]->name);
        urls[count] = strdup(s->tenants[i]->url);
        count += names[count] != NULL && urls[count] != NULL;
    }
    pthread_mutex_unlock(&s->lock);
    if (stale && (names == NULL || urls == NULL ||
                  scheduler_watch_set(s->watch, count, names, urls, scheduler_watch_give, s) != 0))
        scheduler_watch_set(s->watch, 0, NULL, NULL, scheduler_watch_give,
                            s); /* out of memory: polled instead */
    for (size_t i = 0; i <= count && names != NULL && urls != NULL; i++) {
        free((char *)names[i]);
        free((char *)urls[i]);
    }
    free(names);
    free(urls);
}

/*
 * The rest a woken database t keeps after its last slice: its idle wait (a
 * database whose other tables take inserts all day is looked at as often as
 * it was polled), but no more than the watch's period while it keeps an idle
 * connection, where a look is one claim and no connect. A tenant's pooled
 * session that wrote a business row 0.3 s before it enqueued had its row
 * wait out the rest that the business row's wake began (up to 1 s).
 */
static double
woken_rest(const struct tenant *t)
{
    if (t->idle_count > 0 && t->idle_wait > SCHEDULER_WATCH_SECONDS)
        return SCHEDULER_WATCH_SECONDS;
    return t->idle_wait;
}

/*
 * Makes the woken databases this relay serves due, no sooner than their
 * rest after their last slice (woken_rest()). A database the
 * watch stopped covering (its server's connection lost, PostgreSQL
 * restarted) is due at once: polled until the watch is back, since its
 * rows' changes meanwhile wake nothing. Under the lock.
 */
static void
wake(struct scheduler *s, const struct watch_wake *woken, size_t count, double now)
{
    bool due = count > 0;

    LOCK_ASSERT_HELD(&s->lock);
    for (size_t i = 0; i < s->count; i++) {
        struct tenant *t = s->tenants[i];
        bool watched = !t->removed && scheduler_watch_covers(s->watch, t->name);

        if (t->watched && !watched && t->due > now) {
            t->due = now;
            due = true;
        }
        t->watched = watched;
        t->watch_pid = watched ? watch_pid_of(s->watch, t->name) : 0;
        for (size_t k = 0; k < count; k++) {
            double at = t->visited_at + woken_rest(t);

            if (t->removed || t->down || strcmp(t->name, woken[k].name) != 0)
                continue;
            /* rows of a database another relay holds are its to publish (a winner
             * waiting for it, or for a resume, looks again); but the change may be
             * that relay letting it go, its list having lost it: looked at, seldom */
            if (!t->held && !t->wins && !woken[k].members) {
                at = t->visited_at + SCHEDULER_NOT_HELD_WAKE_SECONDS;
                t->due = at < t->due ? at : t->due;
                continue;
            }
            t->woken = true;
            t->lease_stale |= woken[k].members;
            at = at > now ? at : now;
            t->due = at < t->due ? at : t->due;
        }
    }
    if (due)
        pthread_cond_broadcast(&s->changed);
}

/* Whether a slot serves a database or one has a backlog. Under the lock. */
static bool
any_busy(const struct scheduler *s)
{
    LOCK_ASSERT_HELD(&s->lock);
    for (size_t i = 0; i < s->count; i++)
        if (s->tenants[i]->serving > 0 || s->tenants[i]->backlog)
            return true;
    return false;
}

/*
 * The watch's rest after the look that started at looked_at, under the lock:
 * until SCHEDULER_WATCH_SECONDS after it, SCHEDULER_WATCH_BUSY_SECONDS while
 * a database is served. A slot that starts serving one ends a longer rest: the
 * first rows of a drain come with the first quiet rows written beside them,
 * and those waited out the idle interval (up to 0.1 s) for the next look.
 */
static void
watch_rest(struct scheduler *s, double looked_at)
{
    LOCK_ASSERT_HELD(&s->lock);
    while (!atomic_load(&s->watch_quit) && !relay_stopping(s->relay)) {
        double until = looked_at + (any_busy(s) ? SCHEDULER_WATCH_BUSY_SECONDS
                                                : SCHEDULER_WATCH_SECONDS);

        if (clock_monotonic_seconds() >= until)
            return;
        scheduler_wait(s, &s->served, until);
    }
}

/* The watch thread: a look, then its rest (watch_rest). */
void *
scheduler_watch_run(void *arg)
{
    struct scheduler *s = arg;

    while (!atomic_load(&s->watch_quit) && !relay_stopping(s->relay)) {
        double now = clock_monotonic_seconds();
        const struct watch_wake *woken;
        size_t count;

        scheduler_probe_new(s);
        watch_follow_list(s);
        count = scheduler_watch_look(s->watch, now, watch_take, scheduler_watch_give, s, &woken);
        pthread_mutex_lock(&s->lock);
        wake(s, woken, count, now);
        if (!s->watch_looked) {
            s->watch_looked = true;
            pthread_cond_broadcast(&s->changed);
        }
        watch_rest(s, now);
        pthread_mutex_unlock(&s->lock);
    }
    return NULL;
}
