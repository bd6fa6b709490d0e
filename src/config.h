/*
 * config.h - the relay's configuration: command-line options and their
 * OUTBOX_<NAME> environment twins.
 *
 * One table in config.c describes every option (name, environment name,
 * kind, default, help); parsing, defaults, `--help` and the README's
 * reference all come from it. The command line wins over the environment.
 * Every error names the option (or variable) and the bad value, never a
 * password.
 */
#ifndef OUTBOX_CONFIG_H
#define OUTBOX_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "outbox.h"

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
 * The default --retention of succeeded rows; outboxctl status compares
 * with it too (see docs/operating.md, "Retention", for the choice).
 */
#define CONFIG_RETENTION_DEFAULT "1h"

struct relay_config {
    char *database_url;
    char *broker_url;
    char *broker_password_file; /* --broker-password-file */
    char *broker_password;      /* read from it; overrides the URL's; NULL when not given */
    char **queues; /* NULL-terminated; NULL means every queue */
    size_t queue_count;
    char *exchange;
    char *stream_prefix;
    int batch_size;
    int lease_seconds;
    int concurrency;
    char *metrics_addr; /* "off" disables */
    bool once;
    bool check;
    bool help;
    bool version;
    int poll_interval_ms;     /* longest idle wait between claims */
    double retry_base_seconds; /* first retry delay */
    double retry_max_seconds;  /* retry delay cap */
    double retention_seconds;  /* succeeded rows kept this long; 0 keeps forever */
    int64_t dedup_window_ms;   /* Redis: one append per job within this */
    int64_t stream_maxlen;     /* Redis: MAXLEN ~ N, 0 off */
    int redis_wait;            /* Redis: replicas that must acknowledge an append */
    int64_t max_message_bytes; /* larger payloads fail as permanent */
    bool block_on_dead_head;   /* --ordering-dead-policy block */
    bool delete_on_success;    /* --on-success delete */
    bool tls_verify;           /* amqps: verify the broker's certificate */
    int log_level;  /* enum config_log_level */
    int log_format; /* enum config_log_format */
    double horizon_warning_seconds; /* warn when the xmin horizon is older */
};

/*
 * Fills config from argv (argv[0] is skipped) and the environment.
 * Returns 0, or -1 with OUTBOX_ERR_CONFIG and a one-line message.
 */
int config_parse(struct relay_config *config, int argc, const char *const *argv,
                 struct outbox_error *err);
void config_clear(struct relay_config *config);

/* Writes the options reference (what --help prints). */
void config_usage(FILE *out);

#endif
