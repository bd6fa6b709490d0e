/*
 * otel.c - the relay's OpenTelemetry spans: settings, sampling and the
 * bounded span queue (see otel.h); the export thread is otel_export.c.
 */
#include "otel.h"
#include "otel_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "json.h"
#include "log.h"

/* The process's exporter; NULL when spans are off. */
static struct otel_state *exporter;

/* Each thread's span and trace ids: xorshift128+ seeded from the kernel. */
static _Thread_local uint64_t random_state[2];

/* ---- settings ------------------------------------------------------------ */

/* A variable's value, NULL when unset or empty. */
static const char *
variable(const char *name)
{
    const char *value = getenv(name);

    return value != NULL && value[0] != '\0' ? value : NULL;
}

/*
 * What an endpoint URL names: the traces' own URL (--otel-endpoint,
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), or a base (OTEL_EXPORTER_OTLP_ENDPOINT).
 */
enum endpoint_kind { ENDPOINT_TRACES, ENDPOINT_BASE };

/*
 * Reads an http:// URL into settings. A base has "/v1/traces" after its
 * path; a traces URL without a path gets "/v1/traces" and one with a path
 * is used as is.
 */
static int
read_endpoint(const char *url, enum endpoint_kind kind, const char *source, struct otel_settings *s,
              struct outbox_error *err)
{
    const char *authority = url + 7, *path, *port;
    size_t host_len;

    if (strncasecmp(url, "https://", 8) == 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s: https is not supported: export over http to a collector"
                                " beside the relay (an agent or a sidecar)", source);
    if (strncasecmp(url, "http://", 7) != 0 || strlen(url) >= sizeof(s->url))
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: expected http://host[:port][/path]",
                                source);
    path = authority + strcspn(authority, "/?#");
    if (memchr(authority, '@', (size_t)(path - authority)) != NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s: credentials in the URL are not supported", source);
    port = authority[0] == '[' ? memchr(authority, ']', (size_t)(path - authority)) : authority;
    port = port != NULL ? memchr(port, ':', (size_t)(path - port)) : NULL;
    host_len = (size_t)((port != NULL ? port : path) - authority);
    if (authority[0] == '[' && host_len >= 2) {
        authority++;
        host_len -= 2;
    }
    if (host_len == 0 || host_len >= sizeof(s->host) ||
        (port != NULL && (path - port < 2 || path - port > 6)))
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: expected http://host[:port][/path]",
                                source);
    memcpy(s->host, authority, host_len);
    s->host[host_len] = '\0';
    snprintf(s->port, sizeof(s->port), "%.*s", port != NULL ? (int)(path - port - 1) : 4,
             port != NULL ? port + 1 : "4318");
    if (kind == ENDPOINT_BASE)
        snprintf(s->path, sizeof(s->path), "%.*s/v1/traces",
                 (int)(strlen(path) - (path[0] != '\0' && path[strlen(path) - 1] == '/')), path);
    else
        snprintf(s->path, sizeof(s->path), "%s", path[0] == '\0' || strcmp(path, "/") == 0
                                                     ? "/v1/traces" : path);
    snprintf(s->url, sizeof(s->url), "%s", url);
    return 0;
}

/* An integer variable in [min, max], or fallback when unset. */
static int
read_number(const char *name, int fallback, int min, int max, int *out, struct outbox_error *err)
{
    const char *text = variable(name);
    char *end;
    long value;

    *out = fallback;
    if (text == NULL)
        return 0;
    errno = 0;
    value = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || value < min || value > max)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: expected a whole number from %d to %d",
                                name, min, max);
    *out = (int)value;
    return 0;
}

/* OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG. */
static int
read_sampler(struct otel_settings *s, struct outbox_error *err)
{
    static const char *const names[] = {"always_on", "always_off", "traceidratio",
                                        "parentbased_always_on", "parentbased_always_off",
                                        "parentbased_traceidratio"};
    const char *name = variable("OTEL_TRACES_SAMPLER"), *arg = variable("OTEL_TRACES_SAMPLER_ARG");
    char *end;

    s->sampler = OTEL_SAMPLER_PARENT_ALWAYS_ON;
    s->ratio = 1.0;
    for (size_t i = 0; name != NULL && i <= sizeof(names) / sizeof(names[0]); i++) {
        if (i == sizeof(names) / sizeof(names[0]))
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "OTEL_TRACES_SAMPLER: expected always_on, always_off,"
                                    " traceidratio or parentbased_ of those");
        if (strcmp(name, names[i]) == 0) {
            s->sampler = (enum otel_sampler)i;
            break;
        }
    }
    if (arg != NULL && (s->sampler == OTEL_SAMPLER_RATIO ||
                        s->sampler == OTEL_SAMPLER_PARENT_RATIO)) {
        errno = 0;
        s->ratio = strtod(arg, &end);
        if (errno != 0 || *end != '\0' || !(s->ratio >= 0.0 && s->ratio <= 1.0))
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "OTEL_TRACES_SAMPLER_ARG: expected a ratio from 0 to 1");
    }
    return 0;
}

/* Decodes %XX escapes of text[0..length) into out (a NUL-terminated copy). */
static void
percent_decode(const char *text, size_t length, char *out, size_t size)
{
    size_t n = 0;

    for (size_t i = 0; i < length && n + 1 < size; i++) {
        if (text[i] == '%' && i + 2 < length && isxdigit((unsigned char)text[i + 1]) &&
            isxdigit((unsigned char)text[i + 2])) {
            char hex[3] = {text[i + 1], text[i + 2], '\0'};

            out[n++] = (char)strtol(hex, NULL, 16);
            i += 2;
        } else {
            out[n++] = text[i];
        }
    }
    out[n] = '\0';
}

/* Appends one string attribute, as an item of an OTLP attributes array. */
static void
put_attribute(struct buffer *out, const char *key, const char *value)
{
    if (out->len > 0)
        buffer_putc(out, ',');
    buffer_puts(out, "{\"key\":");
    json_put_text(out, key, 0);
    buffer_puts(out, ",\"value\":{\"stringValue\":");
    json_put_text(out, value, 0);
    buffer_puts(out, "}}");
}

/*
 * The resource: service.name (OTEL_SERVICE_NAME, else one in
 * OTEL_RESOURCE_ATTRIBUTES, else "outbox-relay"), the SDK's name and
 * version, and every key=value of OTEL_RESOURCE_ATTRIBUTES.
 */
static int
read_resource(struct otel_settings *s, struct outbox_error *err)
{
    const char *name = variable("OTEL_SERVICE_NAME"), *list = variable("OTEL_RESOURCE_ATTRIBUTES");
    struct buffer out = {0};
    char key[256], value[1024];

    snprintf(s->service_name, sizeof(s->service_name), "%s", name ? name : "outbox-relay");
    for (const char *at = list; at != NULL && *at != '\0';) {
        size_t length = strcspn(at, ","), key_length = strcspn(at, "=");

        if (key_length >= length || key_length == 0 || key_length >= sizeof(key)) {
            buffer_clear(&out);
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "OTEL_RESOURCE_ATTRIBUTES: expected key=value,key=value");
        }
        percent_decode(at, key_length, key, sizeof(key));
        percent_decode(at + key_length + 1, length - key_length - 1, value, sizeof(value));
        if (strcmp(key, "service.name") != 0)
            put_attribute(&out, key, value);
        else if (name == NULL)
            snprintf(s->service_name, sizeof(s->service_name), "%.255s", value);
        at += length + (at[length] == ',');
    }
    put_attribute(&out, "service.name", s->service_name);
    put_attribute(&out, "service.version", OUTBOX_VERSION);
    put_attribute(&out, "telemetry.sdk.name", "outbox-relay");
    put_attribute(&out, "telemetry.sdk.language", "c");
    if (out.failed) {
        buffer_clear(&out);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    s->resource_json = out.data;
    return 0;
}

int
otel_settings_read(const char *option, struct otel_settings *s, bool *enabled,
                   struct outbox_error *err)
{
    const char *traces = variable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    const char *base = variable("OTEL_EXPORTER_OTLP_ENDPOINT"), *disabled = variable("OTEL_SDK_DISABLED");
    int timeout, rc;

    memset(s, 0, sizeof(*s));
    *enabled = false;
    if (option != NULL && option[0] != '\0')
        rc = read_endpoint(option, ENDPOINT_TRACES, "--otel-endpoint", s, err);
    else if (traces != NULL)
        rc = read_endpoint(traces, ENDPOINT_TRACES, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", s, err);
    else if (base != NULL)
        rc = read_endpoint(base, ENDPOINT_BASE, "OTEL_EXPORTER_OTLP_ENDPOINT", s, err);
    else
        return 0;
    if (rc != 0 || read_sampler(s, err) != 0 ||
        read_number("OTEL_BSP_MAX_QUEUE_SIZE", 2048, 1, 1000000, &s->queue_size, err) != 0 ||
        read_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, 1, 100000, &s->batch_size, err) != 0 ||
        read_number("OTEL_BSP_SCHEDULE_DELAY", 1000, 1, 3600000, &s->schedule_delay_ms, err) != 0 ||
        read_number("OTEL_EXPORTER_OTLP_TIMEOUT", 10000, 1, 3600000, &timeout, err) != 0 ||
        read_number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", timeout, 1, 3600000,
                    &s->export_timeout_ms, err) != 0 ||
        read_resource(s, err) != 0) {
        otel_settings_clear(s);
        return -1;
    }
    if (s->batch_size > s->queue_size)
        s->batch_size = s->queue_size;
    *enabled = disabled == NULL || strcasecmp(disabled, "true") != 0;
    return 0;
}

void
otel_settings_clear(struct otel_settings *s)
{
    if (s == NULL)
        return;
    free(s->resource_json);
    s->resource_json = NULL;
}

double
otel_wall_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *
otel_messaging_system(const char *sink_kind)
{
    return sink_kind != NULL && strcmp(sink_kind, "amqp") == 0 ? "rabbitmq" : sink_kind;
}

/* ---- ids, trace context and sampling ------------------------------------- */

static uint64_t
next_random(void)
{
    uint64_t a = random_state[0], b = random_state[1];

    if (a == 0 && b == 0) {
        if (getrandom(random_state, sizeof(random_state), 0) != (ssize_t)sizeof(random_state)) {
            random_state[0] = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&a;
            random_state[1] = (uint64_t)clock() * 0x9e3779b97f4a7c15u + 1;
        }
        a = random_state[0] | 1;
        b = random_state[1];
    }
    random_state[0] = b;
    a ^= a << 23;
    random_state[1] = a ^ b ^ (a >> 17) ^ (b >> 26);
    return random_state[1] + b;
}

/* Fills out[0..size) with random bytes, never all zero (an invalid id). */
static void
random_id(uint8_t *out, size_t size)
{
    for (size_t i = 0; i < size; i += 8) {
        uint64_t r = next_random();

        memcpy(out + i, &r, size - i < 8 ? size - i : 8);
    }
    out[0] |= out[0] == 0 ? 1 : 0;
}

/* Reads 2 * size hex digits into out; false on anything else. */
static bool
read_hex(const char *text, uint8_t *out, size_t size)
{
    bool zero = true;

    for (size_t i = 0; i < size; i++) {
        char pair[3] = {text[2 * i], text[2 * i + 1], '\0'};

        if (!isxdigit((unsigned char)pair[0]) || !isxdigit((unsigned char)pair[1]) ||
            isupper((unsigned char)pair[0]) || isupper((unsigned char)pair[1]))
            return false;
        out[i] = (uint8_t)strtol(pair, NULL, 16);
        zero = zero && out[i] == 0;
    }
    return !zero;
}

/*
 * The string value of header key in a row's headers (a JSON object of
 * strings, as PostgreSQL writes it) into out, or false. Trace context
 * values hold no character JSON escapes, so the text is taken as it is; a
 * value with an escape is no valid one and reads as absent.
 */
static bool
header_value(const char *headers, const char *key, char *out, size_t size)
{
    char pattern[32];
    const char *at, *end;

    if (headers == NULL)
        return false;
    snprintf(pattern, sizeof(pattern), "\"%s\"", key);
    at = strstr(headers, pattern);
    if (at == NULL)
        return false;
    at += strlen(pattern);
    while (*at == ' ' || *at == ':')
        at++;
    if (*at++ != '"')
        return false;
    end = strchr(at, '"');
    if (end == NULL || (size_t)(end - at) >= size || memchr(at, '\\', (size_t)(end - at)) != NULL)
        return false;
    memcpy(out, at, (size_t)(end - at));
    out[end - at] = '\0';
    return true;
}

/* The row's traceparent ("00-<trace>-<span>-<flags>"): true with the parent in span. */
static bool
read_parent(const char *headers, struct otel_span *span, bool *parent_sampled)
{
    char text[64];
    uint8_t flags;

    if (!header_value(headers, "traceparent", text, sizeof(text)) || strlen(text) != 55 ||
        strncmp(text, "00-", 3) != 0 || text[35] != '-' || text[52] != '-' ||
        !read_hex(text + 3, span->trace_id, 16) || !read_hex(text + 36, span->parent_id, 8))
        return false;
    flags = (uint8_t)strtol(text + 53, NULL, 16);
    *parent_sampled = (flags & 1) != 0;
    return true;
}

/* The ratio sampler: the trace id's last 8 bytes below ratio of their range. */
static bool
ratio_sampled(double ratio, const uint8_t *trace_id)
{
    uint64_t value = 0;

    for (size_t i = 8; i < 16; i++)
        value = value << 8 | trace_id[i];
    return (double)(value >> 11) < ratio * (double)(UINT64_C(1) << 53);
}

/* Whether the span is recorded, by the sampler of settings. */
static bool
sampled(const struct otel_settings *s, const struct otel_span *span, bool parent_sampled)
{
    switch (s->sampler) {
    case OTEL_SAMPLER_ALWAYS_ON:
        return true;
    case OTEL_SAMPLER_ALWAYS_OFF:
        return false;
    case OTEL_SAMPLER_RATIO:
        return ratio_sampled(s->ratio, span->trace_id);
    case OTEL_SAMPLER_PARENT_ALWAYS_ON:
        return span->has_parent ? parent_sampled : true;
    case OTEL_SAMPLER_PARENT_ALWAYS_OFF:
        return span->has_parent ? parent_sampled : false;
    case OTEL_SAMPLER_PARENT_RATIO:
        return span->has_parent ? parent_sampled : ratio_sampled(s->ratio, span->trace_id);
    }
    return false;
}

/* ---- a batch's spans ----------------------------------------------------- */

/* One message's span as decided before its publish. */
struct otel_decision {
    bool sampled;
    bool has_parent;
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t parent_id[8];
};

struct otel_batch {
    struct otel_decision *decisions;
    struct buffer *headers; /* each message's headers with the span's traceparent */
    size_t capacity;
};

otel_batch *
otel_batch_new(void)
{
    return calloc(1, sizeof(struct otel_batch));
}

void
otel_batch_free(otel_batch *b)
{
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->capacity; i++)
        buffer_clear(&b->headers[i]);
    free(b->headers);
    free(b->decisions);
    free(b);
}

/* Room for count messages; -1 when out of memory. */
static int
batch_reserve(otel_batch *b, size_t count)
{
    struct otel_decision *decisions;
    struct buffer *headers;

    if (count <= b->capacity)
        return 0;
    decisions = realloc(b->decisions, count * sizeof(*decisions));
    if (decisions == NULL)
        return -1;
    b->decisions = decisions;
    headers = realloc(b->headers, count * sizeof(*headers));
    if (headers == NULL)
        return -1;
    memset(headers + b->capacity, 0, (count - b->capacity) * sizeof(*headers));
    b->headers = headers;
    b->capacity = count;
    return 0;
}

/*
 * headers (a JSON object of strings, as PostgreSQL writes it) with the
 * value of "traceparent" replaced by, or the member added as, traceparent;
 * into out. false when the text is no object.
 */
static bool
with_traceparent(const char *headers, const char *traceparent, struct buffer *out)
{
    const char *text = headers != NULL ? headers : "{}", *at = strstr(text, "\"traceparent\"");
    const char *value = NULL, *end = NULL;

    out->len = 0;
    out->failed = false;
    if (at != NULL) {
        value = at + strlen("\"traceparent\"");
        while (*value == ' ' || *value == ':')
            value++;
        end = *value == '"' ? strchr(value + 1, '"') : NULL;
    }
    if (end != NULL) { /* "traceparent": "<old>" -> "traceparent": "<new>" */
        buffer_append(out, text, (size_t)(value + 1 - text));
        buffer_puts(out, traceparent);
        buffer_puts(out, end);
    } else {
        const char *rest = strchr(text, '{');

        if (rest == NULL)
            return false;
        rest++;
        while (*rest == ' ')
            rest++;
        buffer_printf(out, "{\"traceparent\": \"%s\"%s", traceparent, *rest == '}' ? "" : ", ");
        buffer_puts(out, rest);
    }
    return !out->failed;
}

/* The W3C traceparent of a sampled span: version 00, its ids, sampled. */
static void
format_traceparent(const struct otel_decision *d, char out[56])
{
    static const char digits[] = "0123456789abcdef";
    char *at = out + 3;

    memcpy(out, "00-", 3);
    for (size_t i = 0; i < 16; i++, at += 2) {
        at[0] = digits[d->trace_id[i] >> 4];
        at[1] = digits[d->trace_id[i] & 15];
    }
    *at++ = '-';
    for (size_t i = 0; i < 8; i++, at += 2) {
        at[0] = digits[d->span_id[i] >> 4];
        at[1] = digits[d->span_id[i] & 15];
    }
    memcpy(at, "-01", 4);
}

int
otel_prepare(otel_batch *b, struct sink_message *messages, size_t count)
{
    struct otel_state *st = exporter;

    if (st == NULL || b == NULL || count == 0)
        return 0;
    if (batch_reserve(b, count) != 0)
        return -1;
    for (size_t i = 0; i < count; i++) {
        struct otel_decision *d = &b->decisions[i];
        struct otel_span head = {.has_parent = false};
        bool parent_sampled = false;
        char traceparent[56];

        head.has_parent = read_parent(messages[i].headers, &head, &parent_sampled);
        if (!head.has_parent)
            random_id(head.trace_id, sizeof(head.trace_id));
        d->has_parent = head.has_parent;
        d->sampled = sampled(&st->settings, &head, parent_sampled);
        memcpy(d->trace_id, head.trace_id, sizeof(d->trace_id));
        memcpy(d->parent_id, head.parent_id, sizeof(d->parent_id));
        random_id(d->span_id, sizeof(d->span_id));
        if (!d->sampled)
            continue; /* the row's own context goes on, as an unrecorded span leaves it */
        format_traceparent(d, traceparent);
        if (with_traceparent(messages[i].headers, traceparent, &b->headers[i]))
            messages[i].headers = b->headers[i].data;
    }
    return 0;
}

/* ---- recording ----------------------------------------------------------- */

/* Fills span from its decision, message m and its outcome. */
static void
fill_span(struct otel_span *span, const struct otel_decision *d, const struct sink_message *m,
          const struct sink_outcome *outcome, double started, double finished)
{
    const char *destination = m->routing_key != NULL ? m->routing_key : m->queue;

    memcpy(span->trace_id, d->trace_id, sizeof(span->trace_id));
    memcpy(span->span_id, d->span_id, sizeof(span->span_id));
    memcpy(span->parent_id, d->parent_id, sizeof(span->parent_id));
    span->has_parent = d->has_parent;
    span->failed = outcome->status != SINK_ACCEPTED;
    span->attempt = m->attempt;
    span->job_id = m->job_id;
    span->start_ns = (int64_t)(started * 1e9);
    span->end_ns = (int64_t)(finished * 1e9);
    span->wait_seconds = m->created_at > 0 ? started - m->created_at : -1;
    snprintf(span->message_id, sizeof(span->message_id), "%s", m->message_id);
    snprintf(span->destination, sizeof(span->destination), "%s", destination);
    snprintf(span->queue, sizeof(span->queue), "%s", m->queue);
    snprintf(span->ordering_key, sizeof(span->ordering_key), "%s",
             m->ordering_key != NULL ? m->ordering_key : "");
    if (!span->has_parent ||
        !header_value(m->headers, "tracestate", span->tracestate, sizeof(span->tracestate)))
        span->tracestate[0] = '\0';
    snprintf(span->reason, sizeof(span->reason), "%s", span->failed ? outcome->reason : "");
}

void
otel_publish(const otel_batch *b, size_t first, const struct sink_message *messages,
             const struct sink_outcome *outcomes, size_t count, double started, double finished)
{
    struct otel_state *st = exporter;
    size_t dropped = 0;

    if (st == NULL || b == NULL || count == 0 || b->capacity < first + count)
        return;
    pthread_mutex_lock(&st->lock);
    for (size_t i = 0; i < count; i++) {
        if (!b->decisions[first + i].sampled)
            continue;
        if (st->count == (size_t)st->settings.queue_size) {
            dropped++;
            continue;
        }
        fill_span(&st->ring[(st->head + st->count++) % (size_t)st->settings.queue_size],
                  &b->decisions[first + i], &messages[i], &outcomes[i], started, finished);
    }
    if (st->count >= (size_t)st->settings.batch_size)
        pthread_cond_signal(&st->wake);
    pthread_mutex_unlock(&st->lock);
    if (dropped > 0)
        metrics_add(st->metrics, METRICS_SPANS_DROPPED, dropped);
}

/* ---- start and stop ------------------------------------------------------ */

int
otel_start(const struct otel_settings *settings, const char *system, struct metrics *metrics,
           struct outbox_error *err)
{
    struct otel_state *st = calloc(1, sizeof(*st));

    if (st == NULL || (st->ring = calloc((size_t)settings->queue_size, sizeof(*st->ring))) == NULL ||
        (st->settings.resource_json = strdup(settings->resource_json)) == NULL) {
        if (st != NULL)
            free(st->ring);
        free(st);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    {
        char *resource = st->settings.resource_json;

        st->settings = *settings;
        st->settings.resource_json = resource;
    }
    st->system = system;
    st->metrics = metrics;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->wake, NULL);
    if (pthread_create(&st->thread, NULL, otel_export_main, st) != 0) {
        free(st->settings.resource_json);
        free(st->ring);
        free(st);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start the span export thread");
    }
    atomic_store(&st->running, true);
    exporter = st;
    log_event(OUTBOX_LOG_INFO, "exporting spans", "endpoint=%s sampler=%d ratio=%g queue=%d",
              st->settings.url, (int)st->settings.sampler, st->settings.ratio,
              st->settings.queue_size);
    return 0;
}

void
otel_stop(double flush_seconds)
{
    struct otel_state *st = exporter;

    if (st == NULL)
        return;
    pthread_mutex_lock(&st->lock);
    st->stopping = true;
    st->flush_deadline = clock_monotonic_seconds() + flush_seconds;
    pthread_cond_signal(&st->wake);
    pthread_mutex_unlock(&st->lock);
    pthread_join(st->thread, NULL);
    exporter = NULL;
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->wake);
    free(st->settings.resource_json);
    free(st->ring);
    free(st);
}

bool
otel_enabled(void)
{
    return exporter != NULL;
}
