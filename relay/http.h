/*
 * http.h - the tiny HTTP server behind --metrics-addr.
 *
 * The programs' shared server (common/httpd.c) on a thread of its own, with
 * one poll() loop and no workers (the answers are quick), serves up to HTTP_MAX_CONNECTIONS
 * connections at once, one request each, HTTP/1.0 and 1.1 with
 * "Connection: close". It serves:
 *
 *   GET /metrics   200, Prometheus text format 0.0.4 (metrics_render)
 *   GET /healthz   200 "ok" when metrics_health() says healthy, else 503 and the reason;
 *                  then a line per end, "database: last round trip 0.4 s ago"
 *   GET /readyz    200 "ready" when database and broker are up, else 503 and the reason
 *   other paths    404; methods other than GET and HEAD: 405
 *
 * A client gets HTTP_REQUEST_TIMEOUT_SECONDS from its connect to send its
 * request (at most HTTP_REQUEST_MAX_BYTES of request line and headers) and
 * as long to read the answer; bytes that cannot begin a request get a 400
 * and a close as soon as they arrive. Idle, slow or broken clients never
 * delay another client's answer: when every slot is taken, a new connection
 * replaces the oldest one still waiting for its request. Nothing here
 * touches the relay's threads. http_server_stop() wakes the thread through
 * a pipe, so it returns promptly even while clients are connected.
 * The server thread blocks all signals; the relay's main thread gets them.
 */
#ifndef OUTBOX_HTTP_H
#define OUTBOX_HTTP_H

#include <stdbool.h>

#include "listen_addr.h"
#include "metrics.h"
#include "outbox.h"
#include "timeouts.h" /* HTTP_REQUEST_TIMEOUT_SECONDS */

#define HTTP_DEFAULT_ADDR "127.0.0.1:9187"
#define HTTP_REQUEST_MAX_BYTES 8192
#define HTTP_MAX_CONNECTIONS 64

struct http_server;

/*
 * Binds addr, starts listening and starts the server thread, which reads m
 * (not owned; it must outlive the server). *server is set on success.
 * Returns -1 with OUTBOX_ERR_CONFIG naming the address when it cannot be
 * resolved or bound (e.g. the port is taken), OUTBOX_ERR_INVALID when addr
 * is "off", OUTBOX_ERR_INTERNAL when a thread or pipe cannot be made.
 */
int http_server_start(const struct listen_addr *addr, struct metrics *m, struct http_server **server,
                      struct outbox_error *err);

/* The port actually bound (useful after binding port 0). */
int http_server_port(const struct http_server *server);

/* Stops the thread, closes the sockets and frees server; NULL is a no-op. */
void http_server_stop(struct http_server *server);

#endif
