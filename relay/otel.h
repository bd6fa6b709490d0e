/*
 * otel.h - OpenTelemetry spans of the relay's publishes, exported over OTLP/HTTP.
 *
 * One span per published message (kind PRODUCER, "publish <destination>"),
 * a child of the row's W3C traceparent when it has one (a row without one
 * starts a trace of its own); the message then carries the relay's span as
 * its traceparent, so that a trace reads producer -> relay -> consumer. Attributes follow the messaging semantic conventions
 * (messaging.system, messaging.destination.name, messaging.message.id,
 * messaging.operation.type) plus the relay's: outbox.queue, outbox.job_id,
 * outbox.ordering_key, outbox.attempt and outbox.wait_seconds, the time the
 * row waited in the table (created_at to the publish). A message the broker
 * did not take ends with status ERROR and its reason.
 *
 * Export never slows or blocks publishing: otel_publish() copies sampled
 * spans into a bounded queue (OTEL_BSP_MAX_QUEUE_SIZE, default 2048) under
 * a short lock and returns; one thread of its own sends them in batches
 * (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, default 512; at least every
 * OTEL_BSP_SCHEDULE_DELAY ms, default 1000) as OTLP/HTTP JSON, each POST
 * bounded by OTEL_EXPORTER_OTLP_TIMEOUT (default 10 s). A full queue drops
 * the span, a failed export drops its batch, both counted in /metrics
 * (outbox_otel_spans_dropped_total); after a failure the thread waits a
 * little longer each time (up to 30 s) before trying again.
 *
 * The exporter is one per process (module state in otel.c, like the log):
 * otel_start() before the pipelines, otel_stop() after them. Without an
 * endpoint every call is a no-op.
 */
#ifndef OUTBOX_RELAY_OTEL_H
#define OUTBOX_RELAY_OTEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "outbox.h"
#include "sink.h"

/* The samplers of OTEL_TRACES_SAMPLER (default parentbased_always_on). */
enum otel_sampler {
    OTEL_SAMPLER_ALWAYS_ON = 0,
    OTEL_SAMPLER_ALWAYS_OFF,
    OTEL_SAMPLER_RATIO,                /* traceidratio: OTEL_TRACES_SAMPLER_ARG of the trace ids */
    OTEL_SAMPLER_PARENT_ALWAYS_ON,     /* a parent's sampled flag, else always on */
    OTEL_SAMPLER_PARENT_ALWAYS_OFF,    /* a parent's sampled flag, else always off */
    OTEL_SAMPLER_PARENT_RATIO,         /* a parent's sampled flag, else the ratio */
};

/* What the exporter reads from --otel-endpoint and the OTEL_* variables. */
struct otel_settings {
    char host[256];
    char port[8];
    char path[512];             /* "/v1/traces" unless the URL names one */
    char url[800];              /* for logs: no secrets in it (userinfo is refused) */
    char service_name[256];
    char *resource_json;        /* the resource's attributes, as OTLP JSON array items */
    enum otel_sampler sampler;
    double ratio;               /* OTEL_TRACES_SAMPLER_ARG, [0, 1] */
    int queue_size;             /* OTEL_BSP_MAX_QUEUE_SIZE */
    int batch_size;             /* OTEL_BSP_MAX_EXPORT_BATCH_SIZE */
    int schedule_delay_ms;      /* OTEL_BSP_SCHEDULE_DELAY */
    int export_timeout_ms;      /* OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT */
};

/*
 * Reads the settings: the endpoint from option (--otel-endpoint; NULL: none),
 * else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as is), else
 * OTEL_EXPORTER_OTLP_ENDPOINT (+ "/v1/traces"); the rest from the OTEL_*
 * variables. *enabled false when there is no endpoint or OTEL_SDK_DISABLED
 * is true. 0, or -1 with OUTBOX_ERR_CONFIG naming the bad option or
 * variable (only http:// endpoints: see docs/observe.md). On 0 the caller
 * frees with otel_settings_clear().
 */
int otel_settings_read(const char *option, struct otel_settings *settings, bool *enabled,
                       struct outbox_error *err);
void otel_settings_clear(struct otel_settings *settings);

/*
 * Starts the export thread (settings are copied); system is
 * messaging.system ("rabbitmq", "redis", "nats", "kafka"), metrics where
 * the counts go. 0, or -1 with err.
 */
int otel_start(const struct otel_settings *settings, const char *system, struct metrics *metrics,
               struct outbox_error *err);

/*
 * Stops the thread after one last export of what is queued, bounded by
 * flush_seconds (what is left then is dropped and counted). A no-op when
 * not started.
 */
void otel_stop(double flush_seconds);

/* How long the relay's exit waits for the last spans to reach the collector. */
#define OTEL_FLUSH_SECONDS 2.0

/* True between otel_start() and otel_stop(). */
bool otel_enabled(void);

/* A pipeline's spans of the batch it publishes: which are sampled, their ids. */
typedef struct otel_batch otel_batch;

otel_batch *otel_batch_new(void); /* NULL when out of memory */
void otel_batch_free(otel_batch *b);

/*
 * Before a publish: decides each message's span (sampled or not, its ids)
 * and, for a sampled one, makes the message's traceparent header the span's
 * (added when the row had none), so a consumer continues the trace from the
 * relay's span: producer -> relay -> consumer. Call before the CloudEvents
 * module reads the headers. A message keeps pointing into b until the next
 * otel_prepare(). 0, or -1 when out of memory (the messages are then as
 * they were). A no-op when not started.
 */
int otel_prepare(otel_batch *b, struct sink_message *messages, size_t count);

/*
 * Records the spans of that publish: messages[i], the prepared batch's
 * message first + i (as otel_prepare() left it), went out between started
 * and finished (wall-clock epoch seconds) with outcomes[i]. Never blocks on
 * the export; a no-op when not started.
 */
void otel_publish(const otel_batch *b, size_t first, const struct sink_message *messages,
                  const struct sink_outcome *outcomes, size_t count, double started,
                  double finished);

/* Wall-clock epoch seconds, as otel_publish() takes them. */
double otel_wall_seconds(void);

/* The messaging.system value of a sink kind ("amqp" -> "rabbitmq"). */
const char *otel_messaging_system(const char *sink_kind);

#endif
