/*
 * relay_state.c - the stop flag and the first fatal error that every thread
 * of a relay reads and sets.
 *
 * Rules: the first fatal error wins and is kept whole; setting it also sets
 * the stop latch so every wait ends at once. Calls only wait.c, never a
 * thread body or the connection handling, so all of them may call it.
 */
#include "relay_state.h"

bool
relay_stopping(const relay *r)
{
    return atomic_load(&r->stopping) || atomic_load(&r->fatal);
}

/* Records the first fatal error and stops every pipeline. */
void
relay_set_fatal(relay *r, const struct outbox_error *err)
{
    pthread_mutex_lock(&r->fatal_lock);
    if (!atomic_load(&r->fatal)) {
        r->fatal_error = *err;
        atomic_store(&r->fatal, 1);
    }
    pthread_mutex_unlock(&r->fatal_lock);
    wait_latch_set(&r->stop);
}

/* Called by each thread as it returns; the last one tells the caller. */
void
relay_thread_returned(relay *r)
{
    if (atomic_fetch_sub(&r->running, 1) == 1 && r->finished != NULL)
        r->finished(r->finished_arg);
}
