/*
 * store_database_lease.h - the lease of a whole database among relays that
 * serve the same list of databases (sql/018_database_lease.sql,
 * sql/019_database_lease_watch.sql).
 *
 * A relay visiting a database records itself as a member and takes, keeps
 * or gives up the database's lease in one call; the live members'
 * rendezvous hash decides which of them serves it. A member whose
 * statistics watch runs on the database's server is alive while that
 * session is: its leases need no visit.
 */
#ifndef OUTBOX_STORE_DATABASE_LEASE_H
#define OUTBOX_STORE_DATABASE_LEASE_H

#include <stdbool.h>

#include <libpq-fe.h>

#include "outbox.h"

/*
 * A relay's statistics watch session (relay/scheduler_watch.h) is named
 * this prefix and the relay's uuid; each of its looks is a transaction of
 * at most SCHEDULER_WATCH_DEADLINE_SECONDS.
 */
#define STORE_WATCH_NAME_PREFIX "outbox-relay watch "

/* What a visit found of a database's lease. */
struct store_database_lease {
    bool held;          /* this relay holds it now */
    bool paused;        /* outboxctl pause --database: no relay holds it */
    bool wins;          /* this relay should hold it (the hash): it comes back soon to take it */
    bool owner_watched; /* the owner's statistics watch keeps it: no visit needed to keep it,
                           nor to take it over (the watch sees the owner go) */
};

/*
 * Records relay_id as a live member for lease_seconds, with watch the
 * application_name of its statistics watch's session on this server (NULL
 * without one) and watch_pid that session's backend pid (0: unknown; from
 * migration 024 the member is recorded under that session's login role, not
 * conn's), and takes, keeps or gives up the database's lease. conn
 * must be idle. At migration 018, watch is not recorded and wins and
 * owner_watched are false. 0, or -1 with err (OUTBOX_ERR_SCHEMA before
 * migration 018).
 */
int store_database_lease_take(PGconn *conn, const char *relay_id, int lease_seconds,
                              const char *watch, int watch_pid,
                              struct store_database_lease *lease, struct outbox_error *err);

/* Gives relay_id's lease and membership up (a relay stopping). 0, or -1 with err. */
int store_database_lease_release(PGconn *conn, const char *relay_id, struct outbox_error *err);

/*
 * The seconds until a database the statistics watch covers must be looked
 * at again though no row changed (scheduler_watch.h): until its earliest
 * row scheduled in the future (run_at) that no earlier row of its key holds
 * back, or the earliest lease of a claimed row to end (then reaped), 0 when
 * one is due now; -1 when there is none. Rows due now that the last claim
 * left are paused or held back: a resume or a completion changes rows,
 * which wakes the database. *held says whether any row waits behind its
 * key: one whose key's head finished while the row's insert was not yet
 * committed waits for the sweep of held rows (outbox_release_waiting), and
 * the change that woke the visit came before that sweep was due. On
 * PostgreSQL 15 and later it also has the session report its row counts
 * as soon as it is idle (a backend holds back a report that comes within a
 * second of its last one for up to 10 s): the watch sees the visit's own
 * changes at once, while the connection is still open, rather than waking
 * the database for them later through a new connection. 0, or -1 with err.
 */
int store_database_next_ready(PGconn *conn, double *seconds, bool *held,
                              struct outbox_error *err);

/* A database's backlog and identity, as a visit samples them (relay/scheduler_sample.c). */
struct store_database_sample {
    bool counted;            /* ready and oldest_ready_age were read (else -1) */
    long long ready;         /* rows ready and due now, paused or held behind their key included */
    double oldest_ready_age; /* seconds since the oldest of the ready rows was due, 0 for none */
    bool claimable;          /* a claim would take one now (or one another session locks):
                                not held nor behind its key, queue and key not paused, of a
                                queue among queues; among the first 1000 in the claim's order */
    char database_id[48];    /* outbox.identity now */
    char id_form[16];
};

/*
 * Samples the database on conn (idle): whether a claim would take a row
 * and outbox.identity, and with count the ready rows and their oldest age
 * (a scan of the ready rows: 0.3-0.4 s for a million). queues: --queues as
 * a text[] literal, NULL for every queue. 0, or -1 with err.
 */
int store_database_sample(PGconn *conn, const char *queues, bool count,
                          struct store_database_sample *sample, struct outbox_error *err);

/*
 * *exists: the database has a stream queue (outboxctl stream enable) among
 * queues (a text[] literal, NULL: any), which the relay then serves with
 * the database's rows (relay/scheduler_stream.c). 0, or -1 with err.
 */
int store_database_has_streams(PGconn *conn, const char *queues, bool *exists,
                               struct outbox_error *err);

#endif
