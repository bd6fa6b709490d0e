/*
 * metrics_health.c - the relay's health as the metrics see it: whether
 * each end (database, broker) had a round trip lately, whether the relay
 * loop turns, and whether the broker holds rows back; what /healthz,
 * /readyz and --healthcheck answer from (see metrics.h).
 */
#include "metrics.h"
#include "metrics_state.h"

#include <stdio.h>

#include "lock_check.h"

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
    LOCK_ASSERT_HELD(&m->lock);
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
        const char *name = metrics_target_names[t];
        int n = m->answered[t]
                    ? snprintf(text + used, size - used, "%s: last round trip %.1f s ago\n", name,
                               m->now(m->now_context) - m->last_round_trip[t])
                    : snprintf(text + used, size - used, "%s: no round trip yet\n", name);

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
metrics_loop_stalled(struct metrics *m, double *seconds)
{
    bool stalled;

    *seconds = 0;
    if (m == NULL)
        return false;
    pthread_mutex_lock(&m->lock);
    if (m->loop_turned)
        *seconds = m->now(m->now_context) - m->last_loop_turn;
    stalled = m->loop_turned && *seconds > METRICS_HEALTH_STALE_SECONDS;
    pthread_mutex_unlock(&m->lock);
    return stalled;
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
