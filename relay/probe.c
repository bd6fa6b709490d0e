/*
 * probe.c - whether database servers answer at all, many at once. See probe.h.
 */
#include "probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"

/* The PostgreSQL SSLRequest: its length, then the code 1234.5679. */
#define PROBE_SSL_REQUEST_CODE 80877103u

enum probe_state { PROBE_CONNECTING, PROBE_READING, PROBE_DONE };

/* One server being probed: where it listens (the key URLs are matched on), its socket. */
struct probe {
    char key[1100]; /* "host:port" or "/socket/dir:port" */
    int fd;
    enum probe_state state;
    enum probe_answer answer;
};

/* The value of keyword in options, "" when it has none. */
static const char *
option_value(const PQconninfoOption *options, const char *keyword)
{
    for (const PQconninfoOption *o = options; o != NULL && o->keyword != NULL; o++)
        if (strcmp(o->keyword, keyword) == 0 && o->val != NULL)
            return o->val;
    return "";
}

/*
 * Where url's server listens, as "host:port" into key, with its host and
 * port apart; false when it cannot be probed alone (no host, several).
 */
static bool
probe_server_of(const char *url, char *key, size_t key_size, char *host, size_t host_size,
                char *port, size_t port_size)
{
    PQconninfoOption *options = PQconninfoParse(url, NULL);
    const char *address, *number;
    bool one;

    if (options == NULL)
        return false;
    address = option_value(options, "hostaddr");
    if (address[0] == '\0')
        address = option_value(options, "host");
    if (address[0] == '\0' && getenv("PGHOST") != NULL)
        address = getenv("PGHOST");
    number = option_value(options, "port");
    if (number[0] == '\0')
        number = getenv("PGPORT") != NULL ? getenv("PGPORT") : "5432";
    one = address[0] != '\0' && strchr(address, ',') == NULL && strchr(number, ',') == NULL &&
          (size_t)snprintf(host, host_size, "%s", address) < host_size &&
          (size_t)snprintf(port, port_size, "%s", number) < port_size &&
          (size_t)snprintf(key, key_size, "%s:%s", address, number) < key_size;
    PQconninfoFree(options);
    return one;
}

/* Sends the SSLRequest on probe's connected socket: reading next, or done (silent). */
static void
send_request(struct probe *probe)
{
    uint32_t request[2] = {htonl(8), htonl(PROBE_SSL_REQUEST_CODE)};
    int error = 0;
    socklen_t length = sizeof(error);

    if (getsockopt(probe->fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0 ||
        send(probe->fd, request, sizeof(request), MSG_NOSIGNAL) != (ssize_t)sizeof(request)) {
        probe->state = PROBE_DONE;
        return;
    }
    probe->state = PROBE_READING;
}

/* Starts probe's connect to host:port (a Unix socket's directory when host starts with /). */
static void
start(struct probe *probe, const char *host, const char *port)
{
    struct sockaddr_un local = {.sun_family = AF_UNIX};
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *found = NULL;
    int rc;

    probe->state = PROBE_DONE;
    probe->answer = PROBE_UNKNOWN;
    probe->fd = -1;
    if (host[0] == '/') {
        if ((size_t)snprintf(local.sun_path, sizeof(local.sun_path), "%s/.s.PGSQL.%s", host,
                             port) >= sizeof(local.sun_path))
            return;
        probe->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        rc = probe->fd < 0 ? -1 : connect(probe->fd, (struct sockaddr *)&local, sizeof(local));
    } else {
        if (getaddrinfo(host, port, &hints, &found) != 0)
            return;
        probe->fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        rc = probe->fd < 0 ? -1 : connect(probe->fd, found->ai_addr, found->ai_addrlen);
        freeaddrinfo(found);
    }
    if (probe->fd < 0)
        return;
    probe->answer = PROBE_SILENT;
    if (rc == 0)
        send_request(probe);
    else if (errno == EINPROGRESS || errno == EAGAIN)
        probe->state = PROBE_CONNECTING;
}

/* Moves probe on after poll() saw revents on its socket. */
static void
step(struct probe *probe, short revents)
{
    char answer;

    if (probe->state == PROBE_CONNECTING)
        send_request(probe);
    else if (revents & (POLLIN | POLLHUP | POLLERR)) {
        if (recv(probe->fd, &answer, 1, 0) == 1)
            probe->answer = PROBE_ANSWERED;
        probe->state = PROBE_DONE;
    }
}

/* Polls the probes until each is done or timeout_ms passed. */
static void
poll_probes(struct probe *probes, size_t count, int timeout_ms)
{
    struct pollfd *fds = calloc(count, sizeof(*fds));
    size_t *which = calloc(count, sizeof(*which));
    double deadline = clock_monotonic_seconds() + timeout_ms / 1000.0;

    while (fds != NULL && which != NULL) {
        size_t open = 0;
        double left = deadline - clock_monotonic_seconds();

        for (size_t i = 0; i < count; i++)
            if (probes[i].state != PROBE_DONE) {
                fds[open] = (struct pollfd){
                    .fd = probes[i].fd,
                    .events = probes[i].state == PROBE_CONNECTING ? POLLOUT : POLLIN};
                which[open++] = i;
            }
        if (open == 0 || left <= 0 || poll(fds, open, (int)(left * 1000) + 1) < 0)
            break;
        for (size_t k = 0; k < open; k++)
            if (fds[k].revents != 0)
                step(&probes[which[k]], fds[k].revents);
    }
    free(fds);
    free(which);
}

void
probe_servers(const char *const *urls, size_t count, int timeout_ms, enum probe_answer *answers)
{
    struct probe *probes = calloc(count > 0 ? count : 1, sizeof(*probes));
    size_t *of_url = calloc(count > 0 ? count : 1, sizeof(*of_url));
    size_t servers = 0;

    for (size_t i = 0; i < count; i++)
        answers[i] = PROBE_UNKNOWN;
    if (probes == NULL || of_url == NULL) {
        free(probes);
        free(of_url);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        char key[sizeof(probes->key)], host[1024], port[32];
        size_t s = 0;

        of_url[i] = SIZE_MAX;
        if (!probe_server_of(urls[i], key, sizeof(key), host, sizeof(host), port, sizeof(port)))
            continue;
        while (s < servers && strcmp(probes[s].key, key) != 0)
            s++;
        if (s == servers) {
            snprintf(probes[s].key, sizeof(probes[s].key), "%s", key);
            start(&probes[s], host, port);
            servers++;
        }
        of_url[i] = s;
    }
    poll_probes(probes, servers, timeout_ms);
    for (size_t s = 0; s < servers; s++)
        if (probes[s].fd >= 0)
            close(probes[s].fd);
    for (size_t i = 0; i < count; i++)
        if (of_url[i] != SIZE_MAX)
            answers[i] = probes[of_url[i]].answer;
    free(probes);
    free(of_url);
}
