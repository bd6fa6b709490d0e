/*
 * sink_redis.c - placeholder until the redis sink lands; every call fails.
 */
#include "sink_internal.h"

#include "error.h"

static int
redis_init(sink *s, struct outbox_error *err)
{
    (void)s;
    return outbox_error_set(err, OUTBOX_ERR_CONFIG, "the redis broker is not available in this build");
}

static void
redis_destroy(sink *s)
{
    (void)s;
}

const struct sink_ops sink_redis_ops = {
    .kind = "redis",
    .init = redis_init,
    .destroy = redis_destroy,
};
