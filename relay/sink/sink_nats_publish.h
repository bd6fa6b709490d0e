/*
 * sink_nats_publish.h - publishing a batch to NATS JetStream and filing its
 * acks, which arrive on the library's thread (sink_nats_on_ack).
 */
#ifndef OUTBOX_SINK_NATS_PUBLISH_H
#define OUTBOX_SINK_NATS_PUBLISH_H

#include "sink_nats_conn.h"

/* The library's callback for every publish ack: files it under its message. */
void sink_nats_on_ack(jsCtx *js, natsMsg *message, jsPubAck *ack, jsPubAckErr *error,
                      void *closure);

/* Closes and frees the connection and the JetStream context. */
void sink_nats_drop_connection(sink *s);

/* The sink's publish and idle operations (see struct sink_ops). */
int sink_nats_publish(sink *s, const struct sink_message *messages, size_t count,
                      struct sink_outcome *outcomes, struct outbox_error *err);
int sink_nats_idle(sink *s, struct outbox_error *err);

#endif
