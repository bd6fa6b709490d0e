/*
 * console.c - `outboxctl serve`: options, the listening socket, one
 * request at a time read, routed and answered.
 *
 * The top of the console: it routes to the API, the pages and the assets,
 * which stand on console_request.c and never call back here.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "console.h"
#include "console_api.h"
#include "console_assets.h"
#include "console_auth.h"
#include "console_html.h"
#include "console_request.h"
#include "error.h"
#include "listen_addr.h"
#include "url_check.h"

#define EXIT_USAGE 2
#define CLIENT_TIMEOUT_SECONDS 5

static const char security_headers[] =
    "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "X-Frame-Options: DENY\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Cache-Control: no-store\r\n";

static const char serve_usage[] =
    "usage: outboxctl serve [--listen HOST:PORT] [--auth-token-file FILE] [--allow-actions]\n"
    "                       [--database-url URL]\n";

static volatile sig_atomic_t stop_requested;

static void
on_stop_signal(int signo)
{
    (void)signo;
    stop_requested = 1;
}

static int
serve_usage_error(const char *message, const char *value)
{
    fprintf(stderr, "outboxctl: %s%s%s\n", message, value ? " " : "", value ? value : "");
    return EXIT_USAGE;
}

/* ---- database ---- */

/* Finds header name (case-insensitive) among the NUL-separated lines of head. */
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
    return 0;
}

/*
 * Reads one request into *data (owned by the caller) and parses it. Returns
 * 0, or the HTTP status to answer with (400, 408, 413).
 */
static int
read_request(int fd, struct buffer *data, struct console_request *request)
{
    char chunk[8192];
    size_t head_len = 0, want = 0;
    char *blank;

    for (;;) {
        ssize_t got;

        if (head_len > 0 && data->len >= want)
            break;
        got = read(fd, chunk, sizeof(chunk));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 408 : 400;
        buffer_append(data, chunk, (size_t)got);
        if (data->failed || data->len > CONSOLE_REQUEST_MAX_BYTES)
            return 413;
        if (head_len == 0 && (blank = strstr(data->data, "\r\n\r\n")) != NULL) {
            const char *length;
            char *lines;

            head_len = (size_t)(blank - data->data) + 4;
            lines = strndup(data->data, head_len);
            if (lines == NULL)
                return 413;
            for (char *p = lines; *p != '\0'; p++)
                if (*p == '\r' || *p == '\n')
                    *p = '\0';
            length = find_header(lines, lines + head_len, "Content-Length");
            want = head_len + (length ? strtoul(length, NULL, 10) : 0);
            free(lines);
            if (want > CONSOLE_REQUEST_MAX_BYTES)
                return 413;
        }
    }
    if (parse_head(data->data, head_len - 2, request) < 0)
        return 400;
    request->body = data->data + head_len;
    request->body_len = want - head_len;
    return 0;
}

static void
write_all(int fd, const char *data, size_t length)
{
    while (length > 0) {
        ssize_t sent = write(fd, data, length);

        if (sent < 0 && errno == EINTR)
            continue;
        if (sent <= 0)
            return;
        data += sent;
        length -= (size_t)sent;
    }
}

static const char *
status_text(int status)
{
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 303: return "See Other";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

static void
send_response(int fd, const struct console_request *request,
              const struct console_response *response)
{
    struct buffer head = {0};

    buffer_printf(&head, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s",
                  response->status, status_text(response->status),
                  response->content_type ? response->content_type : "text/plain; charset=utf-8",
                  response->body.len, security_headers);
    if (response->headers.len > 0)
        buffer_append(&head, response->headers.data, response->headers.len);
    buffer_puts(&head, "Connection: close\r\n\r\n");
    if (!head.failed)
        write_all(fd, head.data, head.len);
    if (strcmp(request->method, "HEAD") != 0 && response->body.len > 0)
        write_all(fd, response->body.data, response->body.len);
    buffer_clear(&head);
}

/* ---- routing ---- */

static bool
is_api(const char *path)
{
    return strncmp(path, "/api/v1/", 8) == 0;
}

static void
refuse(const struct console_request *request, struct console_response *response, int status,
       const char *reason)
{
    if (is_api(request->path)) {
        response->status = status;
        response->content_type = "application/json";
        buffer_puts(&response->body, "{\"error\":");
        console_json_string(&response->body, reason);
        buffer_puts(&response->body, "}\n");
    } else {
        console_respond_text(response, status, reason);
    }
}

static void
route(struct console *console, struct console_request *request,
      struct console_response *response)
{
    bool post = strcmp(request->method, "POST") == 0;
    bool get = strcmp(request->method, "GET") == 0 || strcmp(request->method, "HEAD") == 0;

    console_auth_identify(console, request);
    if (strncmp(request->path, "/static/", 8) == 0) {
        const char *asset = get ? console_asset(request->path + 8, &response->content_type) : NULL;

        if (asset == NULL)
            return console_respond_text(response, 404, "not found");
        response->status = 200;
        buffer_puts(&response->body, asset);
        return;
    }
    if (strcmp(request->path, "/favicon.ico") == 0) {
        response->status = 204; /* no icon: spares the browser a 404 */
        return;
    }
    if (strcmp(request->path, "/login") == 0 || strcmp(request->path, "/logout") == 0)
        return console_html(console, request, response);
    if (request->identity == CONSOLE_NOBODY) {
        if (is_api(request->path))
            return refuse(request, response, 401, "authentication required: bearer token or login");
        return console_html(console, request, response); /* the login page, with 401 */
    }
    if (!get && !post)
        return refuse(request, response, 405, "method not allowed");
    if (post && !console->allow_actions)
        return refuse(request, response, 403, "read-only console: start it with --allow-actions");
    if (post && request->identity != CONSOLE_BEARER && !console_auth_csrf_ok(request, NULL))
        return refuse(request, response, 403, "missing or wrong csrf token");
    if (is_api(request->path))
        return console_api(console, request, request->path + 8, response);
    if (post)
        return refuse(request, response, 404, "not found");
    console_html(console, request, response);
}

static void
serve_client(struct console *console, int fd, const char *peer)
{
    struct console_request request;
    struct console_response response = {.status = 200};
    struct buffer data = {0};
    struct timeval timeout = {.tv_sec = CLIENT_TIMEOUT_SECONDS};
    int status;

    memset(&request, 0, sizeof(request));
    snprintf(request.peer, sizeof(request.peer), "%s", peer);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    status = read_request(fd, &data, &request);
    if (status != 0) {
        snprintf(request.method, sizeof(request.method), "GET");
        console_respond_text(&response, status,
                             status == 413 ? "request too large" : "malformed request");
    } else {
        route(console, &request, &response);
    }
    if (response.body.failed || response.headers.failed) {
        buffer_clear(&response.headers);
        console_respond_text(&response, 500, "out of memory");
    }
    send_response(fd, &request, &response);
    buffer_clear(&response.body);
    buffer_clear(&response.headers);
    buffer_clear(&data);
}

/* ---- listening ---- */

static bool
address_is_loopback(const struct sockaddr *address)
{
    if (address->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)address)->sin_addr.s_addr) >>
                24) == 127;
    if (address->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)(const void *)address)->sin6_addr);
    return false;
}

/*
 * Binds and listens on addr; -1 after a message. Without a token
 * (need_loopback) an address that is not loopback is refused before
 * binding: -2 after the message.
 */
static int
listen_on(const struct listen_addr *addr, bool need_loopback)
{
    bool loopback = addr->host[0] != '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *list = NULL;
    int fd = -1, one = 1, rc;

    rc = getaddrinfo(addr->host[0] ? addr->host : NULL, addr->port, &hints, &list);
    if (rc != 0) {
        fprintf(stderr, "outboxctl: unable to resolve --listen host '%s': %s\n", addr->host,
                gai_strerror(rc));
        return -1;
    }
    for (struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next)
        if (!address_is_loopback(ai->ai_addr))
            loopback = false;
    if (need_loopback && !loopback) {
        freeaddrinfo(list);
        fprintf(stderr, "outboxctl: refusing to listen on a non-loopback address without "
                        "--auth-token-file: '%s'\n", addr->host[0] ? addr->host : "*");
        return -2;
    }
    fd = socket(list->ai_family, list->ai_socktype, list->ai_protocol);
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, list->ai_addr, list->ai_addrlen) < 0 || listen(fd, 64) < 0) {
        fprintf(stderr, "outboxctl: unable to listen on %s:%s: %s\n", addr->host, addr->port,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    return fd;
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

static void
serve_loop(struct console *console, int listen_fd)
{
    while (!stop_requested) {
        struct pollfd pfd = {.fd = listen_fd, .events = POLLIN};
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof(peer);
        char peer_text[64];
        int fd;

        if (poll(&pfd, 1, 1000) <= 0)
            continue;
        fd = accept(listen_fd, (struct sockaddr *)&peer, &peer_len);
        if (fd < 0)
            continue;
        peer_name(&peer, peer_text, sizeof(peer_text));
        serve_client(console, fd, peer_text);
        close(fd);
    }
}

/* ---- options ---- */

struct serve_options {
    const char *listen;
    const char *token_file;
    bool allow_actions;
};

static int
parse_serve_options(int argc, char **argv, const char **database_url, struct serve_options *opts)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        const char **target = NULL;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(serve_usage, stdout);
            return 0;
        }
        if (strcmp(arg, "--allow-actions") == 0) {
            opts->allow_actions = true;
            continue;
        }
        if (strcmp(arg, "--listen") == 0)
            target = &opts->listen;
        else if (strcmp(arg, "--auth-token-file") == 0)
            target = &opts->token_file;
        else if (strcmp(arg, "--database-url") == 0)
            target = database_url;
        if (target == NULL)
            return serve_usage_error(arg[0] == '-' ? "unknown option for 'serve':"
                                                   : "unexpected argument for 'serve':",
                                     arg);
        if (i + 1 >= argc)
            return serve_usage_error("missing value of option", arg);
        *target = argv[++i];
    }
    return -1;
}

int
console_serve(const char *database_url, int argc, char **argv)
{
    struct serve_options opts = {.listen = CONSOLE_DEFAULT_LISTEN};
    struct console console;
    struct listen_addr addr;
    struct outbox_error err;
    struct sigaction action = {.sa_handler = on_stop_signal};
    int rc, listen_fd;

    memset(&console, 0, sizeof(console));
    if ((rc = parse_serve_options(argc, argv, &database_url, &opts)) >= 0)
        return rc;
    if (database_url == NULL || database_url[0] == '\0')
        return serve_usage_error("missing database URL: give --database-url or set "
                                 "OUTBOX_DATABASE_URL", NULL);
    if (url_check_database(database_url, &err) != 0)
        return serve_usage_error("--database-url:", err.message);
    if (listen_addr_parse(opts.listen, &addr, &err) < 0 || addr.off)
        return serve_usage_error("invalid --listen (expected HOST:PORT):", opts.listen);
    if (opts.token_file != NULL && console_auth_load(&console, opts.token_file) < 0)
        return EXIT_USAGE;
    console.database_url = database_url;
    console.allow_actions = opts.allow_actions;
    if (console_auth_random_hex(console.anonymous.csrf, sizeof(console.anonymous.csrf)) < 0) {
        free(console.token);
        fputs("outboxctl: no source of randomness\n", stderr);
        return 1;
    }
    if ((listen_fd = listen_on(&addr, console.token == NULL)) < 0) {
        free(console.token);
        return listen_fd == -2 ? EXIT_USAGE : 1;
    }
    signal(SIGPIPE, SIG_IGN);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    fprintf(stderr, "outboxctl serve: listening on %s (%s, %s)\n", opts.listen,
            console.token ? "token required" : "loopback, no login",
            console.allow_actions ? "actions allowed" : "read-only");
    console_database(&console);
    serve_loop(&console, listen_fd);
    close(listen_fd);
    PQfinish(console.conn);
    free(console.token);
    return 0;
}
