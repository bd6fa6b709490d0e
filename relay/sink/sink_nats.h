/*
 * sink_nats.h - the NATS JetStream sink's own options.
 *
 * The relay never reads this struct: config.c fills it through the option
 * rows of sink_nats_type, and the sink copies what it keeps at sink_new().
 * It is declared here for tests and tools that open a NATS sink without
 * parsing options (store one in sink_options_broker(options, "nats")).
 */
#ifndef OUTBOX_SINK_NATS_H
#define OUTBOX_SINK_NATS_H

struct sink_nats_config {
    const char *subject_prefix; /* --subject-prefix: subject = prefix + (routing key, else queue) */
    const char *nats_creds;     /* --nats-creds: a NATS credentials file (JWT and seed) */
};

#endif
