/*
 * sink_redis_publish.h - pipelining one batch per node, WAIT, and each
 * message's outcome; the entry point the ops table calls for sink_publish().
 */
#ifndef OUTBOX_SINK_REDIS_PUBLISH_H
#define OUTBOX_SINK_REDIS_PUBLISH_H

#include "sink_redis_node.h"

int sink_redis_publish(sink *s, const struct sink_message *messages, size_t count,
                       struct sink_outcome *outcomes, struct outbox_error *err);

#endif
