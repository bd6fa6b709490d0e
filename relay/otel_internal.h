/*
 * otel_internal.h - what otel.c (settings, sampling, the span queue) and
 * otel_export.c (the export thread: OTLP/JSON over HTTP) share. Only those
 * two include it.
 */
#ifndef OUTBOX_RELAY_OTEL_INTERNAL_H
#define OUTBOX_RELAY_OTEL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "buffer.h"
#include "otel.h"

/* Longest text kept of each string attribute (longer ones are cut). */
#define OTEL_TEXT_MAX 256

/* One finished span, copied in whole into the queue. */
struct otel_span {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t parent_id[8];
    bool has_parent;
    bool failed;     /* status ERROR with reason */
    int32_t attempt;
    int64_t job_id;
    int64_t start_ns, end_ns;
    double wait_seconds; /* created_at to the publish; < 0: unknown */
    char message_id[SINK_MESSAGE_ID_MAX];
    char destination[OTEL_TEXT_MAX];
    char queue[OTEL_TEXT_MAX];
    char ordering_key[OTEL_TEXT_MAX]; /* "": none */
    char tracestate[OTEL_TEXT_MAX];
    char reason[SINK_REASON_MAX];
};

/* The process's exporter: settings, the bounded queue and the thread. */
struct otel_state {
    struct otel_settings settings;
    const char *system;
    struct metrics *metrics;
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* the thread: a batch is full, or stop */
    struct otel_span *ring;   /* settings.queue_size slots */
    size_t head, count;       /* under lock */
    bool stopping;            /* under lock */
    double flush_deadline;    /* monotonic seconds: the last export's end, once stopping */
    pthread_t thread;
    atomic_bool running;
};

/* The export thread's body (otel_export.c); arg is the struct otel_state. */
void *otel_export_main(void *arg);

/* Appends spans[0..count) as one OTLP/JSON ExportTraceServiceRequest to out. */
void otel_encode(const struct otel_state *state, const struct otel_span *spans, size_t count,
                 struct buffer *out);

/*
 * POSTs body to the settings' endpoint as application/json, waiting at most
 * until deadline (monotonic seconds). 0 on a 2xx answer, else -1 with why
 * (lowercase, no secrets) in reason.
 */
int otel_http_post(const struct otel_settings *settings, const char *body, size_t length,
                   double deadline, char *reason, size_t reason_size);

#endif
