/*
 * ends.h - connecting, losing and closing a slot's database and broker.
 *
 * Every slot makes and drops its connections here only (scheduler_serve.c
 * opens a database's through ends_connect()); ends.c stands on
 * relay_state.c and calls no thread body.
 */
#ifndef OUTBOX_RELAY_ENDS_H
#define OUTBOX_RELAY_ENDS_H

#include <stdbool.h>

#include "relay_state.h"
#include "store_connect.h"

/* Which ends ends_connect() connects (a mask). */
enum ends_want {
    ENDS_STORE = 1, /* the thread's database */
    ENDS_SINK = 2,  /* the pipeline's broker */
};

/*
 * Which attempt of a thread a connect is: at its first, a refused password,
 * a missing schema or (after a few tries) a refused broker login stops the
 * relay; later ones are retried with backoff.
 */
enum ends_attempt { ENDS_AGAIN, ENDS_FIRST };

/* How database_open() opens a connection. */
struct database_open {
    const char *url;
    const char *worker_id;
    const char *who; /* leads the connection's notices in the log; outlives the connection */
    const struct store_connect_options *steps; /* the connect steps left out (store_connect.h) */
};

/*
 * Opens a connection to a database the relay's way, for its own database
 * or a database of a list alike: the store (the schema
 * and privileges checked unless how->steps says they were), DELETE for
 * --on-success delete, the database's identity read into *identity (a
 * changed history warned of), the notices logged, the relay's store
 * settings. NULL with err when it could not.
 */
outbox_store *database_open(const struct relay_config *config, struct metrics *m,
                            const struct database_open *how, struct store_identity *identity,
                            struct outbox_error *err);

int ends_connect(struct database *db, struct pipeline *p, unsigned int want,
                 enum ends_attempt when);
int ends_connect_store(struct database *db, enum ends_attempt when);
int ends_connect_sink(struct pipeline *p, enum ends_attempt when);
void ends_drop_store(struct database *db);
void ends_database_failed(struct database *db, const struct outbox_error *err);
void ends_store_failed(struct pipeline *p, struct database *db, const struct outbox_error *err);
void ends_broker_lost(struct pipeline *p, const struct outbox_error *err);
void ends_broker_close(struct pipeline *p);

#endif
