/*
 * scheduler_probe.c - the servers of databases never visited, probed before
 * a slot spends a connect on them. See scheduler_state.h.
 */
#include "scheduler_state.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "lock_check.h"
#include "log.h"
#include "metrics.h"
#include "probe.h"
#include "timeouts.h"

/* What one probe round took: the tenants, their URLs (copies) and the answers. */
struct probe_round {
    size_t count;
    struct tenant **tenants;
    char **urls;
    enum probe_answer *answers;
};

static void
round_free(struct probe_round *r)
{
    for (size_t i = 0; r->urls != NULL && i < r->count; i++)
        free(r->urls[i]);
    free(r->tenants);
    free(r->urls);
    free(r->answers);
}

/* The tenants never visited nor probed, marked probed. Under the lock. 0, or -1 out of memory. */
static int
round_take(struct scheduler *s, struct probe_round *r)
{
    size_t wanted = 0;

    LOCK_ASSERT_HELD(&s->lock);
    for (size_t i = 0; i < s->count; i++)
        wanted += !s->tenants[i]->removed && !s->tenants[i]->tried && !s->tenants[i]->probed;
    if (wanted == 0)
        return 0;
    r->tenants = calloc(wanted, sizeof(*r->tenants));
    r->urls = calloc(wanted, sizeof(*r->urls));
    r->answers = calloc(wanted, sizeof(*r->answers));
    if (r->tenants == NULL || r->urls == NULL || r->answers == NULL)
        return -1;
    for (size_t i = 0; i < s->count && r->count < wanted; i++) {
        struct tenant *t = s->tenants[i];

        if (t->removed || t->tried || t->probed)
            continue;
        if ((r->urls[r->count] = strdup(t->url)) == NULL)
            return -1;
        t->probed = true;
        r->tenants[r->count++] = t;
    }
    return 0;
}

/* Whether t is still one of s's tenants (not freed while the lock was let go). Under the lock. */
static bool
still_listed(const struct scheduler *s, const struct tenant *t)
{
    for (size_t i = 0; i < s->count; i++)
        if (s->tenants[i] == t)
            return !t->removed;
    return false;
}

/* Records what the round learned. Under the lock. */
static void
round_apply(struct scheduler *s, const struct probe_round *r)
{
    double now = clock_monotonic_seconds();
    size_t silent = 0;
    const char *first = NULL;

    LOCK_ASSERT_HELD(&s->lock);
    for (size_t i = 0; i < r->count; i++) {
        struct tenant *t = r->tenants[i];

        if (!still_listed(s, t) || !t->probed || t->tried || t->serving > 0)
            continue; /* gone, or a slot reached it meanwhile: its visit tells */
        if (r->answers[i] == PROBE_ANSWERED)
            t->answered = true;
        else if (r->answers[i] == PROBE_SILENT) {
            t->down = true;
            t->due = now + backoff_next(&t->retry);
            metrics_databases_set_state(s->database_metrics, t->name, false,
                                        "its server did not answer a probe");
            if (silent++ == 0)
                first = t->name;
        }
    }
    if (silent > 0)
        log_event(OUTBOX_LOG_WARN, "database servers not answering, their databases backed off",
                  "databases=%zu first=%s wait_ms=%d", silent, first, SCHEDULER_PROBE_TIMEOUT_MS);
    pthread_cond_broadcast(&s->changed);
}

void
scheduler_probe_new(struct scheduler *s)
{
    struct probe_round r = {0};
    int rc;

    if (!atomic_exchange(&s->probe_due, false))
        return; /* no database added since the last round: no scan under the lock */
    pthread_mutex_lock(&s->lock);
    rc = round_take(s, &r);
    pthread_mutex_unlock(&s->lock);
    if (rc != 0 || r.count == 0) {
        round_free(&r); /* out of memory: those taken are visited unprobed */
        return;
    }
    probe_servers((const char *const *)r.urls, r.count, SCHEDULER_PROBE_TIMEOUT_MS, r.answers);
    pthread_mutex_lock(&s->lock);
    round_apply(s, &r);
    pthread_mutex_unlock(&s->lock);
    round_free(&r);
}
