/*
 * console_server.h - the console's HTTP/1.1 connections: one thread reads
 * every request and writes every answer with non-blocking sockets, a few
 * worker threads (each with its own database connection) build the
 * answers.
 *
 * A slow or silent client holds only its own connection: reading a request
 * has one deadline for the whole request, writing an answer one for the
 * whole answer, and when every slot is taken the connection that has been
 * reading the longest makes room for a new one.
 */
#ifndef OUTBOX_CONSOLE_SERVER_H
#define OUTBOX_CONSOLE_SERVER_H

#include <signal.h>

#include "buffer.h"
#include "console_request.h"
#include "timeouts.h" /* CONSOLE_REQUEST_SECONDS, CONSOLE_ANSWER_SECONDS */

#define CONSOLE_WORKERS 4            /* threads building answers, a database connection each */
#define CONSOLE_MAX_CONNECTIONS 128  /* connections open at once */

/*
 * Builds the whole answer to request (status line, headers, body) into
 * answer. Called on a worker thread; for a request the server refused
 * (request->refused set: the text answer only, no database) on the thread
 * that reads.
 */
typedef void console_answer_fn(struct console *console, struct console_request *request,
                               struct buffer *answer);

/*
 * Serves the connections of listen_fd until *stop is set, then lets the
 * workers finish the requests they hold. 0, or -1 after a message when the
 * threads cannot start.
 */
int console_server_run(struct console *console, int listen_fd, volatile sig_atomic_t *stop,
                       console_answer_fn *answer);

#endif
