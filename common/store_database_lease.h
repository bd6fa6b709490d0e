/*
 * store_database_lease.h - the lease of a whole database among relays that
 * serve the same list of databases (sql/018_database_lease.sql).
 *
 * A relay visiting a database records itself as a member and takes, keeps
 * or gives up the database's lease in one call; the live members'
 * rendezvous hash decides which of them serves it.
 */
#ifndef OUTBOX_STORE_DATABASE_LEASE_H
#define OUTBOX_STORE_DATABASE_LEASE_H

#include <stdbool.h>

#include <libpq-fe.h>

#include "outbox.h"

/*
 * Records relay_id as a live member for lease_seconds and says whether it
 * holds the database's lease now (*held), and whether the database is
 * paused (then no relay holds it). conn must be idle. 0, or -1 with err
 * (OUTBOX_ERR_SCHEMA before migration 018).
 */
int store_database_lease_take(PGconn *conn, const char *relay_id, int lease_seconds, bool *held,
                              bool *paused, struct outbox_error *err);

/* Gives relay_id's lease and membership up (a relay stopping). 0, or -1 with err. */
int store_database_lease_release(PGconn *conn, const char *relay_id, struct outbox_error *err);

/*
 * The seconds until the earliest ready row that no earlier row of its key
 * holds back is due (0 when one is due now), or -1 when there is none: when
 * a database the statistics watch covers must be looked at again without a
 * new row (scheduler_watch.h). 0, or -1 with err.
 */
int store_database_next_ready(PGconn *conn, double *seconds, struct outbox_error *err);

#endif
