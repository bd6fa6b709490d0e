/*
 * scheduler_budget.c - the connection budget of a relay of many databases
 * (--max-db-connections): a connection counted in it for a slot or the
 * statistics watch, or one taken in place of an idle connection of another
 * database when the budget is spent. Everything here runs under the
 * scheduler's lock; a connection to close is closed by the caller outside it.
 */
#include "scheduler_state.h"

#include <pthread.h>

#include "lock_check.h"

/*
 * Whether u's idle connection is a better one to close than v's: one of a
 * database without a backlog first, then the one due furthest ahead (the
 * connection needed last, which keeps the others open for polls that come
 * round in a cycle), then the least recently used.
 */
static bool
better_victim(const struct tenant *u, size_t i, const struct tenant *v, size_t j)
{
    if (u->backlog != v->backlog)
        return !u->backlog;
    if (u->due != v->due)
        return u->due > v->due;
    return u->idle[i].used_at < v->idle[j].used_at;
}

/*
 * The idle connection to close for another (see better_victim), taken out
 * of its database's; NULL when there is none. Under the lock.
 */
static outbox_store *
take_victim(struct scheduler *s)
{
    struct tenant *victim = NULL;
    size_t oldest = 0;
    outbox_store *store;

    LOCK_ASSERT_HELD(&s->lock);
    for (size_t i = 0; i < s->count; i++) {
        struct tenant *u = s->tenants[i];

        for (size_t j = 0; j < u->idle_count; j++)
            if (victim == NULL || better_victim(u, j, victim, oldest)) {
                victim = u;
                oldest = j;
            }
    }
    if (victim == NULL)
        return NULL;
    store = victim->idle[oldest].db.store;
    victim->idle[oldest] = victim->idle[--victim->idle_count];
    return store;
}

bool
scheduler_count_new_connection(struct scheduler *s, outbox_store **to_close)
{
    LOCK_ASSERT_HELD(&s->lock);
    *to_close = NULL;
    /* one connection of a budget of 4 or more is kept for the statistics watch */
    if (s->open < s->budget && s->open - s->watch_open < s->budget - (s->budget >= 4)) {
        s->open++;
        return true;
    }
    *to_close = take_victim(s);
    return *to_close != NULL; /* the count stays: one closes as the other opens */
}

bool
scheduler_count_watch_connection(struct scheduler *s, outbox_store **to_close)
{
    LOCK_ASSERT_HELD(&s->lock);
    *to_close = NULL;
    if ((s->watch_open + 1) * 4 > s->budget)
        return false; /* a watch connection per four of the budget at most */
    if (s->open < s->budget)
        s->open++;
    else if ((*to_close = take_victim(s)) == NULL)
        return false; /* every connection is serving */
    s->watch_open++;
    return true;
}
