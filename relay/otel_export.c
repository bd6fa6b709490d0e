/*
 * otel_export.c - the span export thread: batches from the queue, encoded as
 * OTLP/JSON, POSTed over plain HTTP/1.1 (see otel.h).
 *
 * The transport is a small client of its own rather than libcurl: OTLP/HTTP
 * needs one POST and a status line, a collector is reached over http on the
 * same host or network (an agent or a sidecar that forwards over TLS), and
 * every step (resolve, connect, send, read) is bounded by one deadline with
 * poll(), so a slow or silent collector costs this thread time and nothing
 * else. One connection per export (Connection: close): an export carries up
 * to OTEL_BSP_MAX_EXPORT_BATCH_SIZE spans, so the handshake is a small part.
 */
#include "otel_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "json.h"
#include "log.h"

/* Longest wait between exports after failures, in seconds. */
#define RETRY_MAX_SECONDS 30.0

/* The export thread's nice value: it yields the cores to publishing. */
#define EXPORT_NICE 10

/* ---- OTLP/JSON ----------------------------------------------------------- */

/* Appends size bytes as lowercase hex in quotes (OTLP/JSON ids). */
static void
put_hex(struct buffer *out, const uint8_t *bytes, size_t size)
{
    static const char digits[] = "0123456789abcdef";

    buffer_putc(out, '"');
    for (size_t i = 0; i < size; i++) {
        buffer_putc(out, digits[bytes[i] >> 4]);
        buffer_putc(out, digits[bytes[i] & 15]);
    }
    buffer_putc(out, '"');
}

static void
put_string_attribute(struct buffer *out, const char *key, const char *value)
{
    buffer_puts(out, ",{\"key\":");
    json_put_text(out, key, 0);
    buffer_puts(out, ",\"value\":{\"stringValue\":");
    json_put_text(out, value, 0);
    buffer_puts(out, "}}");
}

static void
put_int_attribute(struct buffer *out, const char *key, int64_t value)
{
    buffer_printf(out, ",{\"key\":\"%s\",\"value\":{\"intValue\":\"%" PRId64 "\"}}", key, value);
}

/* One span's attributes: the messaging conventions, then the relay's. */
static void
put_attributes(struct buffer *out, const struct otel_state *st, const struct otel_span *span)
{
    buffer_puts(out, "\"attributes\":[{\"key\":\"messaging.system\",\"value\":{\"stringValue\":");
    json_put_text(out, st->system, 0);
    buffer_puts(out, "}}");
    put_string_attribute(out, "messaging.operation.type", "publish");
    put_string_attribute(out, "messaging.operation.name", "publish");
    put_string_attribute(out, "messaging.destination.name", span->destination);
    put_string_attribute(out, "messaging.message.id", span->message_id);
    put_string_attribute(out, "outbox.queue", span->queue);
    put_int_attribute(out, "outbox.job_id", span->job_id);
    put_int_attribute(out, "outbox.attempt", span->attempt);
    if (span->ordering_key[0] != '\0')
        put_string_attribute(out, "outbox.ordering_key", span->ordering_key);
    if (span->wait_seconds >= 0)
        buffer_printf(out, ",{\"key\":\"outbox.wait_seconds\",\"value\":{\"doubleValue\":%.6f}}",
                      span->wait_seconds);
    buffer_putc(out, ']');
}

/* One span as an OTLP/JSON object. */
static void
put_span(struct buffer *out, const struct otel_state *st, const struct otel_span *span)
{
    char name[OTEL_TEXT_MAX + 16];

    buffer_puts(out, "{\"traceId\":");
    put_hex(out, span->trace_id, sizeof(span->trace_id));
    buffer_puts(out, ",\"spanId\":");
    put_hex(out, span->span_id, sizeof(span->span_id));
    if (span->has_parent) {
        buffer_puts(out, ",\"parentSpanId\":");
        put_hex(out, span->parent_id, sizeof(span->parent_id));
    }
    if (span->tracestate[0] != '\0') {
        buffer_puts(out, ",\"traceState\":");
        json_put_text(out, span->tracestate, 0);
    }
    snprintf(name, sizeof(name), "publish %s", span->destination);
    buffer_puts(out, ",\"name\":");
    json_put_text(out, name, 0);
    buffer_printf(out, ",\"kind\":4,\"startTimeUnixNano\":\"%" PRId64 "\",\"endTimeUnixNano\":\"%"
                  PRId64 "\",", span->start_ns, span->end_ns);
    put_attributes(out, st, span);
    if (span->failed) {
        buffer_puts(out, ",\"status\":{\"code\":2,\"message\":");
        json_put_text(out, span->reason, 0);
        buffer_putc(out, '}');
    } else {
        buffer_puts(out, ",\"status\":{\"code\":1}");
    }
    buffer_putc(out, '}');
}

void
otel_encode(const struct otel_state *st, const struct otel_span *spans, size_t count,
            struct buffer *out)
{
    buffer_puts(out, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    buffer_puts(out, st->settings.resource_json);
    buffer_puts(out, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"outbox-relay\",\"version\":\""
                     OUTBOX_VERSION "\"},\"spans\":[");
    for (size_t i = 0; i < count; i++) {
        if (i > 0)
            buffer_putc(out, ',');
        put_span(out, st, &spans[i]);
    }
    buffer_puts(out, "]}]}]}");
}

/* ---- HTTP ---------------------------------------------------------------- */

/* Waits until fd is ready for events or deadline passes: 1 ready, 0 timed out, -1 error. */
static int
wait_ready(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - clock_monotonic_seconds();
        struct pollfd p = {.fd = fd, .events = events};
        int rc;

        if (left <= 0)
            return 0;
        rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

/* A connected non-blocking socket to the endpoint, or -1 with reason. */
static int
connect_endpoint(const struct otel_settings *s, double deadline, char *reason, size_t size)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *list, *a;
    int fd = -1, rc = getaddrinfo(s->host, s->port, &hints, &list);

    if (rc != 0) {
        snprintf(reason, size, "unable to resolve %s: %s", s->host, gai_strerror(rc));
        return -1;
    }
    snprintf(reason, size, "unable to connect to %s:%s", s->host, s->port);
    for (a = list; a != NULL && fd < 0; a = a->ai_next) {
        int error = 0;
        socklen_t length = sizeof(error);

        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 ||
            (errno == EINPROGRESS && wait_ready(fd, POLLOUT, deadline) == 1 &&
             getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0))
            break;
        snprintf(reason, size, "unable to connect to %s:%s: %s", s->host, s->port,
                 error != 0 ? strerror(error) : errno == EINPROGRESS ? "timed out" : strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    return fd;
}

/* Sends data[0..length) before deadline; 0 or -1. */
static int
send_before(int fd, const char *data, size_t length, double deadline)
{
    while (length > 0) {
        ssize_t n = send(fd, data, length, MSG_NOSIGNAL);

        if (n > 0) {
            data += n;
            length -= (size_t)n;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            return -1;
        } else if (wait_ready(fd, POLLOUT, deadline) != 1) {
            return -1;
        }
    }
    return 0;
}

/* Reads the status line's code before deadline; -1 when none came. */
static int
read_status(int fd, double deadline)
{
    char reply[256];
    size_t have = 0;
    int code;

    while (have < sizeof(reply) - 1 && memchr(reply, '\n', have) == NULL) {
        ssize_t n = recv(fd, reply + have, sizeof(reply) - 1 - have, 0);

        if (n > 0)
            have += (size_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            break;
        else if (wait_ready(fd, POLLIN, deadline) != 1)
            return -1;
    }
    reply[have] = '\0';
    return sscanf(reply, "HTTP/%*d.%*d %d", &code) == 1 ? code : -1;
}

int
otel_http_post(const struct otel_settings *s, const char *body, size_t length, double deadline,
               char *reason, size_t reason_size)
{
    char head[1024];
    int fd = connect_endpoint(s, deadline, reason, reason_size), status;
    int head_length;

    if (fd < 0)
        return -1;
    head_length = snprintf(head, sizeof(head),
                           "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                           "Content-Length: %zu\r\nConnection: close\r\n"
                           "User-Agent: outbox-relay/" OUTBOX_VERSION "\r\n\r\n",
                           s->path, s->host, s->port, length);
    if (send_before(fd, head, (size_t)head_length, deadline) != 0 ||
        send_before(fd, body, length, deadline) != 0) {
        snprintf(reason, reason_size, "sending to %s:%s failed or timed out", s->host, s->port);
        close(fd);
        return -1;
    }
    status = read_status(fd, deadline);
    close(fd);
    if (status >= 200 && status < 300)
        return 0;
    if (status < 0)
        snprintf(reason, reason_size, "no answer from %s:%s in time", s->host, s->port);
    else
        snprintf(reason, reason_size, "the collector answered %d", status);
    return -1;
}

/* ---- the thread ---------------------------------------------------------- */

/* A deadline for pthread_cond_timedwait, monotonic seconds from now as realtime. */
static struct timespec
wake_time(double seconds)
{
    struct timespec ts;
    double whole;

    clock_gettime(CLOCK_REALTIME, &ts);
    seconds += (double)ts.tv_nsec / 1e9;
    whole = (double)(long)seconds;
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec = (long)((seconds - whole) * 1e9);
    return ts;
}

/*
 * Waits (lock held) until a batch should go: the queue holds a full batch,
 * or spans waited the schedule delay, or stop; never before retry_at unless
 * stopping. Returns false when the thread should end.
 */
static bool
wait_for_batch(struct otel_state *st, double last_export, double retry_at)
{
    for (;;) {
        double now = clock_monotonic_seconds();
        double due = last_export + st->settings.schedule_delay_ms / 1000.0, wait;
        struct timespec until;

        if (st->stopping)
            return st->count > 0 && now < st->flush_deadline;
        if (st->count > 0 && now >= retry_at &&
            (st->count >= (size_t)st->settings.batch_size || now >= due))
            return true;
        /* nothing queued: a full delay (a full batch or stop signals sooner) */
        wait = st->count == 0 ? st->settings.schedule_delay_ms / 1000.0
                              : (retry_at > due ? retry_at : due) - now;
        until = wake_time(wait > 0.001 ? wait : 0.001);
        pthread_cond_timedwait(&st->wake, &st->lock, &until);
    }
}

/* Sends one batch; counts it exported or dropped. Returns 0 or -1. */
static int
export_batch(struct otel_state *st, const struct otel_span *batch, size_t n, struct buffer *body,
             double deadline)
{
    char reason[256];

    body->len = 0;
    body->failed = false;
    otel_encode(st, batch, n, body);
    if (!body->failed &&
        otel_http_post(&st->settings, body->data, body->len, deadline, reason, sizeof(reason)) == 0) {
        metrics_add(st->metrics, METRICS_SPANS_EXPORTED, n);
        return 0;
    }
    if (body->failed)
        snprintf(reason, sizeof(reason), "out of memory");
    metrics_add(st->metrics, METRICS_SPANS_DROPPED, n);
    metrics_add(st->metrics, METRICS_SPAN_EXPORTS_FAILED, 1);
    log_event_limited("span-export-failed", OUTBOX_LOG_WARN, "span export failed, spans dropped",
                      "endpoint=%s spans=%zu error=\"%s\"", st->settings.url, n, reason);
    return -1;
}

void *
otel_export_main(void *arg)
{
    struct otel_state *st = arg;
    size_t capacity = (size_t)st->settings.batch_size, left;
    struct otel_span *batch = malloc(capacity * sizeof(*batch));
    struct buffer body = {0};
    double last_export = clock_monotonic_seconds(), retry_at = 0, backoff = 0;

    /*
     * Below the publishing threads on a busy host: a span waits (or is
     * dropped and counted), a publish does not. Best effort.
     */
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), EXPORT_NICE);
    pthread_mutex_lock(&st->lock);
    while (batch != NULL && wait_for_batch(st, last_export, retry_at)) {
        size_t n = st->count < capacity ? st->count : capacity;
        double now = clock_monotonic_seconds(), deadline;
        bool stopping;

        for (size_t i = 0; i < n; i++)
            batch[i] = st->ring[(st->head + i) % (size_t)st->settings.queue_size];
        st->head = (st->head + n) % (size_t)st->settings.queue_size;
        st->count -= n;
        deadline = now + st->settings.export_timeout_ms / 1000.0;
        stopping = st->stopping;
        if (stopping && st->flush_deadline < deadline)
            deadline = st->flush_deadline;
        pthread_mutex_unlock(&st->lock);
        if (export_batch(st, batch, n, &body, deadline) == 0) {
            backoff = 0;
        } else if (stopping) {
            pthread_mutex_lock(&st->lock);
            break; /* no retries at the end: what is left is dropped */
        } else {
            backoff = backoff == 0 ? 1.0 : backoff * 2 > RETRY_MAX_SECONDS ? RETRY_MAX_SECONDS
                                                                            : backoff * 2;
            retry_at = clock_monotonic_seconds() + backoff;
        }
        last_export = clock_monotonic_seconds();
        pthread_mutex_lock(&st->lock);
    }
    left = st->count;
    st->count = 0;
    pthread_mutex_unlock(&st->lock);
    if (left > 0)
        metrics_add(st->metrics, METRICS_SPANS_DROPPED, left);
    buffer_clear(&body);
    free(batch);
    return NULL;
}
