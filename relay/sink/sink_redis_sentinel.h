/*
 * sink_redis_sentinel.h - finding the primary that the sentinels name and
 * connecting to it (redis+sentinel://).
 */
#ifndef OUTBOX_SINK_REDIS_SENTINEL_H
#define OUTBOX_SINK_REDIS_SENTINEL_H

#include "sink_redis_node.h"

/*
 * Asks the sentinels in turn for the primary and connects to it. The error
 * is OUTBOX_ERR_CONFIG only when no attempt failed in a way worth retrying
 * (every sentinel refused the credentials or does not know the master).
 */
int sink_redis_connect_sentinel(sink *s, struct outbox_error *err);

#endif
