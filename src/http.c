/*
 * http.c - a poll() driven single-connection HTTP server for metrics and health.
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

#include "error.h"

struct http_server {
    int listen_fd;
    int stop_pipe[2]; /* [0] polled by the thread, [1] written by http_server_stop */
    int port;
    struct metrics *metrics;
    pthread_t thread;
};

int
http_addr_parse(const char *text, struct http_addr *addr, struct outbox_error *err)
{
    const char *colon, *host, *port;
    size_t host_len;
    unsigned value = 0;

    memset(addr, 0, sizeof(*addr));
    if (text == NULL)
        text = "";
    if (strcmp(text, "off") == 0) {
        addr->off = true;
        return 0;
    }
    if (text[0] == '[') {
        const char *close = strchr(text, ']');

        if (close == NULL || close[1] != ':')
            goto invalid;
        host = text + 1;
        host_len = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            goto invalid;
        host = text;
        host_len = (size_t)(colon - text);
        if (memchr(host, ':', host_len) != NULL)
            goto invalid; /* IPv6 needs brackets */
    }
    port = colon + 1;
    if (host_len >= sizeof(addr->host) || port[0] == '\0' || strlen(port) > 5)
        goto invalid;
    for (const char *p = port; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            goto invalid;
        value = value * 10 + (unsigned)(*p - '0');
    }
    if (value > 65535)
        goto invalid;
    memcpy(addr->host, host, host_len);
    addr->host[host_len] = '\0';
    snprintf(addr->port, sizeof(addr->port), "%u", value & 0xffffu);
    return 0;

invalid:
    memset(addr, 0, sizeof(*addr));
    return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                            "invalid --metrics-addr '%s': expected HOST:PORT or off", text);
}

/* Milliseconds on the monotonic clock, for request deadlines. */
static int64_t
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Waits until fd has events or the deadline passes or stop is requested.
 * Returns 1 when fd is ready, 0 on timeout or stop.
 */
static int
wait_fd(struct http_server *s, int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd fds[2] = {{fd, events, 0}, {s->stop_pipe[0], POLLIN, 0}};
        int64_t left = deadline - now_ms();
        int n;

        if (left <= 0)
            return 0;
        n = poll(fds, 2, (int)(left > 1000 ? 1000 : left));
        if (n < 0 && errno != EINTR)
            return 0;
        if (n <= 0)
            continue;
        if (fds[1].revents != 0)
            return 0;
        if (fds[0].revents != 0)
            return 1;
    }
}

/* Sends all of data before the deadline; false when the client is gone or too slow. */
static bool
send_all(struct http_server *s, int fd, const char *data, size_t len, int64_t deadline)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return false;
            if (!wait_fd(s, fd, POLLOUT, deadline))
                return false;
            continue;
        }
        data += n;
        len -= (size_t)n;
    }
    return true;
}

static void
respond(struct http_server *s, int fd, int64_t deadline, int status, const char *reason,
        const char *content_type, const char *extra_headers, const char *body, size_t body_len,
        bool head_only)
{
    char header[512];
    int n;

    n = snprintf(header, sizeof(header),
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n%s\r\n",
                 status, reason, content_type, body_len, extra_headers ? extra_headers : "");
    if (n < 0 || (size_t)n >= sizeof(header))
        return;
    if (!send_all(s, fd, header, (size_t)n, deadline))
        return;
    if (!head_only)
        send_all(s, fd, body, body_len, deadline);
}

static void
respond_text(struct http_server *s, int fd, int64_t deadline, int status, const char *reason,
             const char *body, bool head_only)
{
    respond(s, fd, deadline, status, reason, "text/plain; charset=utf-8",
            status == 405 ? "Allow: GET, HEAD\r\n" : NULL, body, strlen(body), head_only);
}

/* Answers a parsed GET or HEAD of path. */
static void
route(struct http_server *s, int fd, int64_t deadline, const char *path, bool head_only)
{
    char reason[160], body[192];
    bool ready = false;

    if (strcmp(path, "/metrics") == 0) {
        size_t len = 0;
        char *text = metrics_render(s->metrics, &len);

        if (text == NULL) {
            respond_text(s, fd, deadline, 500, "Internal Server Error", "out of memory\n",
                         head_only);
            return;
        }
        respond(s, fd, deadline, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", NULL, text,
                len, head_only);
        free(text);
    } else if (strcmp(path, "/healthz") == 0) {
        bool healthy = metrics_health(s->metrics, reason, sizeof(reason), NULL);

        snprintf(body, sizeof(body), "%s\n", reason);
        respond_text(s, fd, deadline, healthy ? 200 : 503, healthy ? "OK" : "Service Unavailable",
                     body, head_only);
    } else if (strcmp(path, "/readyz") == 0) {
        metrics_health(s->metrics, reason, sizeof(reason), &ready);
        snprintf(body, sizeof(body), "%s\n", ready ? "ready" : reason);
        respond_text(s, fd, deadline, ready ? 200 : 503, ready ? "OK" : "Service Unavailable", body,
                     head_only);
    } else {
        respond_text(s, fd, deadline, 404, "Not Found", "not found\n", head_only);
    }
}

/* Reads one request from a connected client and answers it. */
static void
serve_connection(struct http_server *s, int fd)
{
    char request[HTTP_REQUEST_MAX_BYTES + 1];
    size_t len = 0;
    int64_t deadline = now_ms() + HTTP_REQUEST_TIMEOUT_SECONDS * 1000;
    char *line_end, *method, *target, *version, *save = NULL;
    bool head_only;

    /* Read until the blank line that ends the headers; a body is never needed. */
    for (;;) {
        ssize_t n;

        if (len == HTTP_REQUEST_MAX_BYTES) {
            respond_text(s, fd, deadline, 431, "Request Header Fields Too Large",
                         "request too large\n", false);
            return;
        }
        n = recv(fd, request + len, HTTP_REQUEST_MAX_BYTES - len, 0);
        if (n > 0) {
            len += (size_t)n;
            request[len] = '\0';
            if (strstr(request, "\r\n\r\n") != NULL || strstr(request, "\n\n") != NULL)
                break;
            continue;
        }
        if (n == 0)
            return; /* client closed before finishing its request */
        if (errno == EINTR)
            continue;
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || !wait_fd(s, fd, POLLIN, deadline))
            return;
    }

    line_end = strpbrk(request, "\r\n");
    *line_end = '\0';
    method = strtok_r(request, " ", &save);
    target = strtok_r(NULL, " ", &save);
    version = strtok_r(NULL, " ", &save);
    if (method == NULL || target == NULL || version == NULL || strtok_r(NULL, " ", &save) != NULL ||
        strncmp(version, "HTTP/1.", 7) != 0 || target[0] != '/') {
        respond_text(s, fd, deadline, 400, "Bad Request", "bad request\n", false);
        return;
    }
    head_only = strcmp(method, "HEAD") == 0;
    if (strcmp(method, "GET") != 0 && !head_only) {
        respond_text(s, fd, deadline, 405, "Method Not Allowed", "method not allowed\n", false);
        return;
    }
    target[strcspn(target, "?#")] = '\0';
    route(s, fd, deadline, target, head_only);
}

/*
 * Closes a client connection after the answer: half-close, then discard
 * what the client still sends for a short while, so unread request bytes do
 * not make the kernel reset the connection and drop the answer in flight.
 */
static void
close_lingering(struct http_server *s, int fd)
{
    int64_t deadline = now_ms() + 1000;
    char discard[4096];
    size_t total = 0;

    shutdown(fd, SHUT_WR);
    while (total < 1024 * 1024) {
        ssize_t n = recv(fd, discard, sizeof(discard), 0);

        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(s, fd, POLLIN, deadline))
            continue;
        break;
    }
    close(fd);
}

static void *
server_thread(void *arg)
{
    struct http_server *s = arg;

    for (;;) {
        struct pollfd fds[2] = {{s->listen_fd, POLLIN, 0}, {s->stop_pipe[0], POLLIN, 0}};
        int fd;

        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[1].revents != 0)
            break;
        if (fds[0].revents == 0)
            continue;
        fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            continue; /* client gone, or out of descriptors: try again on the next event */
        serve_connection(s, fd);
        close_lingering(s, fd);
    }
    return NULL;
}

/* Opens, binds and listens on addr; -1 with OUTBOX_ERR_CONFIG naming the address. */
static int
listen_on(const struct http_addr *addr, int *listen_fd, int *port, struct outbox_error *err)
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
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 16) == 0)
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
http_server_start(const struct http_addr *addr, struct metrics *m, struct http_server **server,
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
