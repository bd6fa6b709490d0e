/*
 * sink_internal.h - what a broker implementation provides to sink.c.
 *
 * sink.c owns the common part (display URL, endpoints, dispatch);
 * sink_registry.c the registry, one struct sink_type per broker listed
 * once, and sink_new(), which picks a URL's broker from it. A broker's module declares everything about it in its
 * sink_type: its kind, the URL schemes it speaks, its options (rows whose
 * offsets are into its own configuration struct, opaque to everyone else)
 * and its operations, keeping its state behind s->impl. What only some
 * brokers need is an optional operation, NULL for the others, never a
 * field every broker carries. The relay, the option parser and --help
 * learn of a broker only through the registry.
 *
 * Adding a broker takes, and nothing else:
 * - relay/sink/sink_<kind>.c (more files by job past ~800 lines, their
 *   shared state in sink_<kind>_conn.h as AMQP's, NATS' and Kafka's): its
 *   struct sink_type with kind, product (and check_help) for --help,
 *   schemes (each with usage for --help and parse_path/path_free for its
 *   URL path), option rows whose offsets are into its own configuration
 *   struct, config_size/config_defaults, ops (the optional ones it
 *   needs); sink_<kind>.h declares that configuration struct for tests and
 *   tools;
 * - one row in SINK_TYPES in sink_registry.c (with its extern beside it);
 * - one row in the broker table of tests/integration/test_relay_brokers.c;
 * - its server and client library in tests/harness/deps.sh (and the
 *   Makefile's RELAY_PKGS);
 * - its options in docs/reference.md and the man page (tests/check_docs.sh compares
 *   them with --help).
 * Only sink*.c include this header.
 */
#ifndef OUTBOX_SINK_INTERNAL_H
#define OUTBOX_SINK_INTERNAL_H

#include "option.h"
#include "sink.h"
#include "url.h"

struct sink_ops {
    /*
     * Allocates s->impl from s->url, s->options and config (the broker's
     * own, never NULL); copies what it keeps, config is not kept. No I/O.
     */
    int (*init)(sink *s, const void *config, struct outbox_error *err);
    /*
     * Connects and sets s->connected: to s->url.endpoints[s->endpoint] when
     * endpoint_alternatives, else to whatever the endpoints lead to.
     */
    int (*connect)(sink *s, struct outbox_error *err);
    int (*publish)(sink *s, const struct sink_message *messages, size_t count,
                   struct sink_outcome *outcomes, struct outbox_error *err);
    int (*idle)(sink *s, struct outbox_error *err);
    /* --check on a connected sink: what publishing needs exists; NULL when nothing to check. */
    int (*check)(sink *s, struct outbox_error *err);
    void (*disconnect)(sink *s);
    /* Frees s->impl (after disconnect). */
    void (*destroy)(sink *s);
    /*
     * Optional operations, each NULL for a broker that has no use for it;
     * sink.c checks for NULL in the one wrapper that calls it.
     */
    /* Keeps the redelivery horizon (see sink_set_redelivery_horizon); before connect. */
    void (*redelivery_horizon)(sink *s, int64_t horizon_ms);
    /* Fills every field of replication (see sink_replication). */
    void (*replication)(const sink *s, struct sink_replication *replication);
    /*
     * The URL's endpoints are interchangeable nodes (an AMQP cluster): sink.c
     * picks one per connect and moves on after a loss. When false, connect
     * uses them all itself (Redis Sentinel asks the sentinels, Cluster maps
     * the slots from the seeds).
     */
    bool endpoint_alternatives;
};

/* One broker: a row of the registry in sink_registry.c. */
struct sink_type {
    const char *kind;                        /* "amqp": logs, errors, the broker="..." label */
    const char *product;                     /* "RabbitMQ": --help's description */
    const char *check_help; /* what its --check verifies ("--exchange exists"); NULL: nothing */
    const struct url_scheme *const *schemes; /* the URL schemes it speaks, NULL-terminated */
    /* its CloudEvents binding's attribute header prefix ("ce_"), see sink_cloudevents_prefix */
    const char *cloudevents_prefix;
    const struct option_spec *options;       /* its own options, fields of its configuration */
    size_t option_count;
    /* Its configuration: config_size bytes, zeroed, then config_defaults (NULL: none). */
    size_t config_size;
    void (*config_defaults)(void *config);
    /* Frees what the configuration owns (not the block itself); NULL: nothing. */
    void (*config_free)(void *config);
    const struct sink_ops *ops;
};

struct sink {
    const struct sink_type *type;
    const struct sink_ops *ops; /* type->ops */
    struct sink_options options; /* url is an owned copy; password and broker_config cleared */
    struct broker_url url;       /* parsed options.url */
    char *display_url;           /* password redacted */
    bool connected;
    void *impl;
    /* index in url.endpoints of the endpoint connected to, or the one tried next */
    size_t endpoint;
    char endpoint_names[URL_MAX_ENDPOINTS][URL_ENDPOINT_TEXT_MAX]; /* "host:port" each */
};

/*
 * What a connect error names: the display URL when the URL lists one
 * endpoint, else the endpoint in use ("host:port").
 */
const char *sink_target(const sink *s);

#endif
