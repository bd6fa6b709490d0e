/*
 * http.c - a poll() driven HTTP server for metrics and health, many connections at once.
 */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>

#include "clock.h"
#include "error.h"
#include "timeouts.h"

/* At most how many bytes a lingering connection discards (for HTTP_LINGER_MS). */
#define HTTP_LINGER_MAX_BYTES (1024 * 1024)

/* Where a connection is in its one request/answer exchange. */
enum connection_phase {
    PHASE_FREE = 0,  /* the slot holds no connection */
    PHASE_READING,   /* waiting for the request line and headers */
    PHASE_WRITING,   /* sending the answer */
    PHASE_LINGERING, /* answer sent, write side shut: discarding what the client still sends */
};

struct connection {
    int fd;
    enum connection_phase phase;
    int64_t accepted_ms; /* when accepted: the oldest idle one is dropped first when full */
    int64_t deadline_ms; /* end of the current phase; the connection is closed then */
    char *request;       /* reading: HTTP_REQUEST_MAX_BYTES + 1, NUL-terminated */
    size_t request_len;
    char *response; /* writing: status line, headers and body */
    size_t response_len;
    size_t response_sent;
    size_t discarded; /* lingering: bytes thrown away so far */
};

struct http_server {
    int listen_fd;
    int stop_pipe[2]; /* [0] polled by the thread, [1] written by http_server_stop */
    int port;
    struct metrics *metrics;
    pthread_t thread;
    struct connection connections[HTTP_MAX_CONNECTIONS];
    int64_t accept_paused_until_ms; /* out of descriptors: no accept before then */
};

/* ---- connections ------------------------------------------------------------ */

/* Closes a connection and frees its buffers; the slot becomes free. */
static void
connection_close(struct connection *c)
{
    if (c->phase == PHASE_FREE)
        return;
    close(c->fd);
    free(c->request);
    free(c->response);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

/*
 * Sends what the socket takes of the answer; once all of it is out, shuts
 * the write side and lingers: discarding what the client still sends for a
 * short while keeps unread request bytes from making the kernel reset the
 * connection and drop the answer in flight.
 */
static void
connection_write(struct connection *c)
{
    while (c->response_sent < c->response_len) {
        ssize_t n = send(c->fd, c->response + c->response_sent, c->response_len - c->response_sent,
                         MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return; /* poll for POLLOUT */
        if (n <= 0) {
            connection_close(c); /* client gone */
            return;
        }
        c->response_sent += (size_t)n;
    }
    free(c->response);
    c->response = NULL;
    shutdown(c->fd, SHUT_WR);
    c->phase = PHASE_LINGERING;
    c->deadline_ms = clock_monotonic_ms() + HTTP_LINGER_MS;
}

/* Makes the answer and starts sending it; the request buffer is no longer needed. */
static void
connection_answer(struct connection *c, int status, const char *reason, const char *content_type,
                  const char *extra_headers, const char *body, size_t body_len, bool head_only)
{
    char header[512];
    int n = snprintf(header, sizeof(header),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n%s\r\n",
                     status, reason, content_type, body_len, extra_headers ? extra_headers : "");
    size_t total;

    free(c->request);
    c->request = NULL;
    if (n < 0 || (size_t)n >= sizeof(header)) {
        connection_close(c);
        return;
    }
    total = (size_t)n + (head_only ? 0 : body_len);
    c->response = malloc(total);
    if (c->response == NULL) {
        connection_close(c);
        return;
    }
    memcpy(c->response, header, (size_t)n);
    if (!head_only && body_len > 0)
        memcpy(c->response + n, body, body_len);
    c->response_len = total;
    c->response_sent = 0;
    c->phase = PHASE_WRITING;
    c->deadline_ms = clock_monotonic_ms() + HTTP_REQUEST_TIMEOUT_SECONDS * 1000;
    connection_write(c);
}

static void
answer_text(struct connection *c, int status, const char *reason, const char *body, bool head_only)
{
    connection_answer(c, status, reason, "text/plain; charset=utf-8",
                      status == 405 ? "Allow: GET, HEAD\r\n" : NULL, body, strlen(body), head_only);
}

/* Answers a parsed GET or HEAD of path. */
static void
route(struct http_server *s, struct connection *c, const char *path, bool head_only)
{
    char reason[160], body[2048], ends[128], faults[1536];
    bool ready = false;

    if (strcmp(path, "/metrics") == 0) {
        size_t len = 0;
        char *text = metrics_render(s->metrics, &len);

        if (text == NULL) {
            answer_text(c, 500, "Internal Server Error", "out of memory\n", head_only);
            return;
        }
        connection_answer(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", NULL, text, len,
                          head_only);
        free(text);
    } else if (strcmp(path, "/healthz") == 0) {
        bool healthy = metrics_health(s->metrics, reason, sizeof(reason), NULL);

        /* the verdict first, how long ago each end last answered, then each database down */
        metrics_describe_ends(s->metrics, ends, sizeof(ends));
        metrics_databases_describe_faults(metrics_databases_of(s->metrics), faults,
                                          sizeof(faults));
        snprintf(body, sizeof(body), "%s\n%s%s", reason, ends, faults);
        answer_text(c, healthy ? 200 : 503, healthy ? "OK" : "Service Unavailable", body,
                    head_only);
    } else if (strcmp(path, "/readyz") == 0) {
        metrics_health(s->metrics, reason, sizeof(reason), &ready);
        snprintf(body, sizeof(body), "%s\n", ready ? "ready" : reason);
        answer_text(c, ready ? 200 : 503, ready ? "OK" : "Service Unavailable", body, head_only);
    } else {
        answer_text(c, 404, "Not Found", "not found\n", head_only);
    }
}

/*
 * Whether the first len bytes can still begin a request: a request line
 * "METHOD /target HTTP/1.x" (method of letters, target of visible
 * characters from '/'), then header lines without control characters.
 * Anything else is refused as soon as it arrives, so garbage never waits
 * for the request timeout.
 */
static bool
request_plausible(const char *data, size_t len)
{
    static const char version[] = "HTTP/1.";
    size_t i = 0, start;

    for (start = i; i < len && data[i] != ' '; i++)
        if (!((data[i] >= 'A' && data[i] <= 'Z') || (data[i] >= 'a' && data[i] <= 'z')) ||
            i - start >= 16)
            return false;
    if (i == len)
        return true;
    if (i == start)
        return false;
    i++; /* the space */
    for (start = i; i < len && data[i] != ' '; i++)
        if ((unsigned char)data[i] <= 0x20 || (unsigned char)data[i] >= 0x7f ||
            (i == start && data[i] != '/'))
            return false;
    if (i == len)
        return true;
    if (i == start)
        return false;
    i++;
    for (start = i; i < len && i - start < sizeof(version) - 1; i++)
        if (data[i] != version[i - start])
            return false;
    if (i == len)
        return true;
    if (data[i] < '0' || data[i] > '9')
        return false;
    i++;
    if (i < len && data[i] == '\r')
        i++;
    if (i < len && data[i] != '\n')
        return false;
    for (; i < len; i++)
        if (((unsigned char)data[i] < 0x20 && data[i] != '\t' && data[i] != '\r' &&
             data[i] != '\n') ||
            data[i] == 0x7f)
            return false;
    return true;
}

/* Parses the complete request in c->request and answers it. */
static void
answer_request(struct http_server *s, struct connection *c)
{
    char *line_end, *method, *target, *version, *save = NULL;
    bool head_only;

    line_end = strpbrk(c->request, "\r\n");
    *line_end = '\0';
    method = strtok_r(c->request, " ", &save);
    target = strtok_r(NULL, " ", &save);
    version = strtok_r(NULL, " ", &save);
    if (method == NULL || target == NULL || version == NULL || strtok_r(NULL, " ", &save) != NULL ||
        strncmp(version, "HTTP/1.", 7) != 0 || target[0] != '/') {
        answer_text(c, 400, "Bad Request", "bad request\n", false);
        return;
    }
    head_only = strcmp(method, "HEAD") == 0;
    if (strcmp(method, "GET") != 0 && !head_only) {
        answer_text(c, 405, "Method Not Allowed", "method not allowed\n", false);
        return;
    }
    target[strcspn(target, "?#")] = '\0';
    route(s, c, target, head_only);
}

/* Reads what the client sent; answers once the headers are complete or cannot be. */
static void
connection_read(struct http_server *s, struct connection *c)
{
    for (;;) {
        ssize_t n;

        if (c->request_len == HTTP_REQUEST_MAX_BYTES) {
            answer_text(c, 431, "Request Header Fields Too Large", "request too large\n", false);
            return;
        }
        n = recv(c->fd, c->request + c->request_len, HTTP_REQUEST_MAX_BYTES - c->request_len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            connection_close(c); /* closed before finishing its request, or broken */
            return;
        }
        c->request_len += (size_t)n;
        c->request[c->request_len] = '\0';
        if (!request_plausible(c->request, c->request_len)) {
            answer_text(c, 400, "Bad Request", "bad request\n", false);
            return;
        }
        /* the blank line that ends the headers; a body is never needed */
        if (strstr(c->request, "\r\n\r\n") != NULL || strstr(c->request, "\n\n") != NULL) {
            answer_request(s, c);
            return;
        }
    }
}

/* Discards what the client sends after the answer, up to a limit. */
static void
connection_discard(struct connection *c)
{
    char discard[4096];

    for (;;) {
        ssize_t n = recv(c->fd, discard, sizeof(discard), 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0 || (c->discarded += (size_t)n) > HTTP_LINGER_MAX_BYTES) {
            connection_close(c);
            return;
        }
    }
}

/*
 * The slot to reuse when every slot is taken: the oldest connection still
 * waiting for its request (an idle or trickling client), else the oldest
 * lingering one, else the oldest still being answered.
 */
static struct connection *
connection_to_drop(struct http_server *s)
{
    static const enum connection_phase order[] = {PHASE_READING, PHASE_LINGERING, PHASE_WRITING};

    for (size_t p = 0; p < sizeof(order) / sizeof(order[0]); p++) {
        struct connection *oldest = NULL;

        for (size_t i = 0; i < HTTP_MAX_CONNECTIONS; i++) {
            struct connection *c = &s->connections[i];

            if (c->phase == order[p] && (oldest == NULL || c->accepted_ms < oldest->accepted_ms))
                oldest = c;
        }
        if (oldest != NULL)
            return oldest;
    }
    return &s->connections[0];
}

/* Accepts the pending clients, dropping the oldest idle ones when full. */
static void
accept_clients(struct http_server *s)
{
    for (int round = 0; round < HTTP_MAX_CONNECTIONS; round++) {
        struct connection *slot = NULL;
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            /* out of descriptors: the pending client stays queued; try again a little later */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                s->accept_paused_until_ms = clock_monotonic_ms() + HTTP_ACCEPT_PAUSE_MS;
            return; /* none left, or that client gone */
        }
        for (size_t i = 0; i < HTTP_MAX_CONNECTIONS && slot == NULL; i++)
            if (s->connections[i].phase == PHASE_FREE)
                slot = &s->connections[i];
        if (slot == NULL) {
            slot = connection_to_drop(s);
            connection_close(slot);
        }
        slot->request = malloc(HTTP_REQUEST_MAX_BYTES + 1);
        if (slot->request == NULL) {
            close(fd);
            continue;
        }
        slot->fd = fd;
        slot->phase = PHASE_READING;
        slot->accepted_ms = clock_monotonic_ms();
        slot->deadline_ms = slot->accepted_ms + HTTP_REQUEST_TIMEOUT_SECONDS * 1000;
        slot->request_len = 0;
        slot->request[0] = '\0';
    }
}

/*
 * The event loop: the stop pipe, the listening socket and every connection
 * in one poll(). Each connection has the deadline of its phase (request,
 * answer, linger); one past it is closed.
 */
static void *
server_thread(void *arg)
{
    struct http_server *s = arg;
    struct pollfd fds[2 + HTTP_MAX_CONNECTIONS];
    struct connection *polled[2 + HTTP_MAX_CONNECTIONS];

    for (;;) {
        int64_t now = clock_monotonic_ms(), next = -1;
        nfds_t count = 2;
        int timeout, n;

        fds[0] = (struct pollfd){s->stop_pipe[0], POLLIN, 0};
        fds[1] = (struct pollfd){s->listen_fd, now < s->accept_paused_until_ms ? 0 : POLLIN, 0};
        if (now < s->accept_paused_until_ms)
            next = s->accept_paused_until_ms;
        for (size_t i = 0; i < HTTP_MAX_CONNECTIONS; i++) {
            struct connection *c = &s->connections[i];

            if (c->phase == PHASE_FREE)
                continue;
            if (c->deadline_ms <= now) {
                connection_close(c);
                continue;
            }
            if (next < 0 || c->deadline_ms < next)
                next = c->deadline_ms;
            polled[count] = c;
            fds[count++] = (struct pollfd){c->fd, c->phase == PHASE_WRITING ? POLLOUT : POLLIN, 0};
        }
        timeout = next < 0 ? -1 : (int)(next - now);
        n = poll(fds, count, timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (fds[0].revents != 0)
            break;
        for (nfds_t i = 2; i < count; i++) {
            struct connection *c = polled[i];

            if (fds[i].revents == 0)
                continue;
            if (c->phase == PHASE_READING)
                connection_read(s, c);
            else if (c->phase == PHASE_WRITING)
                connection_write(c);
            else if (c->phase == PHASE_LINGERING)
                connection_discard(c);
        }
        if (fds[1].revents != 0)
            accept_clients(s);
    }
    for (size_t i = 0; i < HTTP_MAX_CONNECTIONS; i++)
        connection_close(&s->connections[i]);
    return NULL;
}

/* Opens, binds and listens on addr; -1 with OUTBOX_ERR_CONFIG naming the address. */
static int
listen_on(const struct listen_addr *addr, int *listen_fd, int *port, struct outbox_error *err)
{
    struct addrinfo hints, *list = NULL, *ai;
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof(bound);
    const char *shown_host = addr->host[0] ? addr->host : "*";
    int fd = -1, rc, saved_errno = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(addr->host[0] ? addr->host : NULL, addr->port, &hints, &list);
    if (rc != 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "unable to resolve metrics address '%s:%s': %s", shown_host,
                                addr->port, gai_strerror(rc));
    for (ai = list; ai != NULL; ai = ai->ai_next) {
        int one = 1;

        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved_errno = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        saved_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    if (fd < 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "unable to listen on metrics address '%s:%s': %s", shown_host,
                                addr->port, strerror(saved_errno));
    if (getsockname(fd, (struct sockaddr *)&bound, &bound_len) == 0) {
        if (bound.ss_family == AF_INET)
            *port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
        else if (bound.ss_family == AF_INET6)
            *port = ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
    }
    *listen_fd = fd;
    return 0;
}

int
http_server_start(const struct listen_addr *addr, struct metrics *m, struct http_server **server,
                  struct outbox_error *err)
{
    struct http_server *s;
    sigset_t all, previous;
    int rc;

    *server = NULL;
    if (addr->off)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "metrics server is off");
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->listen_fd = s->stop_pipe[0] = s->stop_pipe[1] = -1;
    for (size_t i = 0; i < HTTP_MAX_CONNECTIONS; i++)
        s->connections[i].fd = -1;
    s->metrics = m;
    if (listen_on(addr, &s->listen_fd, &s->port, err) < 0)
        goto fail;
    if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to create a pipe: %s", strerror(errno));
        goto fail;
    }
    /* The thread inherits a full signal mask, so signals reach the relay's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    rc = pthread_create(&s->thread, NULL, server_thread, s);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (rc != 0) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start the metrics thread: %s",
                         strerror(rc));
        goto fail;
    }
    *server = s;
    return 0;

fail:
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->stop_pipe[0] >= 0) {
        close(s->stop_pipe[0]);
        close(s->stop_pipe[1]);
    }
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
    ssize_t n;

    if (server == NULL)
        return;
    do
        n = write(server->stop_pipe[1], "x", 1);
    while (n < 0 && errno == EINTR);
    pthread_join(server->thread, NULL);
    close(server->listen_fd);
    close(server->stop_pipe[0]);
    close(server->stop_pipe[1]);
    free(server);
}
