/*
 * scheduler_watch.h - wakes the idle databases of a list from PostgreSQL's
 * statistics instead of polling each one.
 *
 * With fewer connections than databases, a poll of an idle database costs a
 * connection (a backend start, the session, the identity, the lease): 200
 * databases polled every second were 200 connects a second. The watch keeps
 * one connection per PostgreSQL server of the list instead and reads
 * pg_stat_database there every SCHEDULER_WATCH_SECONDS: a database whose
 * count of inserted, updated and deleted rows moved since the last look
 * has had a commit that changed something, maybe an outbox row (a new one,
 * a dead one retried, a queue resumed), and is due at once. The counts
 * reach pg_stat_database when the writing backend reports its statistics:
 * at once for a backend that reported none in the last second, else within
 * that second.
 *
 * The same look reads which relays' watches run on the server (their
 * sessions' application_name, WATCH_NAME_PREFIX and the relay's uuid, with
 * their login role): a relay's watch session keeps its database leases
 * (sql/019, sql/020), so a change of them (a relay started, gone, or
 * stopped querying) wakes every database of the server, for the leases to
 * move.
 *
 * Each connect and each look gets SCHEDULER_WATCH_DEADLINE_SECONDS: a server
 * that stops answering has its connection dropped (retried after
 * SCHEDULER_WATCH_RETRY_SECONDS) and its databases uncovered, instead of
 * holding up every server's wakes.
 *
 * The watch owns its connections but not the budget: it asks for a
 * connection with take() (which may close an idle one of a database) and
 * hands one back with give(). It is driven by one thread, the scheduler's
 * watch thread, and knows nothing of the scheduler.
 */
#ifndef OUTBOX_RELAY_SCHEDULER_WATCH_H
#define OUTBOX_RELAY_SCHEDULER_WATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "store_database_lease.h"

struct watch;

/* The application_name of a relay's watch sessions: this prefix and the relay's uuid. */
#define WATCH_NAME_PREFIX STORE_WATCH_NAME_PREFIX
#define WATCH_NAME_MAX 64 /* PostgreSQL keeps 63 bytes of an application_name */

/* A database to look at now, and why. */
struct watch_wake {
    const char *name; /* in the list */
    bool members;     /* the relays watching its server changed (else: its rows did) */
};

/* A connection of the budget for the watch: true when it may open one. */
typedef bool (*watch_take_fn)(void *arg);
/* The watch closed one of its connections. */
typedef void (*watch_give_fn)(void *arg);

/*
 * A watch whose sessions are named name; another relay's session that ran
 * no query for stale_seconds counts as a change of members.
 */
struct watch *scheduler_watch_new(const char *name, int stale_seconds);

/* Closes the watch's connections (each handed back with give) and frees it. */
void scheduler_watch_free(struct watch *w, watch_give_fn give, void *arg);

/*
 * Watches the count databases of urls (their names in the list are
 * names[i]), in place of those watched before: a server no longer listed
 * has its connection closed; a database still listed keeps its last count
 * (a commit meanwhile wakes it at the next look), and one first seen by a
 * look is woken by it. 0, or -1 (out of memory: nothing watched).
 */
int scheduler_watch_set(struct watch *w, size_t count, const char *const *names,
                        const char *const *urls, watch_give_fn give, void *arg);

/*
 * One look at every server (connecting those without a connection, when
 * take() allows and their retry is due). Returns the number of databases
 * put in woken (at most the count watched, owned by the watch until the
 * next call): those whose rows changed since the last look, or all of a
 * server whose members changed.
 */
size_t scheduler_watch_look(struct watch *w, double now, watch_take_fn take, watch_give_fn give,
                            void *arg, const struct watch_wake **woken);

/* Whether database name is watched now: its server answered the last look and lists it. */
bool scheduler_watch_covers(const struct watch *w, const char *name);

/*
 * The backend pid of the watch's session on database name's server, 0 for
 * none: the lease call names it, so that the member is known by that
 * session's login role (sql/024), which may not be the database's.
 */
int watch_pid_of(const struct watch *w, const char *name);

#endif
