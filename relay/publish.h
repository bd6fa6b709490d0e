/*
 * publish.h - one claimed batch out to the broker, its outcomes sorted
 * into the settlement the pipeline marks next.
 */
#ifndef OUTBOX_RELAY_PUBLISH_H
#define OUTBOX_RELAY_PUBLISH_H

#include "relay_state.h"

/* The rows of batch whose lease p cannot prove held on db (extended when old) dropped. */
void publish_keep_held_rows(struct pipeline *p, struct database *db, struct outbox_batch *batch,
                            double *claimed_at);
/* A claim not published given back to db and freed; 0, or -1 with the connection dropped. */
int publish_give_back(struct pipeline *p, struct database *db, struct outbox_batch *batch);
/* st's batch of db's rows published on p's broker, its rows sorted by outcome into st. */
void publish_batch(struct pipeline *p, const struct database *db, struct settlement *st);

#endif
