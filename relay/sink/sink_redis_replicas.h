/*
 * sink_redis_replicas.h - how many replicas a Redis primary has, for the
 * Redis sink's --redis-wait: the default with Sentinel and Cluster, the
 * start-up line and --check, and the reason rows wait when a primary has
 * none.
 *
 * Reads INFO replication on a connection the caller owns; never prints.
 */
#ifndef OUTBOX_SINK_REDIS_REPLICAS_H
#define OUTBOX_SINK_REDIS_REPLICAS_H

#include <stddef.h>

#include <hiredis/hiredis.h>

/* The replica count of a primary whose INFO could not be read. */
#define SINK_REDIS_REPLICAS_UNKNOWN (-1)

/*
 * The number of replicas connected to the server behind context
 * (connected_slaves of INFO replication), or SINK_REDIS_REPLICAS_UNKNOWN
 * when the server did not answer with it. A lost connection is left for
 * the caller's next command to find.
 */
int sink_redis_replica_count(redisContext *context);

/*
 * Appends "H:P has N replicas" (or "an unknown number of replicas") to
 * text (size bytes, NUL-terminated, truncated when full), after a "; "
 * when text is not empty.
 */
void sink_redis_replicas_describe(char *text, size_t size, const char *node_name, int replicas);

#endif
