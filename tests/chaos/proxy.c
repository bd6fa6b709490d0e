/*
 * proxy.c - the chaos driver's loopback TCP proxy (see proxy.h).
 *
 * One accept thread; one thread per proxied connection that polls both
 * sockets with a short timeout, so a cut, a stall or the end of the proxy
 * is noticed within about 50 ms. Writes use a send timeout and are retried
 * in the same loop, so a peer that stops reading cannot pin a thread past
 * a cut.
 */
#include "proxy.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* What every connection does now. */
enum proxy_mode {
    PROXY_NORMAL, /* forward at once */
    PROXY_STALL,  /* forward nothing */
    PROXY_SLOW,   /* forward after slow_ms */
};

struct proxy_connection {
    chaos_proxy *proxy;
    int client;
    int server;
    unsigned cut_generation; /* the proxy's cut count when this one opened */
    atomic_bool finished;    /* the thread is done and can be joined */
    pthread_t thread;
    struct proxy_connection *next;
};

struct chaos_proxy {
    int listen_fd;
    int port;
    int target_port;
    pthread_t accept_thread;
    atomic_bool stopping;
    atomic_uint cut_generation;
    atomic_int mode;
    atomic_int slow_ms;
    atomic_int connect_delay_ms; /* each new connection waits this long before forwarding */
    atomic_uint_fast64_t accepted;
    pthread_mutex_t lock; /* guards connections */
    struct proxy_connection *connections;
};

static void
sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* True when this connection must end now: proxy stopping or a cut since it opened. */
static bool
connection_doomed(const struct proxy_connection *c)
{
    return atomic_load(&c->proxy->stopping) ||
           atomic_load(&c->proxy->cut_generation) != c->cut_generation;
}

/* Closes with RST rather than FIN, as a dropped network would look to the peer. */
static void
close_abruptly(int fd)
{
    struct linger linger = {1, 0};

    setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, sizeof(linger));
    close(fd);
}

/* Writes all of buf unless the connection is doomed or broken; 0 or -1. */
static int
forward_all(const struct proxy_connection *c, int to, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n;

        if (connection_doomed(c))
            return -1;
        n = send(to, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            continue;
        } else {
            return -1;
        }
    }
    return 0;
}

static void *
connection_main(void *arg)
{
    struct proxy_connection *c = arg;
    char buf[16384];

    sleep_ms(atomic_load(&c->proxy->connect_delay_ms)); /* the client's first bytes wait */
    while (!connection_doomed(c)) {
        struct pollfd fds[2] = {{c->client, POLLIN, 0}, {c->server, POLLIN, 0}};
        int mode = atomic_load(&c->proxy->mode);
        int ready;

        if (mode == PROXY_STALL) {
            sleep_ms(50);
            continue;
        }
        ready = poll(fds, 2, 50);
        if (ready < 0 && errno != EINTR)
            break;
        if (ready <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            ssize_t n;

            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            n = recv(fds[i].fd, buf, sizeof(buf), 0);
            if (n <= 0)
                goto done;
            if (mode == PROXY_SLOW)
                sleep_ms(atomic_load(&c->proxy->slow_ms));
            if (forward_all(c, fds[1 - i].fd, buf, (size_t)n) == -1)
                goto done;
        }
    }
done:
    close_abruptly(c->client);
    close_abruptly(c->server);
    atomic_store(&c->finished, true);
    return NULL;
}

/* Joins and frees connections whose thread has ended; all of them when all is set. */
static void
reap_connections(chaos_proxy *proxy, bool all)
{
    pthread_mutex_lock(&proxy->lock);
    for (struct proxy_connection **link = &proxy->connections; *link != NULL;) {
        struct proxy_connection *c = *link;

        if (all || atomic_load(&c->finished)) {
            *link = c->next;
            pthread_join(c->thread, NULL);
            free(c);
        } else {
            link = &c->next;
        }
    }
    pthread_mutex_unlock(&proxy->lock);
}

/* Connects to the target; -1 when it is down (the client then sees its connection close). */
static int
connect_target(int port)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval timeout = {0, 200000};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;

    if (fd == -1)
        return -1;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == -1) {
        close(fd);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void *
accept_main(void *arg)
{
    chaos_proxy *proxy = arg;

    while (!atomic_load(&proxy->stopping)) {
        struct pollfd pfd = {proxy->listen_fd, POLLIN, 0};
        struct timeval timeout = {0, 200000};
        struct proxy_connection *c;
        int client, server, one = 1;

        reap_connections(proxy, false);
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        client = accept4(proxy->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (client == -1)
            continue;
        atomic_fetch_add(&proxy->accepted, 1);
        server = connect_target(proxy->target_port);
        c = server == -1 ? NULL : calloc(1, sizeof(*c));
        if (c == NULL) {
            if (server != -1)
                close(server);
            close_abruptly(client);
            continue;
        }
        setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->proxy = proxy;
        c->client = client;
        c->server = server;
        c->cut_generation = atomic_load(&proxy->cut_generation);
        if (pthread_create(&c->thread, NULL, connection_main, c) != 0) {
            close_abruptly(client);
            close_abruptly(server);
            free(c);
            continue;
        }
        pthread_mutex_lock(&proxy->lock);
        c->next = proxy->connections;
        proxy->connections = c;
        pthread_mutex_unlock(&proxy->lock);
    }
    return NULL;
}

chaos_proxy *
chaos_proxy_start(int target_port, int listen_port)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)listen_port)};
    socklen_t addr_len = sizeof(addr);
    chaos_proxy *proxy = calloc(1, sizeof(*proxy));
    int one = 1;

    if (proxy == NULL)
        return NULL;
    proxy->target_port = target_port;
    pthread_mutex_init(&proxy->lock, NULL);
    proxy->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (proxy->listen_fd == -1)
        goto fail;
    setsockopt(proxy->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(proxy->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) == -1 ||
        listen(proxy->listen_fd, 128) == -1 ||
        getsockname(proxy->listen_fd, (struct sockaddr *)&addr, &addr_len) == -1)
        goto fail;
    proxy->port = ntohs(addr.sin_port);
    if (pthread_create(&proxy->accept_thread, NULL, accept_main, proxy) != 0)
        goto fail;
    return proxy;
fail:
    if (proxy->listen_fd != -1)
        close(proxy->listen_fd);
    pthread_mutex_destroy(&proxy->lock);
    free(proxy);
    return NULL;
}

void
chaos_proxy_free(chaos_proxy *proxy)
{
    if (proxy == NULL)
        return;
    atomic_store(&proxy->stopping, true);
    pthread_join(proxy->accept_thread, NULL);
    reap_connections(proxy, true);
    close(proxy->listen_fd);
    pthread_mutex_destroy(&proxy->lock);
    free(proxy);
}

int
chaos_proxy_port(const chaos_proxy *proxy)
{
    return proxy->port;
}

void
chaos_proxy_cut(chaos_proxy *proxy)
{
    atomic_fetch_add(&proxy->cut_generation, 1);
}

void
chaos_proxy_stall(chaos_proxy *proxy)
{
    atomic_store(&proxy->mode, PROXY_STALL);
}

void
chaos_proxy_slow(chaos_proxy *proxy, int delay_ms)
{
    atomic_store(&proxy->slow_ms, delay_ms);
    atomic_store(&proxy->mode, PROXY_SLOW);
}

void
chaos_proxy_slow_connect(chaos_proxy *proxy, int delay_ms)
{
    atomic_store(&proxy->connect_delay_ms, delay_ms);
}

void
chaos_proxy_normal(chaos_proxy *proxy)
{
    atomic_store(&proxy->mode, PROXY_NORMAL);
}

uint64_t
chaos_proxy_accepted(const chaos_proxy *proxy)
{
    return atomic_load(&((chaos_proxy *)proxy)->accepted);
}
