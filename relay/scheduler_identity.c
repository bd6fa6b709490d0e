/*
 * scheduler_identity.c - two databases of a list under one identity: their
 * rows' message ids collide (the database's identity and the job id), so a
 * destination that deduplicates by message id drops one database's rows as
 * the other's repeats. A CREATE DATABASE ... TEMPLATE copy beside its
 * original, or a restore of a listed database's dump under another name,
 * does that silently. A relay of the list says so at once, at the connect
 * that reads the second identity, naming both databases; it serves both
 * as before. See scheduler_state.h.
 */
#include "scheduler_state.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

void
scheduler_identity_seen(struct scheduler *s, struct tenant *t, const char *database_id)
{
    pthread_mutex_lock(&s->lock);
    /* a new identity (outboxctl identity set) is said again if it is another's */
    if (strcmp(t->database_id, database_id) != 0)
        t->identity_shared = false;
    snprintf(t->database_id, sizeof(t->database_id), "%s", database_id);
    for (size_t i = 0; i < s->count && database_id[0] != '\0'; i++) {
        struct tenant *other = s->tenants[i];

        if (other == t || other->removed || strcmp(other->database_id, database_id) != 0 ||
            (t->identity_shared && other->identity_shared))
            continue;
        t->identity_shared = other->identity_shared = true;
        log_event(OUTBOX_LOG_ERROR,
                  "two databases of the list have one identity: their message ids collide and a"
                  " deduplicating destination drops one's rows as the other's; give one its own"
                  " (outboxctl identity set --database-id)",
                  "database=%s other=%s database_id=%s", t->name, other->name, database_id);
    }
    pthread_mutex_unlock(&s->lock);
}
