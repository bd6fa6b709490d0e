/*
 * console_client.h - what the tests of `outboxctl serve` share: requests
 * with the tests' token (over http_client.h), its token file, and the console process
 * started and stopped around a test.
 *
 * Like harness.h, these fail the current cmocka test on an error instead of
 * returning one. Include <cmocka.h> (with its prelude) before this header.
 */
#ifndef OUTBOX_TEST_CONSOLE_CLIENT_H
#define OUTBOX_TEST_CONSOLE_CLIENT_H

#include <stddef.h>
#include <sys/types.h>

#include "http_client.h"

/* The token the tests' consoles serve with, and the header line that sends it. */
#define CONSOLE_TOKEN "console-test-token-0123456789"
#define CONSOLE_BEARER "Authorization: Bearer " CONSOLE_TOKEN "\r\n"

/* GET path with CONSOLE_BEARER, within 20 s. */
struct http_reply console_get(int port, const char *path);

/* POST body as application/json to path with CONSOLE_BEARER, within 20 s. */
struct http_reply console_post(int port, const char *path, const char *body);

/*
 * Writes CONSOLE_TOKEN into /tmp/outbox-<name>-token-<pid>, readable by its
 * owner alone as --auth-token-file wants, and puts that path in path (size
 * bytes). The test unlinks it.
 */
void console_token_file(char *path, size_t size, const char *name);

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
void console_expect(const struct http_reply *reply, int status, const char *body_part);

#endif
