/*
 * sink_amqp.c - placeholder until the amqp sink lands; every call fails.
 */
#include "sink_internal.h"

#include "error.h"

static int
amqp_init(sink *s, struct outbox_error *err)
{
    (void)s;
    return outbox_error_set(err, OUTBOX_ERR_CONFIG, "the amqp broker is not available in this build");
}

static void
amqp_destroy(sink *s)
{
    (void)s;
}

const struct sink_ops sink_amqp_ops = {
    .kind = "amqp",
    .init = amqp_init,
    .destroy = amqp_destroy,
};
