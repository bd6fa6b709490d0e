/*
 * sink_redis.h - the Redis Streams sink's own options.
 *
 * The relay never reads this struct: config.c fills it through the option
 * rows of sink_redis_type, and the sink copies what it keeps at sink_new().
 * It is declared here for tests and tools that open a Redis sink without
 * parsing options (store one in sink_options_broker(options, "redis")).
 */
#ifndef OUTBOX_SINK_REDIS_H
#define OUTBOX_SINK_REDIS_H

#include <stdint.h>

#include "sink_redis_url.h"

/* --redis-wait's default: 1 with Sentinel or Cluster, 0 with one server. */
#define SINK_REDIS_WAIT_BY_TOPOLOGY (-1)

struct sink_redis_config {
    const char *stream_prefix; /* --stream-prefix: stream = prefix + (routing key, else queue) */
    int64_t dedup_window_ms;   /* --dedup-window: append at most once per job within this; 0: 24h */
    int64_t stream_maxlen;     /* --stream-maxlen: MAXLEN ~ N on every XADD, 0 for none */
    int wait_replicas;         /* --redis-wait: replicas that must have an append */
};

#endif
