/*
 * console.c - `outboxctl serve`: options, the listening socket, and each
 * request routed and answered (the shared server, common/httpd.c, reads and
 * writes them, with CONSOLE_WORKERS workers).
 *
 * The top of the console: it routes to the API, the pages and the assets,
 * which stand on console_request.c and never call back here.
 */
#include <errno.h>
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

#include "actions.h"
#include "console.h"
#include "console_api.h"
#include "console_assets.h"
#include "console_auth.h"
#include "console_pages.h"
#include "console_request.h"
#include "error.h"
#include "exit_status.h"
#include "httpd.h"
#include "listen_addr.h"
#include "url_check.h"

/*
 * Referrer-Policy same-origin, not no-referrer: under no-referrer a browser
 * sends "Origin: null" with the page's own form posts, and a post must name
 * the console's origin. The pages load nothing from elsewhere anyway.
 */
static const char security_headers[] =
    "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "X-Frame-Options: DENY\r\n"
    "Referrer-Policy: same-origin\r\n"
    "Cache-Control: no-store\r\n";

static const char serve_usage[] =
    "usage: outboxctl serve [--listen HOST:PORT] [--auth-token-file FILE] [--allow-actions]\n"
    "                       [--allow-host NAME]... [--database-url URL]\n"
    "       outboxctl --databases FILE serve [OPTIONS]   (every database of a relay's list)\n";

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
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

/* Writes the status line, the headers and (but for HEAD) the body of response into answer. */
static void
format_answer(const struct console_request *request, const struct console_response *response,
              struct buffer *answer)
{
    buffer_printf(answer, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s",
                  response->status, status_text(response->status),
                  response->content_type ? response->content_type : "text/plain; charset=utf-8",
                  response->body.len, security_headers);
    if (response->headers.len > 0)
        buffer_append(answer, response->headers.data, response->headers.len);
    buffer_puts(answer, "Connection: close\r\n\r\n");
    if (strcmp(request->method, "HEAD") != 0 && response->body.len > 0)
        buffer_append(answer, response->body.data, response->body.len);
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

/* Logs a request refused for its Host or Origin, the value quoted. */
static void
log_refused(const struct console_request *request, const char *what, const char *value)
{
    char quoted[120];

    fprintf(stderr, "outboxctl serve: refused a request from %s with %s %s\n", request->peer,
            what, outbox_error_quote(quoted, sizeof(quoted), value));
}

/* True when the request would change rows: its API row says so; any other POST is taken to. */
static bool
changes(const struct console_request *request)
{
    const struct action *action =
        is_api(request->path) ? action_for_api(request->method, request->path + 8) : NULL;

    return action != NULL ? action->changes : strcmp(request->method, "POST") == 0;
}

/*
 * Sets the database the request works on from its database=NAME (the
 * first of the list without one); -1 after answering 404 for a name the
 * list does not have.
 */
static int
pick_database(struct console *console, struct console_request *request,
              struct console_response *response)
{
    char wanted[sizeof(request->query)], reason[DATABASE_NAME_MAX + 80];
    bool named =
        console_param(request->query, strlen(request->query), "database", wanted, sizeof(wanted));
    int rc = console_databases_pick(&console->databases, named ? wanted : NULL, request->database,
                                    &request->database_url);

    if (rc == -2)
        refuse(request, response, 500, "out of memory");
    else if (rc == -1 && strlen(wanted) >= DATABASE_NAME_MAX)
        refuse(request, response, 404, "no such database in the console's list");
    else if (rc == -1) {
        snprintf(reason, sizeof(reason), "no database '%.*s' in the console's list",
                 DATABASE_NAME_MAX - 1, wanted);
        refuse(request, response, 404, reason);
    }
    return rc < 0 ? -1 : 0;
}

static void
route(struct console *console, struct console_request *request,
      struct console_response *response)
{
    bool post = strcmp(request->method, "POST") == 0;
    bool get = strcmp(request->method, "GET") == 0 || strcmp(request->method, "HEAD") == 0;

    if (request->host == NULL)
        return refuse(request, response, 400, "missing Host header");
    if (!console_auth_host_ok(console, request->host, "80")) {
        log_refused(request, "host", request->host);
        return refuse(request, response, 403, "unknown host: start the console with "
                                              "--allow-host NAME to serve it by that name");
    }
    if (post && request->origin != NULL && !console_auth_origin_ok(console, request->origin)) {
        log_refused(request, "origin", request->origin);
        return refuse(request, response, 403, "cross-origin post refused: origin is not the "
                                              "console's");
    }
    console_auth_identify(console, request);
    if (request->throttled)
        return refuse(request, response, 429, "too many failed logins from this address: try "
                                              "again in a minute");
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
    if (request->identity != CONSOLE_NOBODY && pick_database(console, request, response) < 0)
        return;
    if (request->identity == CONSOLE_NOBODY) {
        if (is_api(request->path))
            return refuse(request, response, 401, "authentication required: bearer token or login");
        return console_html(console, request, response); /* the login page, with 401 */
    }
    if (!get && !post)
        return refuse(request, response, 405, "method not allowed");
    if (changes(request) && !console->allow_actions)
        return refuse(request, response, 403, "read-only console: start it with --allow-actions");
    if (post && request->identity != CONSOLE_BEARER && !console_auth_csrf_ok(request, NULL))
        return refuse(request, response, 403, "missing or wrong csrf token");
    if (is_api(request->path))
        return console_api(console, request, request->path + 8, response);
    if (post)
        return refuse(request, response, 404, "not found");
    console_html(console, request, response);
}

/* The console's view of a request the server read. */
static void
request_of(const struct httpd_request *in, struct console_request *request)
{
    memset(request, 0, sizeof(*request));
    request->refused = in->refused;
    request->refused_reason = in->refused_reason;
    snprintf(request->method, sizeof(request->method), "%s", in->method);
    snprintf(request->path, sizeof(request->path), "%s", in->path);
    snprintf(request->query, sizeof(request->query), "%s", in->query);
    snprintf(request->peer, sizeof(request->peer), "%s", in->peer);
    request->authorization = httpd_request_header(in, "Authorization");
    request->cookie = httpd_request_header(in, "Cookie");
    request->csrf_header = httpd_request_header(in, "X-CSRF-Token");
    request->content_type = httpd_request_header(in, "Content-Type");
    request->host = httpd_request_header(in, "Host");
    request->origin = httpd_request_header(in, "Origin");
    request->body = in->body;
    request->body_len = in->body_len;
}

/* Answers one request (an httpd_answer_fn): routed, or the text of the server's refusal. */
static void
console_answer(void *arg, const struct httpd_request *in, struct buffer *answer)
{
    struct console *console = arg;
    struct console_response response = {.status = 200};
    struct console_request request_copy, *request = &request_copy;

    request_of(in, request);

    if (request->refused == 408)
        console_respond_text(&response, 408, "request not complete in time");
    else if (request->refused == 413)
        console_respond_text(&response, 413, "request too large");
    else if (request->refused != 0)
        console_respond_text(&response, request->refused,
                             request->refused_reason ? request->refused_reason
                                                     : "malformed request");
    else
        route(console, request, &response);
    free(request->database_url);
    if (response.body.failed || response.headers.failed) {
        buffer_clear(&response.headers);
        console_respond_text(&response, 500, "out of memory");
    }
    format_answer(request, &response, answer);
    buffer_clear(&response.body);
    buffer_clear(&response.headers);
}

/*
 * Whether a request is cheap (an httpd quick function): the assets, the
 * session, the login page; none of them waits on a database, so the loop
 * answers them at once whatever pages the workers are busy with.
 */
static bool
console_quick(void *arg, const struct httpd_request *in)
{
    (void)arg;
    if (strcmp(in->method, "GET") != 0 && strcmp(in->method, "HEAD") != 0)
        return false;
    return strncmp(in->path, "/static/", 8) == 0 || strcmp(in->path, "/favicon.ico") == 0 ||
           strcmp(in->path, "/api/v1/session") == 0 || strcmp(in->path, "/login") == 0;
}

/* ---- listening ---- */

/*
 * Binds and listens on addr; -1 after a message. Without a token
 * (need_loopback) an address that is not loopback is refused before
 * binding: -2 after the message.
 */
static int
listen_on(const struct listen_addr *addr, bool need_loopback)
{
    struct outbox_error err;
    int fd;

    if (httpd_listen(addr, "--listen address", need_loopback, &fd, NULL, &err) == 0)
        return fd;
    if (err.code == OUTBOX_ERR_INVALID) {
        fprintf(stderr, "outboxctl: refusing to listen on a non-loopback address without "
                        "--auth-token-file: '%s'\n", addr->host[0] ? addr->host : "*");
        return -2;
    }
    fprintf(stderr, "outboxctl: %s\n", err.message);
    return -1;
}

/* ---- options ---- */

struct serve_options {
    const char *listen;
    const char *token_file;
    bool allow_actions;
    const char *allowed_hosts[CONSOLE_ALLOWED_HOSTS_MAX];
    size_t allowed_count;
};

/* Adds the value of --allow-host; -1 when there is no room, 0 when it is not a host name. */
static int
add_allowed_host(struct serve_options *opts, const char *name)
{
    if (!console_auth_host_name_valid(name))
        return serve_usage_error("invalid --allow-host (a host name or IP address, without "
                                 "a port):", name);
    if (opts->allowed_count == CONSOLE_ALLOWED_HOSTS_MAX)
        return serve_usage_error("too many --allow-host (at most 16)", NULL);
    opts->allowed_hosts[opts->allowed_count++] = name;
    return -1;
}

/* Fills the names the console answers as from where it listens and --allow-host. */
static void
set_hosts(struct console_hosts *hosts, const struct listen_addr *addr, int listen_fd,
          const struct serve_options *opts)
{
    struct sockaddr_storage bound;
    socklen_t length = sizeof(bound);
    unsigned char any[16] = {0}, address[16];
    uint16_t port = 0;
    bool v4 = inet_pton(AF_INET, addr->host, address) == 1;
    bool v6 = !v4 && inet_pton(AF_INET6, addr->host, address) == 1;

    if (getsockname(listen_fd, (struct sockaddr *)&bound, &length) == 0)
        port = ntohs(bound.ss_family == AF_INET6
                         ? ((struct sockaddr_in6 *)(void *)&bound)->sin6_port
                         : ((struct sockaddr_in *)(void *)&bound)->sin_port);
    snprintf(hosts->port, sizeof(hosts->port), "%u", (unsigned)port);
    snprintf(hosts->listen_host, sizeof(hosts->listen_host), v6 ? "[%s]" : "%s", addr->host);
    hosts->loopback = httpd_address_is_loopback((const struct sockaddr *)&bound);
    hosts->every_address = addr->host[0] == '\0' || (v4 && memcmp(address, any, 4) == 0) ||
                           (v6 && memcmp(address, any, 16) == 0);
    for (size_t i = 0; i < opts->allowed_count; i++)
        hosts->allowed[hosts->allowed_count++] = opts->allowed_hosts[i];
}

static int
parse_serve_options(int argc, char **argv, const char **database_url, struct serve_options *opts)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        const char **target = NULL;
        int rc;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(serve_usage, stdout);
            return 0;
        }
        if (strcmp(arg, "--allow-actions") == 0) {
            opts->allow_actions = true;
            continue;
        }
        if (strcmp(arg, "--allow-host") == 0) {
            if (i + 1 >= argc)
                return serve_usage_error("missing value of option", arg);
            if ((rc = add_allowed_host(opts, argv[++i])) >= 0)
                return rc;
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

/* A worker starts: it connects early to the first database, so a wrong URL shows at start. */
static void
worker_begin(void *arg)
{
    struct console *console = arg;
    char name[DATABASE_NAME_MAX], *url;

    if (console_databases_pick(&console->databases, NULL, name, &url) == 0 && url != NULL)
        console_database(name, url);
    free(url);
}

static void
worker_end(void *arg)
{
    (void)arg;
    console_database_close();
}

/* Serves listen_fd until a stop signal; -1 after a message when the server cannot start. */
static int
serve(struct console *console, int listen_fd)
{
    const struct httpd_options options = {
        .max_connections = CONSOLE_MAX_CONNECTIONS,
        .workers = CONSOLE_WORKERS,
        .request_ms = CONSOLE_REQUEST_SECONDS * 1000,
        .answer_ms = CONSOLE_ANSWER_SECONDS * 1000,
        .request_max_bytes = CONSOLE_REQUEST_MAX_BYTES,
        .read_body = true,
        .answer_late_requests = true,
        .answer = console_answer,
        .quick = console_quick,
        .arg = console,
        .worker_begin = worker_begin,
        .worker_end = worker_end,
    };
    struct httpd *httpd = httpd_new(listen_fd, &options);
    int rc;

    if (httpd == NULL) {
        fprintf(stderr, "outboxctl serve: unable to start: %s\n", strerror(errno));
        return -1;
    }
    if ((rc = httpd_run(httpd, &stop_requested)) < 0)
        fputs("outboxctl serve: unable to start a worker thread\n", stderr);
    httpd_free(httpd);
    return rc;
}

/*
 * The console's databases: the list of databases_file, or the one
 * database_url (either may come from --database-url); -1 when set, else
 * the exit code after a message.
 */
static int
open_databases(struct console *console, const char *database_url, const char *databases_file)
{
    struct outbox_error err;

    if (databases_file != NULL && database_url != NULL)
        return serve_usage_error("--databases and --database-url exclude each other", NULL);
    if (databases_file == NULL && (database_url == NULL || database_url[0] == '\0'))
        return serve_usage_error("missing database URL: give --database-url or set "
                                 "OUTBOX_DATABASE_URL",
                                 NULL);
    if (databases_file == NULL && url_check_database(database_url, &err) != 0)
        return serve_usage_error("--database-url:", err.message);
    if (console_databases_open(&console->databases, databases_file, database_url, &err) != 0) {
        fprintf(stderr, "outboxctl: %s\n", err.message);
        return err.code == OUTBOX_ERR_CONFIG ? EXIT_USAGE : 1;
    }
    return -1;
}

int
console_serve(const char *database_url, const char *databases_file, int argc, char **argv)
{
    struct serve_options opts = {.listen = CONSOLE_DEFAULT_LISTEN};
    struct console console;
    struct listen_addr addr;
    struct outbox_error err;
    struct sigaction action = {.sa_handler = on_stop_signal};
    int rc, listen_fd;

    memset(&console, 0, sizeof(console));
    if (databases_file != NULL)
        database_url = NULL; /* $OUTBOX_DATABASE_URL: each database has its own */
    if ((rc = parse_serve_options(argc, argv, &database_url, &opts)) >= 0)
        return rc;
    if (listen_addr_parse(opts.listen, &addr, &err) < 0 || addr.off)
        return serve_usage_error("invalid --listen (expected HOST:PORT):", opts.listen);
    if ((rc = open_databases(&console, database_url, databases_file)) >= 0)
        return rc;
    pthread_mutex_init(&console.sessions_lock, NULL);
    console.pages = console_pages;
    console.page_count = console_page_count;
    console.allow_actions = opts.allow_actions;
    rc = EXIT_USAGE;
    if (opts.token_file != NULL && console_auth_load(&console, opts.token_file) < 0)
        goto cleanup;
    rc = 1;
    if (console_auth_random_hex(console.anonymous.csrf, sizeof(console.anonymous.csrf)) < 0) {
        fputs("outboxctl: no source of randomness\n", stderr);
        goto cleanup;
    }
    if ((listen_fd = listen_on(&addr, console.token == NULL)) < 0) {
        rc = listen_fd == -2 ? EXIT_USAGE : 1;
        goto cleanup;
    }
    set_hosts(&console.hosts, &addr, listen_fd, &opts);
    signal(SIGPIPE, SIG_IGN);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    fprintf(stderr, "outboxctl serve: listening on %s (%s, %s, %zu database%s)\n", opts.listen,
            console.token ? "token required" : "loopback, no login",
            console.allow_actions ? "actions allowed" : "read-only", console.databases.list.count,
            console.databases.list.count == 1 ? "" : "s");
    rc = serve(&console, listen_fd) < 0 ? 1 : 0;
    close(listen_fd);
cleanup:
    console_databases_close(&console.databases);
    pthread_mutex_destroy(&console.sessions_lock);
    free(console.token);
    return rc;
}
