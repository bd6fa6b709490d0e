/*
 * scheduler_list.c - the databases of a relay's list: added and removed as
 * the file changes while the relay runs. See scheduler.h.
 */
#include "scheduler_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "lock_check.h"
#include "log.h"
#include "metrics.h"
#include "scheduler.h"
#include "scheduler_stream.h"
#include "store_database_lease.h"
#include "timeouts.h"

/* ---- the list ----------------------------------------------------------- */

static struct tenant *
tenant_new(struct scheduler *s, const struct database_entry *entry)
{
    struct tenant *t = calloc(1, sizeof(*t));

    if (t == NULL || (t->url = strdup(entry->url)) == NULL ||
        (t->idle = calloc((size_t)s->budget, sizeof(*t->idle))) == NULL) {
        if (t != NULL)
            free(t->url);
        free(t);
        return NULL;
    }
    snprintf(t->name, sizeof(t->name), "%s", entry->name);
    snprintf(t->who, sizeof(t->who), "database=%s", entry->name);
    t->idle_wait = s->relay->config->poll_interval_ms / 1000.0;
    t->takeover_wait = SCHEDULER_TAKEOVER_FIRST_SECONDS;
    t->retry = backoff_make(SCHEDULER_RETRY_FIRST_SECONDS, SCHEDULER_RETRY_MAX_SECONDS,
                            s->seed ^ (unsigned int)(s->count * 2654435761u));
    return t;
}

/* Whether closing a database's connections leaves its rendezvous too. */
enum tenant_leaving { TENANT_STAYS, TENANT_LEAVES };

/*
 * scheduler_tenant_close_idle() without counting the connections out of
 * s->open: how many it closed. TENANT_LEAVES: the list no longer names t,
 * and the relay leaves its rendezvous as well as its lease (sql/018's
 * release): a member that no longer lists a database would still win it,
 * and the relay holding it would give it up to a winner that never takes
 * it. With no idle connection, leaving takes a connection of its own, one
 * the caller counted in s->open.
 */
static size_t
tenant_close_idle_io(struct scheduler *s, struct tenant *t, enum tenant_leaving leaving)
{
    size_t closed = t->idle_count;
    struct idle_connection own = {0};
    struct idle_connection *c = t->idle_count > 0 ? &t->idle[0] : NULL;
    struct outbox_error err = {0};

    if (c == NULL && leaving == TENANT_LEAVES) {
        closed++; /* the caller's count of it, whether it opens or not */
        own.db.store = outbox_store_connect(t->url, s->relay->worker_prefix, &err);
        c = own.db.store != NULL ? &own : NULL;
    }
    if (c != NULL && t->serving == 0)
        scheduler_stream_give_back(s, t, c);
    if (c != NULL && (t->held || leaving == TENANT_LEAVES)) {
        if (store_database_lease_release(outbox_store_conn(c->db.store), s->relay->worker_prefix,
                                         &err) != 0)
            log_event(OUTBOX_LOG_WARN, "database lease not given up, it ends on its own",
                      "database=%s error=\"%s\"", t->name, err.message);
        t->held = false;
    }
    outbox_store_free(own.db.store);
    for (size_t i = 0; i < t->idle_count; i++)
        outbox_store_free(t->idle[i].db.store);
    t->idle_count = 0;
    return closed;
}

/* Under the lock, or with no slot running. */
void
scheduler_tenant_close_idle(struct scheduler *s, struct tenant *t)
{
    s->open -= (int)tenant_close_idle_io(s, t, TENANT_STAYS);
}

/* Frees what t holds in memory; its connections are closed already. */
static void
tenant_discard(struct tenant *t)
{
    scheduler_stream_free(t);
    free(t->idle);
    free(t->url);
    free(t);
}

/* Frees a tenant no slot serves; its lease is given up, its idle connections closed. */
void
scheduler_tenant_free(struct scheduler *s, struct tenant *t)
{
    scheduler_tenant_close_idle(s, t);
    tenant_discard(t);
}

void
scheduler_release_leases(struct scheduler *s)
{
    struct outbox_error err;

    for (size_t i = 0; i < s->count; i++)
        scheduler_tenant_close_idle(s, s->tenants[i]); /* gives up the leases of those it can */
    for (size_t i = 0; i < s->count; i++) {
        struct tenant *t = s->tenants[i];
        struct idle_connection c = {0};

        if (!t->held && !scheduler_stream_holds(t))
            continue;
        c.db.store = outbox_store_connect(t->url, s->relay->worker_prefix, &err);
        if (c.db.store != NULL)
            scheduler_stream_give_back(s, t, &c);
        if (t->held && (c.db.store == NULL ||
                        store_database_lease_release(outbox_store_conn(c.db.store),
                                                     s->relay->worker_prefix, &err) != 0))
            log_event(OUTBOX_LOG_WARN, "database lease not given up, it ends on its own",
                      "database=%s error=\"%s\"", t->name, err.message);
        t->held = false;
        outbox_store_free(c.db.store);
    }
}

/* Sets the removed tenants no slot serves any more aside. Under the lock. */
void
scheduler_release_removed(struct scheduler *s)
{
    size_t kept = 0;

    for (size_t i = 0; i < s->count; i++) {
        struct tenant *t = s->tenants[i];

        if (t->removed && t->serving == 0) {
            t->released_next = s->released;
            s->released = t;
        } else {
            s->tenants[kept++] = t;
        }
    }
    s->count = kept;
}

/*
 * The link to the released tenant to free next, and whether it leaves its
 * rendezvous (tenant_close_idle_io): one with an idle connection first, as
 * its leave frees a connection for the others; then one that can have a new
 * connection counted, *to_close another's idle one to close for it; then,
 * when the relay stops (its watch ends: it is no member any more), or one
 * never served, one that does not leave. NULL when each must wait for a
 * connection a slot gives back. Under the lock.
 */
static struct tenant **
next_released(struct scheduler *s, bool *leave, outbox_store **to_close)
{
    struct tenant **link;

    *to_close = NULL;
    for (link = &s->released; *link != NULL; link = &(*link)->released_next)
        if ((*leave = (*link)->idle_count > 0))
            return link;
    for (link = &s->released; *link != NULL; link = &(*link)->released_next) {
        struct tenant *t = *link;

        if (!t->tried || t->down || relay_stopping(s->relay)) {
            *leave = false;
            return link;
        }
        if ((*leave = scheduler_count_new_connection(s, to_close)))
            return link;
    }
    return NULL;
}

void
scheduler_free_released(struct scheduler *s)
{
    struct tenant **link;
    outbox_store *to_close;
    bool leave;

    while ((link = next_released(s, &leave, &to_close)) != NULL) {
        struct tenant *t = *link;
        size_t closed;

        *link = t->released_next;
        pthread_mutex_unlock(&s->lock);
        outbox_store_free(to_close);
        closed = tenant_close_idle_io(s, t, leave ? TENANT_LEAVES : TENANT_STAYS);
        log_event(OUTBOX_LOG_INFO, "database released", "database=%s", t->name);
        tenant_discard(t); /* s->open is counted down under the lock, below */
        pthread_mutex_lock(&s->lock);
        s->open -= (int)closed;
        pthread_cond_broadcast(&s->changed); /* the connections are free for others */
    }
}

/* Tells the metrics which databases are listed now. Under the lock. */
static void
publish_list(struct scheduler *s)
{
    const char **names = calloc(s->count + 1, sizeof(*names));
    size_t n = 0;

    if (names == NULL)
        return;
    for (size_t i = 0; i < s->count; i++)
        if (!s->tenants[i]->removed)
            names[n++] = s->tenants[i]->name;
    metrics_databases_set_list(s->database_metrics, names, n);
    metrics_databases_set_connections(s->database_metrics, s->open,
                                      s->budget);
    free(names);
}

/*
 * Makes the tenants follow list: new names added, names gone (or whose URL
 * changed) removed. Under the lock. -1 when out of memory (the list is
 * then followed in part, and again at the next change).
 */
int
scheduler_apply_list(struct scheduler *s, const struct database_list *list, enum list_reading when)
{
    struct tenant **tenants =
        realloc(s->tenants, (s->count + list->count + 1) * sizeof(*s->tenants));

    if (tenants == NULL)
        return -1;
    s->tenants = tenants;
    for (size_t i = 0; i < s->count; i++) {
        struct tenant *t = s->tenants[i];
        const struct database_entry *entry = database_list_find(list, t->name);

        if (!t->removed && (entry == NULL || strcmp(entry->url, t->url) != 0)) {
            t->removed = true;
            log_event(OUTBOX_LOG_INFO, "database removed from the list", "database=%s",
                      t->name);
        }
    }
    for (size_t i = 0; i < list->count; i++) {
        bool present = false;

        for (size_t j = 0; j < s->count && !present; j++)
            present = !s->tenants[j]->removed && strcmp(s->tenants[j]->name, list->items[i].name) == 0;
        if (present)
            continue;
        if ((s->tenants[s->count] = tenant_new(s, &list->items[i])) == NULL)
            return -1;
        s->count++;
        atomic_store(&s->probe_due, true);
        if (when == LIST_CHANGED)
            log_event(OUTBOX_LOG_INFO, "database added to the list", "database=%s",
                      list->items[i].name);
    }
    scheduler_release_removed(s);
    publish_list(s);
    s->watch_stale = true;
    pthread_cond_broadcast(&s->changed);
    return 0;
}

/* Re-reads the list when its file changed. Under the lock (the file is small). */
void
scheduler_look_at_list(struct scheduler *s, double now)
{
    const char *path = s->relay->config->databases_file;
    struct database_file_stamp stamp;
    struct database_list list;
    struct outbox_error err;

    LOCK_ASSERT_HELD(&s->lock);
    if (path == NULL || now < s->list_look_at)
        return; /* a list of one: the relay's own database */
    s->list_look_at = now + SCHEDULER_LIST_LOOK_SECONDS;
    stamp = database_file_stamp(path);
    if (!database_file_changed(&stamp, &s->stamp))
        return;
    s->stamp = stamp;
    if (database_list_read(path, &list, &err) != 0) {
        log_event(OUTBOX_LOG_ERROR, "database list not read again, the previous one is kept",
                  "error=\"%s\"", err.message);
        return;
    }
    if (scheduler_apply_list(s, &list, LIST_CHANGED) != 0)
        log_event(OUTBOX_LOG_ERROR, "database list followed in part", "error=\"out of memory\"");
    database_list_clear(&list);
}


int
scheduler_add_own(struct scheduler *s, const char *url)
{
    /* named "own" in the few lines of its own (the URL may hold a password) */
    struct database_entry entry = {.name = "own", .url = (char *)url};
    struct tenant *t;

    s->tenants = calloc(1, sizeof(*s->tenants));
    if (s->tenants == NULL || (t = tenant_new(s, &entry)) == NULL)
        return -1;
    t->kind = TENANT_OWN;
    snprintf(t->who, sizeof(t->who), "%s", ""); /* its slots' names lead its lines */
    s->tenants[s->count++] = t;
    return 0;
}
