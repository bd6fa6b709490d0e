/*
 * sink_load.h - what the sink throughput tools share: one thread's share of
 * the load, published through its own sink as the relay's pipelines do
 * (batches, each waiting for the broker's answer), without a database.
 */
#ifndef OUTBOX_TOOLS_SINK_LOAD_H
#define OUTBOX_TOOLS_SINK_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "sink.h"

/*
 * Connects a new sink of options and publishes count messages to queue, job
 * ids from first_job_id, batch at a time, each with payload. Returns how
 * many the broker accepted; a setup or publish failure ends it early after
 * one line on stderr.
 */
size_t sink_load_publish(const struct sink_options *options, const char *queue,
                         int64_t first_job_id, size_t count, size_t batch, const char *payload,
                         size_t payload_len);

#endif
