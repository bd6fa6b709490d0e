/*
 * http.c - the relay's /metrics, /healthz, /readyz and /livez, answered on the
 * shared HTTP server's own thread (common/httpd.c reads and writes).
 */
#include "http.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buffer.h"
#include "error.h"
#include "httpd.h"

struct http_server {
    int listen_fd;
    int port;
    struct metrics *metrics;
    struct httpd *httpd;
};

/* ---- answers ------------------------------------------------------------------ */

/* What of an answer is written: a HEAD request's has no body. */
enum answer_part { ANSWER_WHOLE, ANSWER_HEAD_ONLY };

/* Writes an answer into out: status line, headers, and the body unless ANSWER_HEAD_ONLY. */
static void
answer(struct buffer *out, int status, const char *reason, const char *content_type,
       const char *extra_headers, const char *body, size_t body_len, enum answer_part part)
{
    buffer_printf(out,
                  "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                  "Connection: close\r\n%s\r\n",
                  status, reason, content_type, body_len, extra_headers ? extra_headers : "");
    if (part == ANSWER_WHOLE && body_len > 0)
        buffer_append(out, body, body_len);
}

static void
answer_text(struct buffer *out, int status, const char *reason, const char *body,
            enum answer_part part)
{
    answer(out, status, reason, "text/plain; charset=utf-8",
           status == 405 ? "Allow: GET, HEAD\r\n" : NULL, body, strlen(body), part);
}

/* Answers a GET or HEAD of path. */
static void
route_request(struct http_server *s, struct buffer *out, const char *path, enum answer_part part)
{
    char reason[160], body[2048], ends[128], faults[1536];
    bool ready = false;

    if (strcmp(path, "/metrics") == 0) {
        size_t len = 0;
        char *text = metrics_render(s->metrics, &len);

        if (text == NULL) {
            answer_text(out, 500, "Internal Server Error", "out of memory\n", part);
            return;
        }
        answer(out, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", NULL, text, len, part);
        free(text);
    } else if (strcmp(path, "/healthz") == 0) {
        bool healthy = metrics_health(s->metrics, reason, sizeof(reason), NULL);

        /* the verdict first, how long ago each end last answered, then each database down */
        metrics_describe_ends(s->metrics, ends, sizeof(ends));
        metrics_databases_describe_faults(metrics_databases_of(s->metrics), faults,
                                          sizeof(faults));
        snprintf(body, sizeof(body), "%s\n%s%s", reason, ends, faults);
        answer_text(out, healthy ? 200 : 503, healthy ? "OK" : "Service Unavailable", body, part);
    } else if (strcmp(path, "/livez") == 0) {
        /* liveness: only a stuck loop, never an end that is down (a restart cannot fix that) */
        double stalled_for;

        if (metrics_loop_stalled(s->metrics, &stalled_for)) {
            snprintf(body, sizeof(body), "relay loop stalled for %.0f s\n", stalled_for);
            answer_text(out, 503, "Service Unavailable", body, part);
        } else {
            answer_text(out, 200, "OK", "alive\n", part);
        }
    } else if (strcmp(path, "/readyz") == 0) {
        metrics_health(s->metrics, reason, sizeof(reason), &ready);
        snprintf(body, sizeof(body), "%s\n", ready ? "ready" : reason);
        answer_text(out, ready ? 200 : 503, ready ? "OK" : "Service Unavailable", body, part);
    } else {
        answer_text(out, 404, "Not Found", "not found\n", part);
    }
}

/* Answers one request (an httpd_answer_fn), on the server's thread. */
static void
answer_request(void *arg, const struct httpd_request *request, struct buffer *out)
{
    enum answer_part part = strcmp(request->method, "HEAD") == 0 ? ANSWER_HEAD_ONLY : ANSWER_WHOLE;

    if (request->refused == 431)
        answer_text(out, 431, "Request Header Fields Too Large", "request too large\n",
                    ANSWER_WHOLE);
    else if (request->refused != 0)
        answer_text(out, 400, "Bad Request", "bad request\n", ANSWER_WHOLE);
    else if (strcmp(request->method, "GET") != 0 && part != ANSWER_HEAD_ONLY)
        answer_text(out, 405, "Method Not Allowed", "method not allowed\n", ANSWER_WHOLE);
    else
        route_request(arg, out, request->path, part);
}

int
http_server_start(const struct listen_addr *addr, struct metrics *m, struct http_server **server,
                  struct outbox_error *err)
{
    struct httpd_options options = {
        .max_connections = HTTP_MAX_CONNECTIONS,
        .request_ms = HTTP_REQUEST_TIMEOUT_SECONDS * 1000,
        .answer_ms = HTTP_REQUEST_TIMEOUT_SECONDS * 1000,
        .request_max_bytes = HTTP_REQUEST_MAX_BYTES,
        .refuse_garbage = true,
        .linger = true,
        .answer = answer_request,
    };
    struct http_server *s;

    *server = NULL;
    if (addr->off)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "metrics server is off");
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->metrics = m;
    options.arg = s;
    if (httpd_listen(addr, "metrics address", false, &s->listen_fd, &s->port, err) < 0) {
        free(s);
        return -1;
    }
    if ((s->httpd = httpd_new(s->listen_fd, &options)) == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to create a pipe: %s", strerror(errno));
        goto fail;
    }
    if (httpd_start_thread(s->httpd) < 0) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start the metrics thread: %s",
                         strerror(errno));
        goto fail;
    }
    *server = s;
    return 0;

fail:
    httpd_free(s->httpd);
    close(s->listen_fd);
    free(s);
    return -1;
}

int
http_server_port(const struct http_server *server)
{
    return server ? server->port : 0;
}

void
http_server_stop(struct http_server *server)
{
    if (server == NULL)
        return;
    httpd_stop(server->httpd);
    httpd_free(server->httpd);
    close(server->listen_fd);
    free(server);
}
