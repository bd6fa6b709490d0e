/*
 * sink_amqp.h - the RabbitMQ sink's own options.
 *
 * The relay never reads this struct: config.c fills it through the option
 * rows of sink_amqp_type, and the sink copies what it keeps at sink_new().
 * It is declared here for tests and tools that open an AMQP sink without
 * parsing options (store one in sink_options_broker(options, "amqp")).
 */
#ifndef OUTBOX_SINK_AMQP_H
#define OUTBOX_SINK_AMQP_H

#include <stdbool.h>

#include "url.h"

struct sink_amqp_config {
    const char *exchange; /* --exchange: of rows naming none; NULL or "": the default exchange */
    bool tls_verify;      /* --tls-verify: amqps verifies the peer (default true) */
    int heartbeat_seconds; /* 0 disables heartbeats; default TIMEOUT_BROKER_HEARTBEAT_SECONDS */
};

/*
 * The vhost of a parsed amqp:// or amqps:// URL: its path percent-decoded
 * ("/%2f" is "/"), "/" when empty. Owned by url; NULL for another scheme.
 */
const char *sink_amqp_url_vhost(const struct broker_url *url);

#endif
