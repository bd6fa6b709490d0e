/*
 * sink_kafka.c - the Apache Kafka sink: an idempotent librdkafka producer,
 * a row settled by its own delivery report. This file configures and
 * connects the producer, runs --check and holds the ops table and registry
 * row; a batch and its delivery reports are sink_kafka_publish.c's.
 *
 * URLs: kafka://[user:pass@]h1:p1[,h2:p2...] (plaintext) and kafka+ssl://
 * (TLS, peer verified against the system CA bundle or SSL_CERT_FILE). The
 * endpoints are the bootstrap servers, used together: librdkafka finds the
 * partition leaders from them. A user and password (from the URL or
 * --broker-password-file) turn on SASL with --kafka-sasl-mechanism (PLAIN
 * by default, or SCRAM-SHA-256/512).
 *
 * A message becomes one record on topic --topic-prefix + (routing key, else
 * queue): key = the row's ordering key (none: no key, so librdkafka spreads
 * the rows over the partitions), value = the payload, timestamp = created_at,
 * headers = the row's headers (traceparent and tracestate among them when
 * present) plus message-id (the message id, what consumers dedupe on:
 * sink.h), outbox-job-id (the row's job id), outbox-queue and
 * outbox-attempt. Keys are hashed with murmur2 as the Java clients do, so
 * one key lands in the same partition whatever produced it;
 * the relay sends the rows of one key one at a time, so they land in order.
 *
 * The producer is idempotent with acks=all: librdkafka's own retries never
 * duplicate or reorder a record within a partition. publish() hands the
 * whole batch to librdkafka, then serves delivery reports until each message
 * has its own, waiting at most io_timeout_ms without one arriving. A message
 * is SINK_ACCEPTED only from a successful report. By the report's error:
 *
 *   too large (client or broker limit)              SINK_REJECTED: dead at once
 *   unknown topic, invalid record, topic or
 *   cluster authorization, policy violation         SINK_FAILED: that row only
 *   anything else (broker down, no leader, not
 *   enough replicas, timeout, purged)               SINK_DEFERRED: no attempt spent
 *
 * The broker judges a record batch whole: one record over the topic's
 * max.message.bytes gets every record librdkafka batched with it refused as
 * too large. So each message refused so is sent again alone, and is dead
 * only when it is refused alone too.
 *
 * When a message was deferred, the reports did not all come in time, or the
 * producer hit a fatal error (the idempotence state is lost and librdkafka
 * refuses to go on), publish() returns -1 and the producer is destroyed:
 * sink_connect() builds a fresh one, so nothing of an abandoned batch is
 * left queued to surprise the next one.
 *
 * The relay never creates topics (allow.auto.create.topics=false): a missing
 * topic fails its rows with the broker's error and they are retried later.
 * librdkafka waits topic.metadata.propagation.max.ms for a topic it has not
 * seen before deciding it is missing; that wait is kept below the I/O
 * timeout so a missing topic is a failure, not a timeout.
 */
#include "sink_kafka_conn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "clock.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "sink_kafka.h"
#include "timeouts.h"

/* Topics --check lists by name; past this many it counts them. */
#define SINK_KAFKA_CHECK_LISTED 20
/* The first librdkafka whose SCRAM Kafka 4 brokers accept (librdkafka issue 4895). */
#define SINK_KAFKA_SCRAM_FIXED 0x020601ff

static const char *const SASL_MECHANISMS[] = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"};

/* ---- configuration -------------------------------------------------------- */

static int
set_conf(rd_kafka_conf_t *conf, const char *name, const char *value, struct outbox_error *err)
{
    char errstr[SINK_KAFKA_ERRSTR_MAX];

    if (rd_kafka_conf_set(conf, name, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "kafka setting %s: %s", name, errstr);
    return 0;
}

static int
set_conf_int(rd_kafka_conf_t *conf, const char *name, long long value, struct outbox_error *err)
{
    char text[32];

    snprintf(text, sizeof(text), "%lld", value);
    return set_conf(conf, name, text, err);
}

/* "h1:p1,h2:p2" from the URL's endpoints, into a malloc'd string. */
static char *
bootstrap_servers(const sink *s)
{
    size_t size = 1;
    char *out;

    for (size_t i = 0; i < s->url.endpoint_count; i++)
        size += strlen(s->endpoint_names[i]) + 1;
    out = malloc(size);
    if (out == NULL)
        return NULL;
    out[0] = '\0';
    for (size_t i = 0; i < s->url.endpoint_count; i++) {
        if (i > 0)
            strcat(out, ",");
        strcat(out, s->endpoint_names[i]);
    }
    return out;
}

/* Security: TLS by the scheme, SASL when the URL or password file gives credentials. */
static int
set_security(const sink *s, rd_kafka_conf_t *conf, struct outbox_error *err)
{
    bool tls = s->url.scheme->tls;
    bool sasl = s->url.user != NULL && s->url.user[0] != '\0';
    const char *ca_file = getenv("SSL_CERT_FILE");
    int mechanism = ((const struct sink_kafka *)s->impl)->sasl_mechanism;

    if (set_conf(conf, "security.protocol",
                 sasl ? (tls ? "SASL_SSL" : "SASL_PLAINTEXT") : (tls ? "SSL" : "PLAINTEXT"),
                 err) != 0)
        return -1;
    if (tls && ca_file != NULL && ca_file[0] != '\0' &&
        set_conf(conf, "ssl.ca.location", ca_file, err) != 0)
        return -1;
    if (!sasl)
        return 0;
    if (set_conf(conf, "sasl.mechanisms", SASL_MECHANISMS[mechanism], err) != 0 ||
        set_conf(conf, "sasl.username", s->url.user, err) != 0 ||
        set_conf(conf, "sasl.password", s->url.password != NULL ? s->url.password : "", err) != 0)
        return -1;
    return 0;
}

/* librdkafka's own log lines (errors only, see log_level) join the relay's log, rate-limited. */
static void
on_log(const rd_kafka_t *producer, int level, const char *facility, const char *text)
{
    (void)producer;
    (void)level;
    log_event_limited("kafka client", OUTBOX_LOG_WARN, "kafka client", "facility=%s reason=\"%s\"",
                      facility, text);
}

/* The producer's whole configuration; conf is destroyed by the caller on failure. */
static int
configure(sink *s, rd_kafka_conf_t *conf, struct outbox_error *err)
{
    const struct sink_options *o = &s->options;
    char *servers = bootstrap_servers(s);
    /* a missing topic must be found missing before the batch times out */
    long long propagation = o->io_timeout_ms / 4 > SINK_KAFKA_PROPAGATION_MAX_MS
                                ? SINK_KAFKA_PROPAGATION_MAX_MS
                                : o->io_timeout_ms / 4;
    int rc = -1;

    if (servers == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (set_conf(conf, "bootstrap.servers", servers, err) != 0 ||
        set_conf(conf, "client.id", "outbox-relay", err) != 0 ||
        set_conf(conf, "enable.idempotence", "true", err) != 0 ||
        set_conf(conf, "acks", "all", err) != 0 ||
        set_conf(conf, "allow.auto.create.topics", "false", err) != 0 ||
        set_conf(conf, "partitioner", "murmur2_random", err) != 0 ||
        set_conf(conf, "linger.ms", TIMEOUT_TEXT(SINK_KAFKA_LINGER_MS), err) != 0 ||
        /* a batch waits for its reports: Nagle would hold the last request back */
        set_conf(conf, "socket.nagle.disable", "true", err) != 0 ||
        set_conf_int(conf, "topic.metadata.propagation.max.ms", propagation, err) != 0 ||
        set_conf_int(conf, "socket.connection.setup.timeout.ms",
                     o->connect_timeout_ms < 1000 ? 1000 : o->connect_timeout_ms, err) != 0 ||
        set_conf_int(conf, "message.timeout.ms", 2LL * o->io_timeout_ms, err) != 0 ||
        set_conf_int(conf, "request.timeout.ms", o->io_timeout_ms, err) != 0 ||
        set_conf(conf, "log_level", "3", err) != 0 || set_security(s, conf, err) != 0)
        goto cleanup;
    rd_kafka_conf_set_dr_msg_cb(conf, sink_kafka_on_delivery);
    rd_kafka_conf_set_error_cb(conf, sink_kafka_on_error);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_opaque(conf, s);
    rc = 0;

cleanup:
    free(servers);
    return rc;
}

/* ---- connection --------------------------------------------------------------- */

/*
 * SASL needs both a user and a password: one without the other is a
 * configuration error here, not a login that times out (a password alone)
 * or librdkafka's refusal at connect (a user alone).
 */
static int
check_credentials(const sink *s, struct outbox_error *err)
{
    bool user = s->url.user != NULL && s->url.user[0] != '\0';
    bool password = s->url.password != NULL && s->url.password[0] != '\0';
    char quoted[128];

    if (user && !password)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--broker: kafka user '%s' has no password (give it in the URL or"
                                " with --broker-password-file)",
                                outbox_error_quote(quoted, sizeof(quoted), s->url.user));
    if (password && !user)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--broker: a kafka password needs a user (kafka://user:pass@host)");
    return 0;
}

static int
sink_kafka_init(sink *s, const void *options, struct outbox_error *err)
{
    const struct sink_kafka_config *config = options;
    struct sink_kafka *k = calloc(1, sizeof(*k));
    rd_kafka_conf_t *conf;
    int rc;

    if (k == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->impl = k;
    k->sasl_mechanism = config->sasl_mechanism;
    /* the row refuses other names; a configuration built by hand may still hold anything */
    if (k->sasl_mechanism < 0 ||
        k->sasl_mechanism >= (int)(sizeof(SASL_MECHANISMS) / sizeof(SASL_MECHANISMS[0])))
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "kafka sasl mechanism %d is unknown",
                                k->sasl_mechanism);
    k->topic_prefix = strdup(config->topic_prefix != NULL ? config->topic_prefix : "");
    if (k->topic_prefix == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (check_credentials(s, err) != 0)
        return -1;
    /* every setting is checked here, before any connection */
    conf = rd_kafka_conf_new();
    if (conf == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    rc = configure(s, conf, err);
    rd_kafka_conf_destroy(conf);
    return rc;
}

/* The error a failed metadata request stands for: a refused login is configuration. */
static int
connect_error(sink *s, rd_kafka_resp_err_t code, struct outbox_error *err)
{
    struct sink_kafka *k = s->impl;

    /* librdkafka before 2.6.1 sends a SCRAM proof that Kafka 4 brokers refuse, as a bad password */
    bool old_scram = k->sasl_mechanism != 0 && rd_kafka_version() < SINK_KAFKA_SCRAM_FIXED;

    rd_kafka_poll(k->producer, 0); /* collects the error callbacks */
    if (k->last_error == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
        k->last_error == RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "kafka %s refused the login%s%s%s: %s",
                                s->display_url,
                                old_scram ? " (a wrong password, or the SCRAM of librdkafka " : "",
                                old_scram ? rd_kafka_version_str() : "",
                                old_scram ? ", which Kafka 4 brokers refuse: fixed in librdkafka"
                                            " 2.6.1; PLAIN is not affected)"
                                          : "",
                                k->last_reason);
    /* an untrusted certificate comes as _SSL, or as _TRANSPORT when the handshake's read
     * fails first (seen under valgrind's pace): either way no retry mends it */
    if (k->last_error == RD_KAFKA_RESP_ERR__SSL ||
        strstr(k->last_reason, "certificate verify failed") != NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "kafka %s: tls: %s", s->display_url,
                                k->last_reason);
    return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "kafka %s unreachable: %s%s%s",
                            s->display_url, rd_kafka_err2str(code),
                            k->last_reason[0] != '\0' ? ": " : "", k->last_reason);
}

/* Builds the producer and reads the cluster's metadata once: a dead cluster is seen here. */
static int
sink_kafka_connect(sink *s, struct outbox_error *err)
{
    struct sink_kafka *k = s->impl;
    char errstr[SINK_KAFKA_ERRSTR_MAX];
    const struct rd_kafka_metadata *metadata = NULL;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_resp_err_t code;

    if (conf == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (configure(s, conf, err) != 0) {
        rd_kafka_conf_destroy(conf);
        return -1;
    }
    k->last_error = RD_KAFKA_RESP_ERR_NO_ERROR;
    k->last_reason[0] = '\0';
    k->producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (k->producer == NULL) {
        rd_kafka_conf_destroy(conf);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "kafka producer: %s", errstr);
    }
    code = rd_kafka_metadata(k->producer, 0, NULL, &metadata, s->options.connect_timeout_ms);
    if (code != RD_KAFKA_RESP_ERR_NO_ERROR) {
        connect_error(s, code, err);
        sink_kafka_destroy_producer(k);
        return -1;
    }
    rd_kafka_metadata_destroy(metadata);
    s->connected = true;
    return 0;
}

static void
sink_kafka_destroy(sink *s)
{
    struct sink_kafka *k = s->impl;

    sink_kafka_destroy_producer(k);
    free(k->topic_prefix);
    free(k->settled);
    free(k->too_large);
    free(k);
    s->impl = NULL;
}

/* ---- --check ---------------------------------------------------------------------- */

/* Reads the cluster's topics and says which carry the topic prefix (all, without one). */
static int
sink_kafka_check(sink *s, struct outbox_error *err)
{
    struct sink_kafka *k = s->impl;
    const struct rd_kafka_metadata *metadata = NULL;
    rd_kafka_resp_err_t code;
    size_t prefix_len = strlen(k->topic_prefix), found = 0, used = 0;
    char names[2048] = "";

    code = rd_kafka_metadata(k->producer, 1, NULL, &metadata, s->options.io_timeout_ms);
    if (code != RD_KAFKA_RESP_ERR_NO_ERROR)
        return connect_error(s, code, err);
    for (int i = 0; i < metadata->topic_cnt; i++) {
        const char *name = metadata->topics[i].topic;

        if (strncmp(name, "__", 2) == 0 || strncmp(name, k->topic_prefix, prefix_len) != 0 ||
            metadata->topics[i].err != RD_KAFKA_RESP_ERR_NO_ERROR)
            continue;
        if (found++ < SINK_KAFKA_CHECK_LISTED && used < sizeof(names))
            used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
                                     used > 0 ? "," : "", name);
    }
    log_event(OUTBOX_LOG_INFO, "kafka topics",
              "brokers=%d prefix=\"%s\" topics=%zu names=\"%s%s\"", metadata->broker_cnt,
              k->topic_prefix, found, names, found > SINK_KAFKA_CHECK_LISTED ? ",..." : "");
    rd_kafka_metadata_destroy(metadata);
    if (found == 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "kafka %s has no topic%s%s%s: the relay never creates topics",
                                s->display_url, prefix_len > 0 ? " starting with \"" : "",
                                k->topic_prefix, prefix_len > 0 ? "\"" : "");
    return 0;
}

static const struct sink_ops sink_kafka_ops = {
    .init = sink_kafka_init,
    .connect = sink_kafka_connect,
    .publish = sink_kafka_publish,
    .idle = sink_kafka_idle,
    .check = sink_kafka_check,
    .disconnect = sink_kafka_disconnect,
    .destroy = sink_kafka_destroy,
    .endpoint_alternatives = false, /* bootstrap servers: librdkafka uses them together */
};

/* ---- registry row --------------------------------------------------------- */

static const struct url_scheme sink_kafka_scheme = {
    .name = "kafka",
    .default_port = 9092,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .usage = "kafka://[user:pass@]h1:p1[,h2:p2...]",
};

static const struct url_scheme sink_kafka_ssl_scheme = {
    .name = "kafka+ssl",
    .default_port = 9093,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .usage = "kafka+ssl://...",
    .tls = true,
};

static const struct url_scheme *const sink_kafka_schemes[] = {&sink_kafka_scheme,
                                                              &sink_kafka_ssl_scheme, NULL};

static const struct option_spec sink_kafka_options[] = {
    {"topic-prefix", "P", OPTION_STRING, OPTION_FIELD(struct sink_kafka_config, topic_prefix), "", 0, 0,
     NULL,
     "Kafka topic = P + the row's routing key, else its queue (the relay never creates topics)",
     OPTION_FROM_ENVIRONMENT, 200},
    {"kafka-sasl-mechanism", "M", OPTION_CHOICE,
     OPTION_FIELD(struct sink_kafka_config, sasl_mechanism), "plain", 0, 0,
     "plain|scram-sha-256|scram-sha-512",
     "Kafka: the SASL mechanism when the URL or --broker-password-file gives a password",
     OPTION_FROM_ENVIRONMENT, 0},
};

const struct sink_type sink_kafka_type = {
    .kind = "kafka",
    .product = "Kafka",
    .schemes = sink_kafka_schemes,
    .cloudevents_prefix = "ce_", /* the Kafka binding */
    .options = sink_kafka_options,
    .option_count = sizeof(sink_kafka_options) / sizeof(sink_kafka_options[0]),
    /* the rows' defaults are zero ("", plain): no config_defaults */
    .config_size = sizeof(struct sink_kafka_config),
    .ops = &sink_kafka_ops,
};
