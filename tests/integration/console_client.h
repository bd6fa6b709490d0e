/*
 * console_client.h - a plain HTTP/1.1 client for the tests of `outboxctl
 * serve`: one request per connection, as the console answers them, and the
 * console process started and stopped around a test.
 *
 * Like harness.h, these fail the current cmocka test on an error instead of
 * returning one. Include <cmocka.h> (with its prelude) before this header.
 */
#ifndef OUTBOX_TEST_CONSOLE_CLIENT_H
#define OUTBOX_TEST_CONSOLE_CLIENT_H

#include <sys/types.h>

/* An answer: status 0 when none came (refused, closed or timed out). */
struct console_reply {
    int status;
    char *head; /* status line and headers */
    char *body;
};

void console_reply_free(struct console_reply *reply);

/*
 * Sends method path with the header lines of extra (each ending in \r\n)
 * and body to 127.0.0.1:port, and reads the answer, giving up after
 * timeout_seconds. Adds "Host: 127.0.0.1:port" unless extra starts with a
 * Host line.
 */
struct console_reply console_http(int port, const char *method, const char *path,
                                  const char *extra, const char *body, int timeout_seconds);

/*
 * Starts `outboxctl serve --listen 127.0.0.1:port --database-url url` with
 * options (NULL-terminated) and waits until it answers; its pid.
 */
pid_t console_start(int port, const char *url, const char *const *options);

/* The same for `outboxctl --databases list_path serve`: a console over a list. */
pid_t console_start_list(int port, const char *list_path, const char *const *options);

/* Stops the console with SIGTERM and asserts that it exits 0 within 10 s. */
void console_stop(pid_t pid);

/* Fails the test unless reply has status and (when not NULL) body_part in its body. */
void console_expect(const struct console_reply *reply, int status, const char *body_part);

#endif
