/*
 * sink_redis_cluster.h - Redis Cluster: the slot map, redirections and the
 * routing of each message to the owner of its slot (redis+cluster://).
 */
#ifndef OUTBOX_SINK_REDIS_CLUSTER_H
#define OUTBOX_SINK_REDIS_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "sink_redis_node.h"

/* Whether node i receives appends: the one server, the primary, or a master owning a slot. */
bool sink_redis_node_is_primary(const struct sink_redis *r, uint16_t node);

/*
 * Asks the seed nodes in turn for the slot map, then connects to every
 * master. Configuration errors as connect_sentinel.
 */
int sink_redis_connect_cluster(sink *s, struct outbox_error *err);

/*
 * Reads a -MOVED or -ASK redirection ("MOVED 3999 127.0.0.1:6381") into the
 * index of the node it names; an empty host is the node that answered.
 * NO_NODE when the text is not one, or out of memory.
 */
uint16_t sink_redis_redirect_target(struct sink_redis *r, uint16_t from, const char *text,
                                    unsigned *slot);

/* Cluster: reads the slot map again from any connected node after a MOVED. */
void sink_redis_refresh_slot_map(sink *s);

/*
 * Routes the messages of the batch to send: their slot and node. A message
 * whose slot has no known owner is deferred at once; in a cluster, one whose
 * stream name holds a '}' but no hash tag (a routing key can) is rejected,
 * since no dedup record could share its slot. Returns how many were routed.
 */
size_t sink_redis_route_messages(sink *s, const struct sink_message *messages,
                                 const size_t *sendable, size_t count,
                                 struct sink_outcome *outcomes);

#endif
