/*
 * sink_amqp_publish.h - publishing one batch with publisher confirms; the
 * entry point sink_amqp.c's ops table calls for sink_publish().
 */
#ifndef OUTBOX_SINK_AMQP_PUBLISH_H
#define OUTBOX_SINK_AMQP_PUBLISH_H

#include "sink_amqp_conn.h"

int sink_amqp_publish(sink *s, const struct sink_message *messages, size_t count,
                      struct sink_outcome *outcomes, struct outbox_error *err);

#endif
