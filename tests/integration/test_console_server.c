/*
 * test_console_server.c - the HTTP side of `outboxctl serve` under hostile
 * clients: slow and silent connections beside real requests, the whole
 * request deadline, the Host and Origin checks against DNS rebinding, and
 * malformed request heads.
 *
 * Needs the environment tests/run.sh gives (OUTBOX_TEST_PG_URL, OUTBOX_BIN).
 * Each test has its own database and its own console process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "console_client.h"
#include "fixtures.h"
#include "harness.h"

/* The console's whole-request deadline (CONSOLE_REQUEST_SECONDS) and some slack. */
#define REQUEST_DEADLINE_SECONDS 10
#define IDLE_SOCKETS 20
#define CROWD_SOCKETS 300

struct fixture {
    char *url;
    PGconn *conn;
    PGconn *other; /* a second session of a test, closed by teardown */
    int port;
    pid_t pid;
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{\"n\": 1}')");
    f->port = harness_closed_port();
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    PQfinish(f->other); /* first: a lock it holds would keep the console from stopping */
    console_stop(f->pid);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Opens count connections that send nothing into fds. */
static void
open_silent(int port, int *fds, int count)
{
    for (int i = 0; i < count; i++) {
        fds[i] = fixture_connect_loopback(port, 5);
        assert_true(fds[i] >= 0);
    }
}

static void
close_all(int *fds, int count)
{
    for (int i = 0; i < count; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/*
 * GET /api/v1/queues answered with 200 within seconds; under valgrind, which
 * makes the console several times slower, within half the request deadline:
 * still well short of what slow connections holding it up would cost.
 */
static void
expect_answered_within(const struct fixture *f, double seconds)
{
    double started;
    struct http_reply r;
    double took;
    int status;

    if (harness_time_scale() > 1)
        seconds = REQUEST_DEADLINE_SECONDS / 2.0;
    started = now_seconds();
    r = http_request(f->port, "GET", "/api/v1/queues", NULL, NULL, 5);
    took = now_seconds() - started;
    status = r.status;
    if (status != 200 || took > seconds) {
        http_reply_free(&r);
        fail_msg("a real request took %.2f s (status %d), expected 200 within %.1f s", took,
                 status, seconds);
    }
    console_expect(&r, 200, "\"queue\":\"orders\"");
    http_reply_free(&r);
}

/*
 * 20 connections that say nothing and one that sends a byte of its request
 * now and then hold nobody up: each real request is answered at once.
 */
static void
test_slow_clients_hold_nobody_up(void **state)
{
    static const char request[] = "GET /api/v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    const char *options[] = {NULL};
    struct fixture *f = *state;
    int idle[IDLE_SOCKETS], trickler;

    f->pid = console_start(f->port, f->url, options);
    open_silent(f->port, idle, IDLE_SOCKETS);
    trickler = fixture_connect_loopback(f->port, 5);
    assert_true(trickler >= 0);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(write(trickler, &request[i], 1), 1);
        expect_answered_within(f, 1.5);
        usleep(300 * 1000);
    }
    close_all(idle, IDLE_SOCKETS);
    close(trickler);
}

/* Many more silent connections than the console keeps: the newest request still gets through. */
static void
test_a_crowd_of_silent_connections(void **state)
{
    const char *options[] = {NULL};
    struct fixture *f = *state;
    static int crowd[CROWD_SOCKETS];

    f->pid = console_start(f->port, f->url, options);
    open_silent(f->port, crowd, CROWD_SOCKETS);
    expect_answered_within(f, 1.5);
    expect_answered_within(f, 1.5);
    close_all(crowd, CROWD_SOCKETS);
}

/* A request that is still not complete when its deadline passes is answered 408 and closed. */
static void
test_request_deadline(void **state)
{
    const char *options[] = {NULL};
    struct fixture *f = *state;
    char answer[512] = "";
    double started;
    size_t got = 0;
    int fd;

    f->pid = console_start(f->port, f->url, options);
    fd = fixture_connect_loopback(f->port, REQUEST_DEADLINE_SECONDS + 5);
    assert_true(fd >= 0);
    started = now_seconds();
    /* a byte every second keeps every single read short, never the whole request */
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};

        if (poll(&pfd, 1, 1000) > 0) {
            ssize_t n = read(fd, answer + got, sizeof(answer) - 1 - got);

            if (n <= 0)
                break;
            got += (size_t)n;
            continue;
        }
        if (now_seconds() - started > REQUEST_DEADLINE_SECONDS + 5)
            break;
        if (write(fd, "G", 1) != 1)
            break;
    }
    close(fd);
    if (strncmp(answer, "HTTP/1.1 408", 12) != 0)
        fail_msg("expected a 408 after %d s, got after %.1f s: '%s'", REQUEST_DEADLINE_SECONDS,
                 now_seconds() - started, answer);
    assert_true(now_seconds() - started < REQUEST_DEADLINE_SECONDS + 2);
    expect_answered_within(f, 1.5);
}

/* A request waiting on a lock in the database holds up no other request. */
static void
test_a_slow_query_holds_nobody_up(void **state)
{
    const char *options[] = {NULL};
    struct fixture *f = *state;
    PGconn *locker = f->other = harness_connect(f->url);
    struct http_reply r;
    int fd;

    f->pid = console_start(f->port, f->url, options);
    harness_exec(locker, "BEGIN; LOCK TABLE outbox.paused IN ACCESS EXCLUSIVE MODE");
    fd = fixture_connect_loopback(f->port, 10);
    assert_true(fd >= 0);
    assert_true(dprintf(fd, "GET /api/v1/paused HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n",
                        f->port) > 0);
    usleep(300 * 1000); /* the paused list now waits for the lock */
    for (int i = 0; i < 3; i++) {
        double started = now_seconds();

        r = http_request(f->port, "GET", "/api/v1/dead?queue=orders", NULL, NULL, 5);
        console_expect(&r, 200, NULL);
        http_reply_free(&r);
        assert_true(now_seconds() - started < 1.5);
    }
    harness_exec(locker, "COMMIT");
    {
        char answer[256] = "";

        assert_true(read(fd, answer, sizeof(answer) - 1) > 0);
        assert_int_equal(strncmp(answer, "HTTP/1.1 200", 12), 0);
    }
    close(fd);
}

/*
 * SIGTERM stops the console while a request waits on a lock: its statement ends
 * at the connections' statement_timeout (30 s) instead of holding the worker, and
 * with it the stop, until the lock goes.
 */
static void
test_stop_while_a_query_waits_on_a_lock(void **state)
{
    const char *options[] = {NULL};
    struct fixture *f = *state;
    PGconn *locker = f->other = harness_connect(f->url);
    int fd;

    f->pid = console_start(f->port, f->url, options);
    harness_exec(locker, "BEGIN; LOCK TABLE outbox.paused IN ACCESS EXCLUSIVE MODE");
    fd = fixture_connect_loopback(f->port, 10);
    assert_true(fd >= 0);
    assert_true(dprintf(fd, "GET /api/v1/paused HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n",
                        f->port) > 0);
    usleep(300 * 1000); /* the paused list now waits for the lock */
    kill(f->pid, SIGTERM);
    /* the lock is still held: only the statement timeout lets the worker go */
    assert_int_equal(harness_wait_exit(f->pid, 45000 * harness_time_scale()), 0);
    f->pid = 0;
    close(fd);
}

/* ---- Host and Origin ---- */

/* GET path with the Host line host (NULL: none at all) and extra header lines. */
static struct http_reply
get_as(const struct fixture *f, const char *host, const char *path)
{
    char extra[256];

    if (host == NULL) {
        char request[256], answer[1024] = "";
        struct http_reply r = {0};
        int fd = fixture_connect_loopback(f->port, 5);
        ssize_t n;

        snprintf(request, sizeof(request), "GET %s HTTP/1.0\r\n\r\n", path);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, request, strlen(request)), (ssize_t)strlen(request));
        n = read(fd, answer, sizeof(answer) - 1);
        close(fd);
        if (n > 0)
            sscanf(answer, "HTTP/1.1 %d", &r.status);
        return r;
    }
    snprintf(extra, sizeof(extra), "Host: %s\r\n", host);
    return http_request(f->port, "GET", path, extra, NULL, 5);
}

/* The CSRF token of a console without a token file, asked as 127.0.0.1. */
static void
anonymous_csrf(const struct fixture *f, char *csrf, size_t size)
{
    struct http_reply r = http_request(f->port, "GET", "/api/v1/session", NULL, NULL, 5);
    const char *at;

    console_expect(&r, 200, "\"csrf_token\":\"");
    at = strstr(r.body, "\"csrf_token\":\"") + strlen("\"csrf_token\":\"");
    snprintf(csrf, size, "%.64s", at);
    http_reply_free(&r);
}

/* POST /api/v1/pause of orders with csrf, the Host line host and Origin origin (NULL: none). */
static struct http_reply
pause_as(const struct fixture *f, const char *host, const char *origin, const char *csrf)
{
    char extra[512];

    snprintf(extra, sizeof(extra),
             "Host: %s\r\nContent-Type: application/json\r\nX-CSRF-Token: %s\r\n%s%s%s", host,
             csrf, origin ? "Origin: " : "", origin ? origin : "", origin ? "\r\n" : "");
    return http_request(f->port, "POST", "/api/v1/pause", extra, "{\"queue\":\"orders\"}", 5);
}

static long long
paused_count(const struct fixture *f)
{
    return harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused");
}

/*
 * A page on another name that resolves to 127.0.0.1 (DNS rebinding) gets
 * nothing: neither the CSRF token nor an action. The names the console
 * listens as, with its port, and those --allow-host adds are served.
 */
static void
test_host_names(void **state)
{
    const char *options[] = {"--allow-actions", NULL};
    struct fixture *f = *state;
    char host[128], csrf[80], origin[160];
    static const char *const names[] = {"127.0.0.1", "localhost", "LocalHost", "[::1]"};
    struct http_reply r;

    f->pid = console_start(f->port, f->url, options);
    snprintf(host, sizeof(host), "rebind.attacker.example:%d", f->port);
    r = get_as(f, host, "/api/v1/session");
    console_expect(&r, 403, "host");
    assert_null(strstr(r.body, "csrf_token"));
    http_reply_free(&r);
    r = get_as(f, "rebind.attacker.example", "/");
    console_expect(&r, 403, NULL);
    http_reply_free(&r);
    anonymous_csrf(f, csrf, sizeof(csrf));
    r = pause_as(f, host, NULL, csrf);
    console_expect(&r, 403, "host");
    http_reply_free(&r);
    assert_int_equal(paused_count(f), 0);

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(host, sizeof(host), "%s:%d", names[i], f->port);
        r = get_as(f, host, "/api/v1/queues");
        console_expect(&r, 200, "\"queue\":\"orders\"");
        http_reply_free(&r);
    }
    r = get_as(f, "127.0.0.1:1", "/api/v1/queues"); /* not the port it listens on */
    console_expect(&r, 403, NULL);
    http_reply_free(&r);
    r = get_as(f, NULL, "/api/v1/queues");
    assert_int_equal(r.status, 400);
    http_reply_free(&r);

    /* every POST from a browser names its page's origin: it must be the console's */
    snprintf(host, sizeof(host), "127.0.0.1:%d", f->port);
    snprintf(origin, sizeof(origin), "http://rebind.attacker.example:%d", f->port);
    r = pause_as(f, host, origin, csrf);
    console_expect(&r, 403, "origin");
    http_reply_free(&r);
    r = pause_as(f, host, "null", csrf);
    console_expect(&r, 403, "origin");
    http_reply_free(&r);
    snprintf(origin, sizeof(origin), "http://127.0.0.1:%d/path", f->port);
    r = pause_as(f, host, origin, csrf);
    console_expect(&r, 403, "origin");
    http_reply_free(&r);
    assert_int_equal(paused_count(f), 0);
    snprintf(origin, sizeof(origin), "http://localhost:%d", f->port);
    r = pause_as(f, host, origin, csrf);
    console_expect(&r, 200, "\"changed\":true");
    http_reply_free(&r);
    /* a script without a browser sends no Origin */
    r = pause_as(f, host, NULL, csrf);
    console_expect(&r, 200, NULL);
    http_reply_free(&r);
    assert_int_equal(paused_count(f), 1);
}

/* --allow-host adds a name, on any port (a proxy in front of the console) */
static void
test_allow_host(void **state)
{
    const char *options[] = {"--allow-actions", "--allow-host", "console.example", NULL};
    struct fixture *f = *state;
    char host[128], csrf[80];
    struct http_reply r;

    f->pid = console_start(f->port, f->url, options);
    r = get_as(f, "Console.Example:443", "/api/v1/queues");
    console_expect(&r, 200, NULL);
    http_reply_free(&r);
    r = get_as(f, "console.example", "/api/v1/queues");
    console_expect(&r, 200, NULL);
    http_reply_free(&r);
    r = get_as(f, "console.example.evil:443", "/api/v1/queues");
    console_expect(&r, 403, NULL);
    http_reply_free(&r);
    snprintf(host, sizeof(host), "127.0.0.1:%d", f->port);
    r = get_as(f, host, "/api/v1/queues");
    console_expect(&r, 200, NULL);
    http_reply_free(&r);
    anonymous_csrf(f, csrf, sizeof(csrf));
    r = pause_as(f, "console.example", "https://console.example", csrf);
    console_expect(&r, 200, "\"changed\":true");
    http_reply_free(&r);
    r = pause_as(f, "console.example", "https://other.example", csrf);
    console_expect(&r, 403, "origin");
    http_reply_free(&r);
    assert_int_equal(paused_count(f), 1);
}

/* Listening on every address: any IP address (a rebinding page has a name) and localhost. */
static void
test_every_address(void **state)
{
    struct fixture *f = *state;
    char token_file[128], listen[32], host[64];
    const char *options[] = {"--auth-token-file", token_file, "--listen", listen, NULL};
    static const char *const hosts[][2] = {
        {"192.0.2.7", "200"},
        {"[2001:db8::1]", "200"},
        {"localhost", "200"},
        {"attacker.example", "403"},
        {"192.0.2.7.attacker.example", "403"},
    };

    console_token_file(token_file, sizeof(token_file), "console-every");
    snprintf(listen, sizeof(listen), "0.0.0.0:%d", f->port);
    f->pid = console_start(f->port, f->url, options);
    for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
        char extra[160];
        struct http_reply r;

        snprintf(host, sizeof(host), "%s:%d", hosts[i][0], f->port);
        snprintf(extra, sizeof(extra), "Host: %s\r\n" CONSOLE_BEARER, host);
        r = http_request(f->port, "GET", "/api/v1/queues", extra, NULL, 5);
        console_expect(&r, atoi(hosts[i][1]), NULL);
        http_reply_free(&r);
    }
    unlink(token_file);
}

/* A login form posted from another origin opens no session. */
static void
test_login_from_another_origin(void **state)
{
    struct fixture *f = *state;
    char token_file[128], extra[256];
    const char *options[] = {"--auth-token-file", token_file, NULL};
    struct http_reply r;

    console_token_file(token_file, sizeof(token_file), "console-host");
    f->pid = console_start(f->port, f->url, options);
    snprintf(extra, sizeof(extra), "Host: 127.0.0.1:%d\r\nOrigin: http://attacker.example\r\n",
             f->port);
    r = http_request(f->port, "POST", "/login", extra, "token=" CONSOLE_TOKEN, 5);
    console_expect(&r, 403, "origin");
    assert_null(strstr(r.head, "Set-Cookie"));
    http_reply_free(&r);
    unlink(token_file);
}

static void
test_allow_host_option(void **state)
{
    struct fixture *f = *state;
    char output[1024];
    const char *bad[] = {"serve", "--allow-host", "bad name", "--database-url", f->url, NULL};
    const char *port[] = {"serve", "--allow-host", "a.example:80", "--database-url", f->url,
                          NULL};
    const char *empty[] = {"serve", "--allow-host", "", "--database-url", f->url, NULL};

    assert_int_equal(fixture_run_program("outboxctl", bad, output, sizeof(output), 10000), 2);
    assert_non_null(strstr(output, "--allow-host"));
    assert_int_equal(fixture_run_program("outboxctl", port, output, sizeof(output), 10000), 2);
    assert_int_equal(fixture_run_program("outboxctl", empty, output, sizeof(output), 10000), 2);
}

/* ---- request heads ---- */

/* Sends text as it is; the status of the answer, 0 when none. */
static int
raw_status(const struct fixture *f, const char *text)
{
    char answer[1024] = "";
    int fd = fixture_connect_loopback(f->port, 5), status = 0;

    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    if (read(fd, answer, sizeof(answer) - 1) > 0)
        sscanf(answer, "HTTP/1.1 %d", &status);
    if (status == 400 && strstr(answer, "Content-Length") == NULL &&
        strstr(answer, "Transfer-Encoding") == NULL)
        status = -400; /* refused, but not saying why */
    close(fd);
    return status;
}

/* A body length that is not one plain number is refused as such, and nothing happens. */
static void
test_bad_content_length(void **state)
{
    const char *options[] = {"--allow-actions", NULL};
    struct fixture *f = *state;
    static const char *const lengths[] = {
        "Content-Length: -1\r\n",
        "Content-Length: +18\r\n",
        "Content-Length: 18x\r\n",
        "Content-Length: \r\n",
        "Content-Length: 99999999999999999999999\r\n",
        "Content-Length: 18\r\nContent-Length: 19\r\n",
        "Transfer-Encoding: chunked\r\n",
    };
    char csrf[80], request[1024];

    f->pid = console_start(f->port, f->url, options);
    anonymous_csrf(f, csrf, sizeof(csrf));
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        int status;

        snprintf(request, sizeof(request),
                 "POST /api/v1/pause HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                 "application/json\r\nX-CSRF-Token: %s\r\n%s\r\n{\"queue\":\"orders\"}",
                 f->port, csrf, lengths[i]);
        status = raw_status(f, request);
        if (status != 400)
            fail_msg("'%.*s': expected 400 naming the header, got %d", (int)strlen(lengths[i]) - 2,
                     lengths[i], status);
    }
    assert_int_equal(paused_count(f), 0);
    snprintf(request, sizeof(request),
             "POST /api/v1/pause HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
             "application/json\r\nX-CSRF-Token: %s\r\nContent-Length: 18\r\n\r\n"
             "{\"queue\":\"orders\"}",
             f->port, csrf);
    assert_int_equal(raw_status(f, request), 200);
    assert_int_equal(paused_count(f), 1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_slow_clients_hold_nobody_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_crowd_of_silent_connections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_slow_query_holds_nobody_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_while_a_query_waits_on_a_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allow_host, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_address, setup, teardown),
        cmocka_unit_test_setup_teardown(test_login_from_another_origin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allow_host_option, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_content_length, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
