/*
 * healthcheck.c - the client side of /healthz, for --healthcheck.
 */
#include "healthcheck.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define ANSWER_MAX_BYTES 4096

/* The host to connect to: loopback for a wildcard address, else the one given. */
static const char *
target_host(const struct listen_addr *addr)
{
    if (addr->host[0] == '\0' || strcmp(addr->host, "0.0.0.0") == 0)
        return "127.0.0.1";
    if (strcmp(addr->host, "::") == 0)
        return "::1";
    return addr->host;
}

/* Bounds every connect, send and receive on fd; connect() obeys SO_SNDTIMEO on Linux. */
static void
set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = HEALTHCHECK_TIMEOUT_MS / 1000,
                         .tv_usec = (HEALTHCHECK_TIMEOUT_MS % 1000) * 1000};

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* A connected socket to host:port, or -1 with err naming the address. */
static int
connect_to(const char *host, const char *port, struct outbox_error *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *list = NULL;
    int saved = 0, fd = -1, rc;

    rc = getaddrinfo(host, port, &hints, &list);
    if (rc != 0) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to resolve '%s': %s", host,
                         gai_strerror(rc));
        return -1;
    }
    for (struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        set_timeouts(fd);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    if (fd < 0)
        outbox_error_set(err, saved == EINPROGRESS || saved == EAGAIN ? OUTBOX_ERR_TIMEOUT
                                                                       : OUTBOX_ERR_CONNECTION,
                         "unable to connect to %s port %s: %s", host, port,
                         saved == EINPROGRESS || saved == EAGAIN ? "timed out" : strerror(saved));
    return fd;
}

/* Sends the request and reads the answer to its end into buf; its length, or -1 with err. */
static ssize_t
exchange(int fd, const char *host, char *buf, size_t size, struct outbox_error *err)
{
    char request[512];
    size_t used = 0;
    int length;

    length = snprintf(request, sizeof(request),
                      "GET /healthz HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n", host);
    if (send(fd, request, (size_t)length, MSG_NOSIGNAL) != length)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to send the request: %s",
                                strerror(errno));
    while (used < size - 1) {
        ssize_t n = recv(fd, buf + used, size - 1 - used, 0);

        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return outbox_error_set(err, errno == EAGAIN ? OUTBOX_ERR_TIMEOUT : OUTBOX_ERR_CONNECTION,
                                    "no answer: %s", errno == EAGAIN ? "timed out" : strerror(errno));
        }
        used += (size_t)n;
    }
    buf[used] = '\0';
    return (ssize_t)used;
}

int
healthcheck_run(const struct listen_addr *addr, char *answer, size_t size, struct outbox_error *err)
{
    const char *host = target_host(addr);
    char buf[ANSWER_MAX_BYTES];
    const char *body;
    int status, fd;
    size_t line;

    fd = connect_to(host, addr->port, err);
    if (fd < 0)
        return -1;
    if (exchange(fd, host, buf, sizeof(buf), err) < 0) {
        close(fd);
        return -1;
    }
    close(fd);
    if (sscanf(buf, "HTTP/1.%*1[01] %3d", &status) != 1 || status < 100)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "not an HTTP answer from %s port %s",
                                host, addr->port);
    body = strstr(buf, "\r\n\r\n");
    body = body != NULL ? body + 4 : "";
    line = strcspn(body, "\r\n");
    snprintf(answer, size, "%d %.*s", status, (int)line, body);
    return status == 200 ? 0 : 1;
}
