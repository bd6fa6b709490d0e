/*
 * ends.h - connecting, losing and closing a thread's database and broker.
 *
 * Each pipeline and the maintenance thread make and drop their connections
 * here only; ends.c stands on relay_state.c and calls no thread body.
 */
#ifndef OUTBOX_RELAY_ENDS_H
#define OUTBOX_RELAY_ENDS_H

#include <stdbool.h>

#include "relay_state.h"

int connect_ends(struct database *db, struct pipeline *p, bool want_store, bool want_sink,
                 bool first);
int connect_store(struct database *db, bool first);
int connect_sink(struct pipeline *p, bool first);
void drop_store(struct database *db);
void database_failed(struct database *db, const struct outbox_error *err);
void store_failed(struct pipeline *p, const struct outbox_error *err);
void broker_lost(struct pipeline *p, const struct outbox_error *err);
void broker_close(struct pipeline *p);

#endif
