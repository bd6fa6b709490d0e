/*
 * sink_amqp_confirm.h - reading what the broker sends back while a batch is
 * published (acks, nacks, returns, closes) and settling the batch by it.
 *
 * Used by sink_amqp_publish.c (the publish windows) and sink_amqp.c (idle);
 * sink_amqp_confirm.c itself stands only on sink_amqp_conn.c.
 */
#ifndef OUTBOX_SINK_AMQP_CONFIRM_H
#define OUTBOX_SINK_AMQP_CONFIRM_H

#include <stdint.h>

#include "sink_amqp_conn.h"

/*
 * Defers every published, unsettled message and every unsent one with
 * reason: the connection failed them, not their content. A returned message
 * keeps its own failure (unroutable).
 */
void sink_amqp_defer_unsettled(struct batch *batch, const char *reason);

/*
 * Waits up to timeout_ms (0: only what already arrived) for one frame and
 * handles it. Returns 1 when a frame was handled, 0 when none came, or the
 * negative of a frame_result otherwise.
 */
int sink_amqp_read_one_frame(sink *s, struct batch *batch, int64_t timeout_ms,
                             struct outbox_error *err);

#endif
