/*
 * httpd.c - the programs' one HTTP server (see httpd.h).
 *
 * A connection's slot belongs to the loop while it is read, written or
 * lingers, and to one worker between reading and writing; the hand-over
 * goes through two queues under one mutex, and a worker wakes the loop
 * through a pipe, which httpd_stop() writes too.
 */
#include "httpd.h"
#include "httpd_head.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "clock.h"
#include "error.h"
#include "timeouts.h"

/* At most how many bytes a lingering connection discards (for HTTP_LINGER_MS). */
#define HTTP_LINGER_MAX_BYTES (1024 * 1024)

/* Where a connection is; every slot is in exactly one of these. */
enum connection_state {
    CONNECTION_FREE,      /* no connection in this slot */
    CONNECTION_READING,   /* the loop reads its request, until deadline_ms */
    CONNECTION_QUEUED,    /* a worker owns it: a complete (or refused) request to answer */
    CONNECTION_WRITING,   /* the loop writes the answer, until deadline_ms */
    CONNECTION_LINGERING, /* answer sent, write side shut: discarding what the client still sends */
};

struct connection {
    enum connection_state state;
    int fd;
    int64_t opened_ms;   /* when accepted: the oldest reader makes room first */
    uint64_t accept_round; /* the accept_all() round that took it in */
    int64_t deadline_ms; /* of the current state */
    struct buffer in;    /* the request's bytes */
    struct buffer out;   /* the answer's bytes */
    size_t sent;         /* bytes of out written */
    size_t head_len;     /* bytes of the head with its blank line; 0 until it is complete */
    size_t want;         /* head and body, once the head is complete */
    size_t discarded;    /* lingering: bytes thrown away so far */
    char *head;          /* the head, split into request's lines; owned */
    struct httpd_request request;
};

/* A ring of slot numbers; never fuller than there are slots. */
struct slot_queue {
    int slots[HTTPD_MAX_CONNECTIONS];
    size_t head, count;
};

struct httpd {
    struct httpd_options options;
    int listen_fd;
    struct connection connections[HTTPD_MAX_CONNECTIONS];
    pthread_mutex_t lock; /* guards the queues and stopping */
    pthread_cond_t work;  /* a request was queued, or stopping */
    struct slot_queue queued, answered;
    bool stopping;
    atomic_bool stop_requested; /* httpd_stop() was called */
    int wake[2]; /* a worker writes a byte when it answered; httpd_stop() too */
    pthread_t workers[HTTPD_MAX_WORKERS];
    int worker_count;
    pthread_t thread; /* of httpd_start_thread */
    bool threaded;
    int64_t accept_paused_until_ms; /* out of descriptors: no accept before then */
    uint64_t accept_round;          /* counts accept_all() calls */
};

static void
queue_push(struct slot_queue *queue, int slot)
{
    queue->slots[(queue->head + queue->count++) % HTTPD_MAX_CONNECTIONS] = slot;
}

static int
queue_pop(struct slot_queue *queue)
{
    int slot = queue->slots[queue->head];

    queue->head = (queue->head + 1) % HTTPD_MAX_CONNECTIONS;
    queue->count--;
    return slot;
}

/*
 * Looks at what c has read so far: 0 while the request is incomplete, 1
 * when it is complete (head parsed, body in place), else the status to
 * refuse it with.
 */
static int
request_complete(const struct httpd *server, struct connection *c)
{
    const struct httpd_options *o = &server->options;
    char *head;
    size_t length = 0;

    if (c->in.failed)
        return o->read_body ? 413 : 431;
    if (o->refuse_garbage && !httpd_head_plausible(c->in.data, c->in.len))
        return 400;
    if (o->read_body && c->in.len > o->request_max_bytes)
        return 413;
    if (c->head_len == 0) {
        c->head_len = httpd_head_length(c->in.data, c->in.len);
        if (memchr(c->in.data, '\0', c->head_len > 0 ? c->head_len : c->in.len) != NULL) {
            c->request.refused_reason = "a NUL byte in the request head";
            return 400; /* at once: no head ends after one */
        }
        if (c->head_len == 0)
            return c->in.len >= o->request_max_bytes ? (o->read_body ? 413 : 431) : 0;
        if ((head = malloc(c->head_len + 1)) == NULL)
            return o->read_body ? 413 : 431;
        memcpy(head, c->in.data, c->head_len);
        head[c->head_len] = '\0';
        c->head = head;
        if (httpd_head_parse(head, c->head_len, &c->request) < 0)
            c->request.refused = 400; /* answered once the body (if any) is read */
        if (o->read_body && httpd_head_body_length(c->request.lines, c->request.lines_end, &length,
                                        &c->request.refused_reason) < 0)
            return 400;
        c->want = c->head_len + length;
        if (c->want > o->request_max_bytes)
            return 413;
    }
    return c->in.len >= c->want ? 1 : 0;
}

/* ---- slots ---- */

static void
connection_close(struct connection *c)
{
    if (c->state == CONNECTION_FREE)
        return;
    close(c->fd);
    buffer_clear(&c->in);
    buffer_clear(&c->out);
    free(c->head);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->state = CONNECTION_FREE;
}

/* Shuts the write side and lingers a while: unread request bytes must not reset the answer. */
static void
connection_linger(struct connection *c)
{
    buffer_clear(&c->out);
    shutdown(c->fd, SHUT_WR);
    c->state = CONNECTION_LINGERING;
    c->deadline_ms = clock_monotonic_ms() + HTTP_LINGER_MS;
}

/* Writes what the socket takes of c's answer; then lingers or closes, or closes on an error. */
static void
connection_write(const struct httpd *server, struct connection *c)
{
    while (c->sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->sent, c->out.len - c->sent, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return; /* poll for POLLOUT */
        if (n <= 0)
            return connection_close(c); /* client gone */
        c->sent += (size_t)n;
    }
    if (server->options.linger)
        connection_linger(c);
    else
        connection_close(c);
}

/* Starts writing the answer in c->out. */
static void
connection_answered(const struct httpd *server, struct connection *c)
{
    c->state = CONNECTION_WRITING;
    c->deadline_ms = clock_monotonic_ms() + server->options.answer_ms;
    connection_write(server, c);
}

/* Answers c on the loop's thread: a refusal, or any request when there are no workers. */
static void
connection_answer_here(struct httpd *server, struct connection *c)
{
    if (c->request.refused != 0)
        snprintf(c->request.method, sizeof(c->request.method), "GET");
    server->options.answer(server->options.arg, &c->request, &c->out);
    connection_answered(server, c);
}

/* Hands c, complete or refused with status refused, to be answered. */
static void
connection_queue(struct httpd *server, struct connection *c, int refused)
{
    if (refused != 0)
        c->request.refused = refused;
    c->request.body = c->in.data != NULL ? c->in.data + c->head_len : "";
    c->request.body_len = c->request.refused ? 0 : c->want - c->head_len;
    if (c->request.refused != 0 || server->worker_count == 0 ||
        (server->options.quick != NULL && server->options.quick(server->options.arg, &c->request)))
        return connection_answer_here(server, c);
    c->state = CONNECTION_QUEUED;
    pthread_mutex_lock(&server->lock);
    queue_push(&server->queued, (int)(c - server->connections));
    pthread_cond_signal(&server->work);
    pthread_mutex_unlock(&server->lock);
}

/* Reads what the socket has; queues the request once it is complete or refused. */
static void
connection_read(struct httpd *server, struct connection *c)
{
    const struct httpd_options *o = &server->options;
    char chunk[8192];

    for (;;) {
        size_t room = sizeof(chunk);
        ssize_t n;
        int complete;

        if (!o->read_body && o->request_max_bytes - c->in.len < room)
            room = o->request_max_bytes - c->in.len; /* a head never grows past the limit */
        n = read(c->fd, chunk, room);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0 || (n == 0 && (c->in.len == 0 || !o->read_body)))
            return connection_close(c); /* gone, or closed before finishing its request */
        if (n == 0) /* the client ended its side before the end of its request */
            return connection_queue(server, c, 400);
        buffer_append(&c->in, chunk, (size_t)n);
        if ((complete = request_complete(server, c)) != 0)
            return connection_queue(server, c, complete == 1 ? 0 : complete);
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
        if (n <= 0 || (c->discarded += (size_t)n) > HTTP_LINGER_MAX_BYTES)
            return connection_close(c);
    }
}

/*
 * The slot to reuse when every slot is taken: the oldest connection still
 * reading its request (an idle or trickling client), else the oldest
 * lingering one, else the oldest being written; NULL when every slot is
 * with a worker. A reader taken in by this round of accepts is spared: a
 * crowd reconnecting as fast as it is dropped would otherwise push out a
 * probe whose request is on its way, before the loop could read it.
 */
static struct connection *
connection_to_drop(struct httpd *server)
{
    static const enum connection_state order[] = {CONNECTION_READING, CONNECTION_LINGERING,
                                                  CONNECTION_WRITING};

    for (size_t p = 0; p < sizeof(order) / sizeof(order[0]); p++) {
        struct connection *oldest = NULL;

        for (int i = 0; i < server->options.max_connections; i++) {
            struct connection *c = &server->connections[i];

            if (c->state != order[p] ||
                (c->state == CONNECTION_READING && c->accept_round == server->accept_round))
                continue;
            if (oldest == NULL || c->opened_ms < oldest->opened_ms)
                oldest = c;
        }
        if (oldest != NULL)
            return oldest;
    }
    return NULL;
}

static void
peer_name(const struct sockaddr_storage *peer, char *out, size_t size)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (peer->ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)peer)->sin_addr, host,
                  sizeof(host));
    else if (peer->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)peer)->sin6_addr, host,
                  sizeof(host));
    snprintf(out, size, "%s", host);
}

/* A free slot, or the one connection_to_drop() closes for it; NULL when none. */
static struct connection *
free_slot(struct httpd *server)
{
    struct connection *c;

    for (int i = 0; i < server->options.max_connections; i++)
        if (server->connections[i].state == CONNECTION_FREE)
            return &server->connections[i];
    if ((c = connection_to_drop(server)) != NULL)
        connection_close(c);
    return c;
}

/*
 * Accepts every waiting connection, each into a free slot or one made free,
 * and reads what it sent already: a probe's request, there with its
 * connection, is answered before any other connection can push it out.
 */
static void
accept_all(struct httpd *server)
{
    server->accept_round++;
    for (int round = 0; round < server->options.max_connections; round++) {
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof(peer);
        struct connection *c;
        int fd = accept4(server->listen_fd, (struct sockaddr *)&peer, &peer_len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            /* out of descriptors: the pending client stays queued; try again a little later */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                server->accept_paused_until_ms = clock_monotonic_ms() + HTTP_ACCEPT_PAUSE_MS;
            return;
        }
        if ((c = free_slot(server)) == NULL) { /* every slot is being answered */
            close(fd);
            continue;
        }
        c->fd = fd;
        c->state = CONNECTION_READING;
        c->opened_ms = clock_monotonic_ms();
        c->deadline_ms = c->opened_ms + server->options.request_ms;
        c->accept_round = server->accept_round;
        peer_name(&peer, c->request.peer, sizeof(c->request.peer));
        connection_read(server, c);
    }
}

/* ---- workers ---- */

static void *
worker_main(void *arg)
{
    struct httpd *server = arg;
    const struct httpd_options *o = &server->options;

    if (o->worker_begin != NULL)
        o->worker_begin(o->arg);
    pthread_mutex_lock(&server->lock);
    for (;;) {
        struct connection *c;

        while (!server->stopping && server->queued.count == 0)
            pthread_cond_wait(&server->work, &server->lock);
        if (server->queued.count == 0)
            break;
        c = &server->connections[queue_pop(&server->queued)];
        pthread_mutex_unlock(&server->lock);
        o->answer(o->arg, &c->request, &c->out);
        pthread_mutex_lock(&server->lock);
        queue_push(&server->answered, (int)(c - server->connections));
        if (write(server->wake[1], "", 1) < 0) {
            /* the pipe is full: the loop has wake-ups enough to come */
        }
    }
    pthread_mutex_unlock(&server->lock);
    if (o->worker_end != NULL)
        o->worker_end(o->arg);
    return NULL;
}

/* Takes the answers the workers finished and starts writing them. */
static void
take_answers(struct httpd *server)
{
    char drain[256];

    while (read(server->wake[0], drain, sizeof(drain)) > 0)
        ;
    pthread_mutex_lock(&server->lock);
    while (server->answered.count > 0) {
        struct connection *c = &server->connections[queue_pop(&server->answered)];

        c->state = CONNECTION_WRITING;
        c->deadline_ms = clock_monotonic_ms() + server->options.answer_ms;
    }
    pthread_mutex_unlock(&server->lock);
}

/* Starts the workers, which block SIGINT and SIGTERM: the loop's poll() is the one they stop. */
static void
start_workers(struct httpd *server)
{
    sigset_t stop_signals, old_mask;

    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
    for (int i = 0; i < server->options.workers; i++) {
        if (pthread_create(&server->workers[i], NULL, worker_main, server) != 0)
            break;
        server->worker_count++;
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
}

/* ---- the loop ---- */

/*
 * Refuses a request past its deadline (408, or a close) and drops an answer
 * or a linger past its deadline; the milliseconds to the nearest deadline,
 * -1 for none.
 */
static int64_t
expire(struct httpd *server, int64_t now)
{
    int64_t next = -1;

    if (now < server->accept_paused_until_ms)
        next = server->accept_paused_until_ms;
    for (int i = 0; i < server->options.max_connections; i++) {
        struct connection *c = &server->connections[i];

        if (c->state == CONNECTION_FREE || c->state == CONNECTION_QUEUED)
            continue;
        if (c->deadline_ms <= now) {
            if (c->state == CONNECTION_READING && server->options.answer_late_requests)
                connection_queue(server, c, 408);
            else
                connection_close(c);
            continue;
        }
        if (next < 0 || c->deadline_ms < next)
            next = c->deadline_ms;
    }
    return next < 0 ? -1 : next - now;
}

/* Serves what poll() found ready on connection c. */
static void
serve_connection(struct httpd *server, struct connection *c)
{
    if (c->state == CONNECTION_READING)
        connection_read(server, c);
    else if (c->state == CONNECTION_WRITING)
        connection_write(server, c);
    else if (c->state == CONNECTION_LINGERING)
        connection_discard(c);
}

/* One turn: wait for sockets or the deadline nearest, then read, write and accept. */
static void
serve_turn(struct httpd *server, int64_t longest_ms)
{
    struct pollfd pfds[HTTPD_MAX_CONNECTIONS + 2];
    int slot_of[HTTPD_MAX_CONNECTIONS + 2];
    int64_t now = clock_monotonic_ms(), wait = expire(server, now);
    int count = 2;

    if (longest_ms >= 0 && (wait < 0 || wait > longest_ms))
        wait = longest_ms;
    pfds[0] = (struct pollfd){server->listen_fd, now < server->accept_paused_until_ms ? 0 : POLLIN,
                              0};
    pfds[1] = (struct pollfd){server->wake[0], POLLIN, 0};
    for (int i = 0; i < server->options.max_connections; i++) {
        struct connection *c = &server->connections[i];

        if (c->state == CONNECTION_FREE || c->state == CONNECTION_QUEUED)
            continue;
        pfds[count] = (struct pollfd){c->fd, c->state == CONNECTION_WRITING ? POLLOUT : POLLIN, 0};
        slot_of[count++] = i;
    }
    if (poll(pfds, (nfds_t)count, (int)wait) <= 0)
        return;
    for (int k = 2; k < count; k++)
        if (pfds[k].revents != 0)
            serve_connection(server, &server->connections[slot_of[k]]);
    if (pfds[1].revents != 0)
        take_answers(server);
    if (pfds[0].revents != 0)
        accept_all(server);
}

/* Stops the workers once they finished what they hold, then closes every connection. */
static void
stop_serving(struct httpd *server)
{
    pthread_mutex_lock(&server->lock);
    server->stopping = true;
    pthread_cond_broadcast(&server->work);
    pthread_mutex_unlock(&server->lock);
    for (int i = 0; i < server->worker_count; i++)
        pthread_join(server->workers[i], NULL);
    server->worker_count = 0;
    take_answers(server);
    for (int i = 0; i < server->options.max_connections; i++) {
        struct connection *c = &server->connections[i];

        if (c->state == CONNECTION_WRITING) {
            server->options.linger = false;
            connection_write(server, c); /* what the socket takes now, no waiting */
        }
        connection_close(c);
    }
}

/* ---- public ---- */

struct httpd *
httpd_new(int listen_fd, const struct httpd_options *options)
{
    struct httpd *server = calloc(1, sizeof(*server));

    if (server == NULL)
        return NULL;
    if (pipe2(server->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
        free(server);
        return NULL;
    }
    server->options = *options;
    if (server->options.max_connections <= 0 ||
        server->options.max_connections > HTTPD_MAX_CONNECTIONS)
        server->options.max_connections = HTTPD_MAX_CONNECTIONS;
    if (server->options.workers > HTTPD_MAX_WORKERS)
        server->options.workers = HTTPD_MAX_WORKERS;
    server->listen_fd = listen_fd;
    for (int i = 0; i < HTTPD_MAX_CONNECTIONS; i++)
        server->connections[i].fd = -1;
    atomic_init(&server->stop_requested, false);
    pthread_mutex_init(&server->lock, NULL);
    pthread_cond_init(&server->work, NULL);
    fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    return server;
}

int
httpd_run(struct httpd *server, volatile sig_atomic_t *stop)
{
    start_workers(server);
    if (server->options.workers > 0 && server->worker_count == 0)
        return -1;
    while ((stop == NULL || !*stop) && !atomic_load(&server->stop_requested))
        serve_turn(server, stop != NULL ? HTTP_STOP_CHECK_MS : -1);
    stop_serving(server);
    return 0;
}

/* The thread of httpd_start_thread. */
static void *
server_thread(void *arg)
{
    httpd_run(arg, NULL);
    return NULL;
}

int
httpd_start_thread(struct httpd *server)
{
    sigset_t all, previous;
    int rc;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    rc = pthread_create(&server->thread, NULL, server_thread, server);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    server->threaded = true;
    return 0;
}

void
httpd_stop(struct httpd *server)
{
    ssize_t n;

    if (server == NULL)
        return;
    atomic_store(&server->stop_requested, true);
    do
        n = write(server->wake[1], "x", 1);
    while (n < 0 && errno == EINTR);
    if (server->threaded) {
        pthread_join(server->thread, NULL);
        server->threaded = false;
    }
}

void
httpd_free(struct httpd *server)
{
    if (server == NULL)
        return;
    close(server->wake[0]);
    close(server->wake[1]);
    pthread_cond_destroy(&server->work);
    pthread_mutex_destroy(&server->lock);
    free(server);
}
