/*
 * http_client.h - the tests' one HTTP client: a request to 127.0.0.1 on a
 * port (the console, the relay's /metrics and /healthz), one request per
 * connection, read until the server closes it or the timeout passes.
 *
 * A server that does not answer is a reply with status 0, never a failed
 * test: tests poll servers that are still starting or already stopped.
 * Include <cmocka.h> (with its prelude) before this header.
 */
#ifndef OUTBOX_TEST_HTTP_CLIENT_H
#define OUTBOX_TEST_HTTP_CLIENT_H

/* An answer: status 0 when none came (refused, closed, timed out or malformed). */
struct http_reply {
    int status;
    char *head; /* status line and headers */
    char *body;
};

/* Frees what reply holds and zeroes it. */
void http_reply_free(struct http_reply *reply);

/*
 * Sends method path with the header lines of extra (each ending in \r\n,
 * NULL: none) and body (NULL: none) to 127.0.0.1:port, and reads the answer,
 * giving up after timeout_seconds without progress. Adds "Host:
 * 127.0.0.1:port" unless extra starts with a Host line.
 */
struct http_reply http_request(int port, const char *method, const char *path, const char *extra,
                               const char *body, int timeout_seconds);

/* GET path without credentials, within 5 s (the relay's metrics server). */
struct http_reply http_get(int port, const char *path);

#endif
