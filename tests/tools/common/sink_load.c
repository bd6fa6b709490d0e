/*
 * sink_load.c - one thread's share of a sink throughput load (see sink_load.h).
 */
#include "sink_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

size_t
sink_load_publish(const struct sink_options *options, const char *queue, int64_t first_job_id,
                  size_t count, size_t batch, const char *payload, size_t payload_len)
{
    struct sink_message *messages = calloc(batch, sizeof(*messages));
    struct sink_outcome *outcomes = calloc(batch, sizeof(*outcomes));
    struct outbox_error err;
    sink *s = sink_new(options, &err);
    size_t accepted = 0;

    if (s == NULL || messages == NULL || outcomes == NULL || sink_connect(s, &err) != 0) {
        fprintf(stderr, "sink: %s\n", s == NULL || messages == NULL ? "setup failed" : err.message);
        goto out;
    }
    for (size_t at = 0; at < count; at += batch) {
        size_t n = count - at < batch ? count - at : batch;

        for (size_t i = 0; i < n; i++)
            messages[i] = (struct sink_message){.job_id = first_job_id + (int64_t)(at + i),
                                                .attempt = 1,
                                                .queue = queue,
                                                .payload = payload,
                                                .payload_len = payload_len,
                                                .headers = "{}",
                                                .created_at = 1.7e9,
                                                .history = "load:1"};
        for (size_t i = 0; i < n; i++) {
            snprintf(messages[i].message_id, sizeof(messages[i].message_id), "load:1:%lld",
                     (long long)messages[i].job_id);
            memcpy(messages[i].dedup_id, messages[i].message_id, sizeof(messages[i].dedup_id));
        }
        if (sink_publish(s, messages, n, outcomes, &err) != 0) {
            fprintf(stderr, "sink: %s\n", err.message);
            goto out;
        }
        for (size_t i = 0; i < n; i++)
            accepted += outcomes[i].status == SINK_ACCEPTED;
    }
    sink_disconnect(s);
out:
    sink_free(s);
    free(messages);
    free(outcomes);
    return accepted;
}
