/*
 * console_server.c - the console's connections: a poll() loop that reads
 * requests and writes answers without blocking, and a few worker threads
 * that answer (see console_server.h).
 *
 * A connection's slot belongs to the loop while it is read or written and
 * to one worker between the two; the hand-over goes through two queues
 * under one mutex, and a worker wakes the loop through a pipe.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "console.h"
#include "console_server.h"

/* Where a connection is; every slot is in exactly one of these. */
enum connection_state {
    CONNECTION_FREE,     /* no connection in this slot */
    CONNECTION_READING,  /* the loop reads its request, until deadline_ms */
    CONNECTION_QUEUED,   /* a worker owns it: a complete (or refused) request to answer */
    CONNECTION_WRITING,  /* the loop writes the answer, until deadline_ms */
};

struct connection {
    enum connection_state state;
    int fd;
    int64_t opened_ms;   /* when accepted: the oldest reader makes room first */
    int64_t deadline_ms; /* of the request while reading, of the answer while writing */
    struct buffer in;    /* the request's bytes */
    struct buffer out;   /* the answer's bytes */
    size_t sent;         /* bytes of out written */
    size_t head_len;     /* bytes of the head with its blank line; 0 until it is complete */
    size_t want;         /* head and body, once the head is complete */
    struct console_request request;
};

/* A ring of slot numbers; never fuller than there are slots. */
struct slot_queue {
    int slots[CONSOLE_MAX_CONNECTIONS];
    size_t head, count;
};

struct server {
    struct console *console;
    console_answer_fn *answer;
    struct connection connections[CONSOLE_MAX_CONNECTIONS];
    pthread_mutex_t lock; /* guards the queues and stopping */
    pthread_cond_t work;  /* a request was queued, or stopping */
    struct slot_queue queued, answered;
    bool stopping;
    int wake[2]; /* a worker writes a byte when it answered */
    pthread_t workers[CONSOLE_WORKERS];
    int worker_count;
};

static int64_t
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
queue_push(struct slot_queue *queue, int slot)
{
    queue->slots[(queue->head + queue->count++) % CONSOLE_MAX_CONNECTIONS] = slot;
}

static int
queue_pop(struct slot_queue *queue)
{
    int slot = queue->slots[queue->head];

    queue->head = (queue->head + 1) % CONSOLE_MAX_CONNECTIONS;
    queue->count--;
    return slot;
}

/* ---- request heads ---- */

/* Finds header name (case-insensitive) among the NUL-separated lines [lines, end). */
static const char *
find_header(char *lines, const char *end, const char *name)
{
    size_t name_len = strlen(name);

    for (char *line = lines; line < end; line += strlen(line) + 1) {
        if (strncasecmp(line, name, name_len) == 0 && line[name_len] == ':') {
            const char *value = line + name_len + 1;

            while (*value == ' ' || *value == '\t')
                value++;
            return value;
        }
    }
    return NULL;
}

/* Splits the request line and headers of head (NUL-terminated at the blank line). */
static int
parse_head(char *head, size_t head_len, struct console_request *request)
{
    char *line_end, *target, *version, *query;
    char *end = head + head_len;

    for (char *p = head; p < end; p++)
        if (*p == '\r' || *p == '\n')
            *p = '\0';
    line_end = head + strlen(head);
    target = strchr(head, ' ');
    if (target == NULL)
        return -1;
    *target++ = '\0';
    version = strchr(target, ' ');
    if (version == NULL || strncmp(version + 1, "HTTP/1.", 7) != 0)
        return -1;
    *version = '\0';
    if (strlen(head) >= sizeof(request->method) || target[0] != '/')
        return -1;
    snprintf(request->method, sizeof(request->method), "%s", head);
    if ((query = strchr(target, '?')) != NULL) {
        *query++ = '\0';
        if (strlen(query) >= sizeof(request->query))
            return -1;
        snprintf(request->query, sizeof(request->query), "%s", query);
    }
    if (strlen(target) >= sizeof(request->path))
        return -1;
    snprintf(request->path, sizeof(request->path), "%s", target);
    while (line_end < end && *line_end == '\0')
        line_end++;
    request->authorization = find_header(line_end, end, "Authorization");
    request->cookie = find_header(line_end, end, "Cookie");
    request->csrf_header = find_header(line_end, end, "X-CSRF-Token");
    request->content_type = find_header(line_end, end, "Content-Type");
    request->host = find_header(line_end, end, "Host");
    request->origin = find_header(line_end, end, "Origin");
    return 0;
}

/*
 * Reads the body's length from the head lines [lines, end) into *length:
 * 0, or -1 with *reason when the head gives it in any way but one plain
 * decimal Content-Length (or none: no body).
 */
static int
body_length(char *lines, const char *end, size_t *length, const char **reason)
{
    const char *value = find_header(lines, end, "Content-Length");
    size_t digits;

    *length = 0;
    if (find_header(lines, end, "Transfer-Encoding") != NULL) {
        *reason = "Transfer-Encoding is not supported: send the body with a Content-Length";
        return -1;
    }
    if (value == NULL)
        return 0;
    digits = strspn(value, "0123456789");
    if (digits == 0 || digits > 9 || strspn(value + digits, " \t") != strlen(value + digits)) {
        *reason = "bad Content-Length: one decimal number of bytes expected";
        return -1;
    }
    if (find_header((char *)value + strlen(value) + 1, end, "Content-Length") != NULL) {
        *reason = "bad Content-Length: given more than once";
        return -1;
    }
    *length = (size_t)strtoul(value, NULL, 10);
    return 0;
}

/*
 * Looks at what c has read so far: 0 while the request is incomplete, 1
 * when it is complete (head_len and want set), else the status to refuse
 * it with (400 with c->request.refused_reason, 413).
 */
static int
request_complete(struct connection *c)
{
    const char *blank;
    char *lines;
    size_t length;
    int rc;

    if (c->in.failed || c->in.len > CONSOLE_REQUEST_MAX_BYTES)
        return 413;
    if (c->head_len == 0) {
        if ((blank = strstr(c->in.data, "\r\n\r\n")) == NULL)
            return 0;
        c->head_len = (size_t)(blank - c->in.data) + 4;
        if ((lines = strndup(c->in.data, c->head_len)) == NULL)
            return 413;
        for (char *p = lines; *p != '\0'; p++)
            if (*p == '\r' || *p == '\n')
                *p = '\0';
        rc = body_length(lines, lines + c->head_len, &length, &c->request.refused_reason);
        free(lines);
        if (rc < 0)
            return 400;
        c->want = c->head_len + length;
        if (c->want > CONSOLE_REQUEST_MAX_BYTES)
            return 413;
    }
    return c->in.len >= c->want ? 1 : 0;
}

/* ---- slots ---- */

static void
connection_close(struct connection *c)
{
    close(c->fd);
    buffer_clear(&c->in);
    buffer_clear(&c->out);
    memset(c, 0, sizeof(*c));
    c->state = CONNECTION_FREE;
}

/* Hands c, complete or refused with status refused, to the workers. */
static void
connection_queue(struct server *server, struct connection *c, int refused)
{
    c->request.refused = refused;
    if (refused == 0 && parse_head(c->in.data, c->head_len - 2, &c->request) < 0)
        c->request.refused = 400;
    if (c->request.refused != 0)
        snprintf(c->request.method, sizeof(c->request.method), "GET");
    c->request.body = c->in.data + c->head_len;
    c->request.body_len = c->request.refused ? 0 : c->want - c->head_len;
    c->state = CONNECTION_QUEUED;
    pthread_mutex_lock(&server->lock);
    queue_push(&server->queued, (int)(c - server->connections));
    pthread_cond_signal(&server->work);
    pthread_mutex_unlock(&server->lock);
}

/* Writes what the socket takes of c's answer; closes c when all is written or on an error. */
static void
connection_write(struct connection *c)
{
    while (c->sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->sent, c->out.len - c->sent, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0)
            break;
        c->sent += (size_t)n;
    }
    connection_close(c);
}

/* Starts writing answer bytes the loop built itself (a refusal, without a worker). */
static void
connection_refuse(struct server *server, struct connection *c, int status)
{
    c->request.refused = status;
    snprintf(c->request.method, sizeof(c->request.method), "GET");
    server->answer(server->console, &c->request, &c->out);
    c->state = CONNECTION_WRITING;
    c->deadline_ms = now_ms() + CONSOLE_ANSWER_SECONDS * 1000;
    connection_write(c);
}

/* Reads what the socket has; queues the request once it is complete. */
static void
connection_read(struct server *server, struct connection *c)
{
    char chunk[8192];

    for (;;) {
        ssize_t n = read(c->fd, chunk, sizeof(chunk));
        int complete;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0 || (n == 0 && c->in.len == 0))
            return connection_close(c);
        if (n == 0) /* the client ended its side before the end of its request */
            return connection_queue(server, c, 400);
        buffer_append(&c->in, chunk, (size_t)n);
        if ((complete = request_complete(c)) != 0)
            return connection_queue(server, c, complete == 1 ? 0 : complete);
    }
}

/* The connection that has been reading the longest; NULL when none is reading. */
static struct connection *
oldest_reader(struct server *server)
{
    struct connection *oldest = NULL;

    for (int i = 0; i < CONSOLE_MAX_CONNECTIONS; i++) {
        struct connection *c = &server->connections[i];

        if (c->state == CONNECTION_READING && (oldest == NULL || c->opened_ms < oldest->opened_ms))
            oldest = c;
    }
    return oldest;
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

/* Accepts every waiting connection, each into a free slot or the oldest reader's. */
static void
accept_all(struct server *server, int listen_fd)
{
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof(peer);
        struct connection *c = NULL;
        int fd = accept4(listen_fd, (struct sockaddr *)&peer, &peer_len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0)
            return;
        for (int i = 0; i < CONSOLE_MAX_CONNECTIONS && c == NULL; i++)
            if (server->connections[i].state == CONNECTION_FREE)
                c = &server->connections[i];
        if (c == NULL && (c = oldest_reader(server)) != NULL)
            connection_close(c);
        if (c == NULL) { /* every slot is being answered: no room for more */
            close(fd);
            continue;
        }
        c->fd = fd;
        c->state = CONNECTION_READING;
        c->opened_ms = now_ms();
        c->deadline_ms = c->opened_ms + CONSOLE_REQUEST_SECONDS * 1000;
        peer_name(&peer, c->request.peer, sizeof(c->request.peer));
    }
}

/* ---- workers ---- */

static void *
worker_main(void *arg)
{
    struct server *server = arg;

    console_database(server->console); /* connect early: a wrong URL shows at start */
    pthread_mutex_lock(&server->lock);
    for (;;) {
        struct connection *c;

        while (!server->stopping && server->queued.count == 0)
            pthread_cond_wait(&server->work, &server->lock);
        if (server->queued.count == 0)
            break;
        c = &server->connections[queue_pop(&server->queued)];
        pthread_mutex_unlock(&server->lock);
        server->answer(server->console, &c->request, &c->out);
        pthread_mutex_lock(&server->lock);
        queue_push(&server->answered, (int)(c - server->connections));
        if (write(server->wake[1], "", 1) < 0) {
            /* the pipe is full: the loop has wake-ups enough to come */
        }
    }
    pthread_mutex_unlock(&server->lock);
    console_database_close();
    return NULL;
}

/* Takes the answers the workers finished and starts writing them. */
static void
take_answers(struct server *server)
{
    char drain[256];

    while (read(server->wake[0], drain, sizeof(drain)) > 0)
        ;
    pthread_mutex_lock(&server->lock);
    while (server->answered.count > 0) {
        struct connection *c = &server->connections[queue_pop(&server->answered)];

        c->state = CONNECTION_WRITING;
        c->deadline_ms = now_ms() + CONSOLE_ANSWER_SECONDS * 1000;
    }
    pthread_mutex_unlock(&server->lock);
}

/* ---- the loop ---- */

/* Refuses a request past its deadline (408) and drops an answer past its deadline. */
static int
expire(struct server *server, int64_t now)
{
    int64_t next = now + 1000;

    for (int i = 0; i < CONSOLE_MAX_CONNECTIONS; i++) {
        struct connection *c = &server->connections[i];

        if (c->state != CONNECTION_READING && c->state != CONNECTION_WRITING)
            continue;
        if (c->deadline_ms <= now) {
            if (c->state == CONNECTION_READING)
                connection_refuse(server, c, 408);
            else
                connection_close(c);
            continue;
        }
        if (c->deadline_ms < next)
            next = c->deadline_ms;
    }
    return (int)(next - now);
}

/* One turn: wait for sockets or the deadline nearest, then read, write and accept. */
static void
serve_turn(struct server *server, int listen_fd)
{
    struct pollfd pfds[CONSOLE_MAX_CONNECTIONS + 2];
    int slot_of[CONSOLE_MAX_CONNECTIONS + 2];
    int count = 2, timeout = expire(server, now_ms());

    pfds[0] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
    pfds[1] = (struct pollfd){.fd = server->wake[0], .events = POLLIN};
    for (int i = 0; i < CONSOLE_MAX_CONNECTIONS; i++) {
        struct connection *c = &server->connections[i];

        if (c->state == CONNECTION_READING || c->state == CONNECTION_WRITING) {
            pfds[count].fd = c->fd;
            pfds[count].events = c->state == CONNECTION_READING ? POLLIN : POLLOUT;
            slot_of[count++] = i;
        }
    }
    if (poll(pfds, (nfds_t)count, timeout < 0 ? 0 : timeout) <= 0)
        return;
    for (int k = 2; k < count; k++) {
        struct connection *c = &server->connections[slot_of[k]];

        if (pfds[k].revents == 0)
            continue;
        if (c->state == CONNECTION_READING)
            connection_read(server, c);
        else if (c->state == CONNECTION_WRITING)
            connection_write(c);
    }
    if (pfds[1].revents != 0)
        take_answers(server);
    if (pfds[0].revents != 0)
        accept_all(server, listen_fd);
}

/* Stops the workers once they finished what they hold, then closes every connection. */
static void
server_stop(struct server *server)
{
    pthread_mutex_lock(&server->lock);
    server->stopping = true;
    pthread_cond_broadcast(&server->work);
    pthread_mutex_unlock(&server->lock);
    for (int i = 0; i < server->worker_count; i++)
        pthread_join(server->workers[i], NULL);
    take_answers(server);
    for (int i = 0; i < CONSOLE_MAX_CONNECTIONS; i++) {
        struct connection *c = &server->connections[i];

        if (c->state == CONNECTION_WRITING)
            connection_write(c); /* what the socket takes now, no waiting */
        if (c->state != CONNECTION_FREE)
            connection_close(c);
    }
    close(server->wake[0]);
    close(server->wake[1]);
    pthread_cond_destroy(&server->work);
    pthread_mutex_destroy(&server->lock);
}

int
console_server_run(struct console *console, int listen_fd, volatile sig_atomic_t *stop,
                   console_answer_fn *answer)
{
    struct server *server = calloc(1, sizeof(*server));
    sigset_t stop_signals, old_mask;

    if (server == NULL || pipe2(server->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
        fprintf(stderr, "outboxctl serve: unable to start: %s\n", strerror(errno));
        free(server);
        return -1;
    }
    server->console = console;
    server->answer = answer;
    pthread_mutex_init(&server->lock, NULL);
    pthread_cond_init(&server->work, NULL);
    fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    /* the workers block SIGINT and SIGTERM: the loop's poll() is the one they interrupt */
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
    for (int i = 0; i < CONSOLE_WORKERS; i++) {
        if (pthread_create(&server->workers[i], NULL, worker_main, server) != 0)
            break;
        server->worker_count++;
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (server->worker_count == 0) {
        fputs("outboxctl serve: unable to start a worker thread\n", stderr);
        server_stop(server);
        free(server);
        return -1;
    }
    while (!*stop)
        serve_turn(server, listen_fd);
    server_stop(server);
    free(server);
    return 0;
}
