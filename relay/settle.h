/*
 * settle.h - a published batch's marks (complete, fail, give back), kept in
 * a settlement until the database confirmed them. settle.c reconnects the
 * store through ends.c and calls nothing above it.
 */
#ifndef OUTBOX_RELAY_SETTLE_H
#define OUTBOX_RELAY_SETTLE_H

#include <stdbool.h>
#include <stddef.h>

#include "relay_state.h"

int settlement_init(struct settlement *st, size_t n);
void settlement_free(struct settlement *st);
bool settlement_has_rows(const struct settlement *st);
void settlement_clear(struct pipeline *p, struct settlement *st);
/* The marks of st sent to db's connection; 0, or -1 with the connection dropped. */
int settle_send(struct pipeline *p, struct database *db, const struct settlement *st);
/* Their results collected; 0, or -1 with the connection dropped and the rest left in st. */
int settle_receive(struct pipeline *p, struct database *db, struct settlement *st);
/* Both, reconnecting db once when it is gone; st is cleared after, marked or not. */
void settle_now(struct pipeline *p, struct database *db, struct settlement *st);

#endif
