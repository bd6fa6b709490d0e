/*
 * scheduler_budget.c - the connection budget of a relay (--max-db-connections):
 * a connection counted in it for a slot or the statistics watch, or one
 * taken in place of an idle connection of another database when the budget
 * is spent; and the parts the relay's own database gives its slots (struct
 * slot_role). The budget's functions run under the scheduler's lock; a
 * connection to close is closed by the caller outside it.
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
    /* one connection of a list's budget of 4 or more is kept for the statistics watch (the
     * relay's own database has none: each of its slots has its connection) */
    int kept = s->kind == TENANT_LISTED && s->budget >= 4;

    LOCK_ASSERT_HELD(&s->lock);
    *to_close = NULL;
    if (s->open < s->budget && s->open - s->watch_open < s->budget - kept) {
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

/* ---- the own database's slots, each its part ---------------------------------- */

void
scheduler_divide_own_slots(struct scheduler *s)
{
    int others = s->slots - 1;

    s->own_streams = others >= 2 ? others / 2 : 0;
    s->own_rows = others >= 1 ? others - s->own_streams : 1;
}

struct slot_role
scheduler_slot_role(const struct scheduler *s, const struct pipeline *p)
{
    if (s->kind == TENANT_LISTED || s->slots == 1)
        return (struct slot_role){.rows = true, .streams = true, .upkeep = true};
    if (p->index == s->slots - 1) /* the last: its upkeep, and the last stream worker's */
        return (struct slot_role){.upkeep = true, .worker = (int)scheduler_own_stream_workers(s) - 1};
    if (s->own_streams == 0)
        return (struct slot_role){.rows = true, .streams = true};
    if (p->index < s->own_rows)
        return (struct slot_role){.rows = true, .worker = -1};
    return (struct slot_role){.streams = true, .worker = p->index - s->own_rows};
}

size_t
scheduler_own_stream_workers(const struct scheduler *s)
{
    if (s->slots == 1)
        return 1;
    return (size_t)(s->own_streams > 0 ? s->own_streams : 1) + 1;
}
