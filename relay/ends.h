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

int ends_connect(struct database *db, struct pipeline *p, bool want_store, bool want_sink,
                 bool first);
int ends_connect_store(struct database *db, bool first);
int ends_connect_sink(struct pipeline *p, bool first);
void ends_drop_store(struct database *db);
void ends_database_failed(struct database *db, const struct outbox_error *err);
void ends_store_failed(struct pipeline *p, const struct outbox_error *err);
void ends_broker_lost(struct pipeline *p, const struct outbox_error *err);
void ends_broker_close(struct pipeline *p);

#endif
