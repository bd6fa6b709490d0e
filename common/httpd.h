/*
 * httpd.h - the programs' one HTTP/1.1 server: the relay's /metrics
 * and /healthz, and outboxctl's console, each with its own options.
 *
 * One poll() loop accepts, reads every request and writes every answer with
 * non-blocking sockets, one request per connection ("Connection: close").
 * The answers are built by the program's answer function: on the loop's own
 * thread (workers 0: quick answers, such as metrics), or by a few worker
 * threads (answers that wait on a database), to which a complete request is
 * handed over and from which the answer comes back through a pipe; a
 * request the program calls quick is answered on the loop's thread even
 * then, so that no slow answer holds it up.
 *
 * A slow or silent client holds only its own connection: reading a request
 * has one deadline for the whole request, writing an answer one for the
 * whole answer, and when every slot is taken the connection that has been
 * reading the longest (then the oldest lingering, then the oldest being
 * written) makes room for a new one. A request the server cannot take is
 * still answered by the answer function, with request->refused set: 400
 * (not HTTP, or a body it cannot read), 408 (not complete in time, when
 * answer_late_requests), 413 (too large, with a body) or 431 (a head too
 * large, without one).
 */
#ifndef OUTBOX_HTTPD_H
#define OUTBOX_HTTPD_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buffer.h"
#include "listen_addr.h"
#include "outbox.h"

#define HTTPD_MAX_CONNECTIONS 128 /* slots at most, whatever the options ask */
#define HTTPD_MAX_WORKERS 8

/* A request as the server read it; valid while the answer function runs. */
struct httpd_request {
    int refused;                /* 0, or the status the server refuses it with (see above) */
    const char *refused_reason; /* why a 400, when the server knows; else NULL */
    char method[8];
    char path[512];   /* without the query, not decoded */
    char query[2048]; /* after '?', not decoded; "" when none */
    const char *body; /* a Content-Length body (read_body); else empty */
    size_t body_len;
    char peer[64];    /* the client's address */
    char *lines;      /* private: the header lines, NUL-separated, up to lines_end */
    const char *lines_end;
};

/*
 * Builds the whole answer to request (status line, headers, body) into
 * answer. Called on a worker thread, or on the loop's thread when there are
 * no workers or the request was refused.
 */
typedef void httpd_answer_fn(void *arg, const struct httpd_request *request, struct buffer *answer);

struct httpd_options {
    int max_connections;      /* open at once, at most HTTPD_MAX_CONNECTIONS */
    int workers;              /* threads building answers; 0: the loop's thread builds them */
    int64_t request_ms;       /* from accepting a connection to its request's last byte */
    int64_t answer_ms;        /* from an answer's first byte written to its last */
    size_t request_max_bytes; /* head (and body) */
    bool read_body;           /* read a Content-Length body; else the head alone */
    bool refuse_garbage;      /* bytes that cannot begin a request: refused (400) at once */
    bool answer_late_requests; /* a request past its deadline gets a 408; else a close */
    bool linger;              /* after the answer, shut the write side and discard for a while */
    httpd_answer_fn *answer;
    /*
     * Optional, with workers: true for a request cheap to answer (no
     * database, no waiting), which the loop's thread then answers at once
     * instead of queueing it behind the slow ones the workers hold.
     */
    bool (*quick)(void *arg, const struct httpd_request *request);
    void *arg;                            /* for answer, quick and the worker hooks */
    void (*worker_begin)(void *arg);      /* optional: a worker starts (connect early) */
    void (*worker_end)(void *arg);        /* optional: a worker stops */
};

struct httpd;

/* True when address is a loopback one (127.0.0.0/8, ::1). */
struct sockaddr;
bool httpd_address_is_loopback(const struct sockaddr *address);

/*
 * Binds and listens on addr (host "": every address; the first of the
 * host's addresses that binds), non-blocking; *port (when not NULL) is the
 * port bound. With loopback_only, a host that is not loopback (or "") is
 * refused before binding: OUTBOX_ERR_INVALID. Else -1 with
 * OUTBOX_ERR_CONFIG naming what ("metrics address") and the address when it
 * cannot be resolved or bound.
 */
int httpd_listen(const struct listen_addr *addr, const char *what, bool loopback_only,
                 int *listen_fd, int *port, struct outbox_error *err);

/*
 * Makes a server for listen_fd (a listening socket the caller keeps and
 * closes, made non-blocking here); NULL when out of memory or a pipe.
 */
struct httpd *httpd_new(int listen_fd, const struct httpd_options *options);

/*
 * Serves in the calling thread until *stop is set (a signal handler's flag;
 * poll() wakes at least every second to look) or httpd_stop() is
 * called, then lets the workers finish the requests they hold. 0, or -1
 * when no worker thread could start.
 */
int httpd_run(struct httpd *server, volatile sig_atomic_t *stop);

/* Serves on a thread of its own, which blocks every signal; 0, or -1 with errno. */
int httpd_start_thread(struct httpd *server);

/* Stops the serving (wakes the loop through a pipe); waits for the thread of start_thread. */
void httpd_stop(struct httpd *server);

/* Frees a stopped server; NULL is fine. */
void httpd_free(struct httpd *server);

/* The value of header name (case-insensitive) of request, blanks skipped; NULL when none. */
const char *httpd_request_header(const struct httpd_request *request, const char *name);

#endif
