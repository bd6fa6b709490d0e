/*
 * config.h - the relay's configuration: command-line options and their
 * OUTBOX_<NAME> environment twins.
 *
 * One table in config.c describes the relay's options (name, environment
 * name, kind, default, help), and the sink registry adds each broker's
 * (sink_option_group): parsing, defaults, `--help`, the man page and the
 * options block of docs/reference.md all come from them. The command line wins over the
 * environment.
 * Every error names the option (or variable) and the bad value, never a
 * password.
 */
#ifndef OUTBOX_CONFIG_H
#define OUTBOX_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "outbox.h"
#include "retention.h"
#include "sink.h"

/* In the order of the --log-level and --log-format choices. */
enum config_log_level {
    CONFIG_LOG_DEBUG,
    CONFIG_LOG_INFO,
    CONFIG_LOG_WARN,
    CONFIG_LOG_ERROR,
};

enum config_log_format {
    CONFIG_LOG_TEXT,
    CONFIG_LOG_JSON,
};

/*
 * The default --retention of succeeded rows, shared with outboxctl
 * (common/retention.h).
 */
#define CONFIG_RETENTION_DEFAULT OUTBOX_RETENTION_DEFAULT

struct relay_config {
    struct sink_options broker; /* --broker and every broker's options (the sink registry) */
    char ignored_options[128];  /* "--exchange --tls-verify": given, but of another broker */
    char *database_url;
    char *databases_file;   /* --databases: a list of databases instead of --database-url */
    int max_db_connections; /* with --databases: the connection budget, one pipeline each */
    char **queues; /* NULL-terminated; NULL means every queue */
    size_t queue_count;
    int batch_size;
    int lease_seconds;
    int concurrency;
    char *metrics_addr; /* "off" disables */
    int metrics_max_queues; /* queues with their own series; 0: no cap */
    bool once;
    bool check;
    bool healthcheck; /* ask a running relay's /healthz, then exit */
    bool help;
    bool version;
    int poll_interval_ms;     /* longest idle wait between claims */
    int broker_connect_timeout_ms; /* connect and handshake, per broker endpoint */
    int broker_io_timeout_ms;      /* longest wait for the broker without progress */
    double retry_base_seconds; /* first retry delay */
    double retry_max_seconds;  /* retry delay cap */
    double retention_seconds;  /* succeeded rows kept this long; 0 keeps forever */
    bool block_on_dead_head;   /* --ordering-dead-policy block */
    bool delete_on_success;    /* --on-success delete */
    int log_level;  /* enum config_log_level */
    int log_format; /* enum config_log_format */
    double horizon_warning_seconds; /* warn when the xmin horizon is older */
    int cloudevents;                /* enum cloudevents_mode (--cloudevents) */
    char *cloudevents_source;       /* --cloudevents-source; NULL: from the database's identity */
    char *otel_endpoint;            /* --otel-endpoint; NULL: the OTEL_* variables decide */
};

/*
 * Fills config from argv (argv[0] is skipped) and the environment.
 * Returns 0, or -1 with OUTBOX_ERR_CONFIG and a one-line message.
 */
int config_parse(struct relay_config *config, int argc, const char *const *argv,
                 struct outbox_error *err);
void config_clear(struct relay_config *config);

/*
 * A sink of this relay (see sink_new): the broker's options from the
 * command line, its connect and I/O timeouts (--broker-connect-timeout,
 * --broker-io-timeout), and how long a row may come back (the lease plus
 * the longest retry delay). NULL with err filled on a bad option.
 */
sink *config_sink_new(const struct relay_config *config, struct outbox_error *err);

/* Writes the options reference (what --help prints). */
void config_usage(FILE *out);

#endif
