/*
 * publish.h - one claimed batch out to the broker, its outcomes sorted
 * into the settlement the pipeline marks next.
 */
#ifndef OUTBOX_RELAY_PUBLISH_H
#define OUTBOX_RELAY_PUBLISH_H

#include "relay_state.h"

void publish_keep_held_rows(struct pipeline *p, struct outbox_batch *batch, double *claimed_at);
void publish_give_back(struct pipeline *p, struct outbox_batch *batch);
void publish_batch(struct pipeline *p, struct settlement *st);

#endif
