/*
 * sink_kafka.h - the Kafka sink's own options.
 *
 * The relay never reads this struct: config.c fills it through the option
 * rows of sink_kafka_type, and the sink copies what it keeps at sink_new().
 * It is declared here for tests and tools that open a Kafka sink without
 * parsing options (store one in sink_options_broker(options, "kafka")).
 */
#ifndef OUTBOX_SINK_KAFKA_H
#define OUTBOX_SINK_KAFKA_H

struct sink_kafka_config {
    const char *topic_prefix; /* --topic-prefix: topic = prefix + (routing key, else queue) */
    int sasl_mechanism;       /* --kafka-sasl-mechanism: index in plain|scram-sha-256|scram-sha-512 */
};

#endif
