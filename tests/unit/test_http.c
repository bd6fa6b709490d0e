/*
 * test_http.c - the metrics endpoint as Prometheus and a health checker use
 * it, over loopback: /metrics, /healthz, /readyz, errors, a taken port,
 * bad addresses, a prompt stop while a client hangs, answers while a hundred
 * connections sit idle, and garbage refused on sight.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "metrics.h"

struct fixture {
    struct metrics *metrics;
    struct http_server *server;
    int port;
};

static int
connect_loopback(int port)
{
    struct sockaddr_in sa;
    struct timeval timeout = {10, 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Sends request and returns the whole response (malloc'd), read until the server closes. */
static char *
http_exchange(int port, const char *request)
{
    int fd = connect_loopback(port);
    size_t len = 0, cap = 4096;
    char *response = malloc(cap);
    ssize_t n;

    assert_non_null(response);
    assert_int_equal(send(fd, request, strlen(request), MSG_NOSIGNAL), (ssize_t)strlen(request));
    while ((n = recv(fd, response + len, cap - len - 1, 0)) > 0) {
        len += (size_t)n;
        if (cap - len < 1024) {
            char *grown = realloc(response, cap * 2);

            assert_non_null(grown);
            response = grown;
            cap *= 2;
        }
    }
    response[len] = '\0';
    close(fd);
    return response;
}

static char *
http_get(int port, const char *path)
{
    char request[256];

    snprintf(request, sizeof(request), "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path);
    return http_exchange(port, request);
}

static int
status_of(const char *response)
{
    int status = 0;

    assert_int_equal(sscanf(response, "HTTP/1.1 %d", &status), 1);
    return status;
}

static const char *
body_of(const char *response)
{
    const char *body = strstr(response, "\r\n\r\n");

    assert_non_null(body);
    return body + 4;
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    struct listen_addr addr;
    struct outbox_error err;

    assert_non_null(f);
    f->metrics = metrics_new("redis");
    assert_non_null(f->metrics);
    assert_int_equal(listen_addr_parse("127.0.0.1:0", &addr, &err), 0);
    if (http_server_start(&addr, f->metrics, &f->server, &err) != 0)
        fail_msg("start: %s", err.message);
    f->port = http_server_port(f->server);
    assert_true(f->port > 0);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    http_server_stop(f->server);
    metrics_free(f->metrics);
    free(f);
    return 0;
}

static void
test_metrics_endpoint(void **state)
{
    struct fixture *f = *state;
    char *response, *expected;

    metrics_add_queue(f->metrics, METRICS_ROWS_PUBLISHED, "orders", 42);
    expected = metrics_render(f->metrics, NULL);
    response = http_get(f->port, "/metrics?x=1");
    assert_int_equal(status_of(response), 200);
    assert_non_null(strstr(response, "\r\nContent-Type: text/plain; version=0.0.4"));
    assert_string_equal(body_of(response), expected);
    assert_non_null(strstr(body_of(response),
                           "outbox_rows_published_total{broker=\"redis\",queue=\"orders\"} 42\n"));
    free(response);
    free(expected);

    /* HEAD: headers only. */
    response = http_exchange(f->port, "HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_int_equal(status_of(response), 200);
    assert_string_equal(body_of(response), "");
    free(response);
}

static void
test_healthz_follows_relay(void **state)
{
    struct fixture *f = *state;
    char *response;

    /* Nothing reported yet: not healthy. */
    response = http_get(f->port, "/healthz");
    assert_int_equal(status_of(response), 503);
    free(response);

    metrics_set_health(f->metrics, true, true);
    response = http_get(f->port, "/healthz");
    assert_int_equal(status_of(response), 200);
    /* the verdict, then the age of each end's last round trip */
    assert_int_equal(strncmp(body_of(response), "ok\ndatabase: last round trip ", 29), 0);
    assert_non_null(strstr(body_of(response), " s ago\nbroker: last round trip "));
    free(response);
    response = http_get(f->port, "/readyz");
    assert_int_equal(status_of(response), 200);
    free(response);

    metrics_set_health(f->metrics, true, false);
    response = http_get(f->port, "/healthz");
    assert_int_equal(status_of(response), 503);
    assert_int_equal(strncmp(body_of(response), "broker down\ndatabase: last round trip ", 38),
                     0);
    assert_non_null(strstr(body_of(response), " s ago\nbroker: no round trip yet\n"));
    free(response);
    response = http_get(f->port, "/readyz");
    assert_int_equal(status_of(response), 503);
    free(response);
}

static void
test_errors(void **state)
{
    struct fixture *f = *state;
    char *response, *big;

    response = http_get(f->port, "/nope");
    assert_int_equal(status_of(response), 404);
    free(response);

    response = http_exchange(f->port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_int_equal(status_of(response), 405);
    assert_non_null(strstr(response, "\r\nAllow: GET, HEAD\r\n"));
    free(response);

    response = http_exchange(f->port, "garbage\r\n\r\n");
    assert_int_equal(status_of(response), 400);
    free(response);

    /* Headers beyond the limit are refused, not buffered. */
    big = malloc(HTTP_REQUEST_MAX_BYTES + 64);
    assert_non_null(big);
    memset(big, 'a', HTTP_REQUEST_MAX_BYTES + 63);
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
    big[HTTP_REQUEST_MAX_BYTES + 63] = '\0';
    response = http_exchange(f->port, big);
    assert_int_equal(status_of(response), 431);
    free(response);
    free(big);

    /* The server is still serving after all that. */
    response = http_get(f->port, "/metrics");
    assert_int_equal(status_of(response), 200);
    free(response);
}

static double
seconds_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * A connection to the server that neither waits long to connect nor to read
 * (generous bounds: the server answers in milliseconds), non-blocking when
 * idle is true (only opened, never read from).
 */
static int
connect_bounded(int port, bool idle)
{
    struct sockaddr_in sa;
    struct timeval timeout = {10, 0};
    int fd = socket(AF_INET, SOCK_STREAM | (idle ? SOCK_NONBLOCK : 0), 0);
    int rc;

    assert_true(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout)); /* bounds connect() */
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(rc == 0 || (idle && errno == EINPROGRESS));
    return fd;
}

/* Sends request on a fresh bounded connection and reads the answer until close. */
static char *
http_exchange_bounded(int port, const char *request, size_t request_len)
{
    int fd = connect_bounded(port, false);
    size_t len = 0, cap = 1 << 16;
    char *response = malloc(cap);
    ssize_t n;

    assert_non_null(response);
    assert_int_equal(send(fd, request, request_len, MSG_NOSIGNAL), (ssize_t)request_len);
    while ((n = recv(fd, response + len, cap - len - 1, 0)) > 0) {
        len += (size_t)n;
        if (cap - len < 1024) {
            char *grown = realloc(response, cap * 2);

            assert_non_null(grown);
            response = grown;
            cap *= 2;
        }
    }
    response[len] = '\0';
    close(fd);
    return response;
}

static char *
http_get_bounded(int port, const char *path)
{
    char request[256];
    int n = snprintf(request, sizeof(request), "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path);

    return http_exchange_bounded(port, request, (size_t)n);
}

#define IDLE_CLIENTS 100
#define TRICKLING_CLIENTS 10

/*
 * A hundred connections that send nothing and ten that trickle a request a
 * byte at a time do not hold off /healthz or /metrics: the server serves
 * many connections at once and drops the oldest idle one when it is full.
 * The time to answer is printed, not asserted (a shared machine's timing is
 * for the benchmark); the bound here is the client's 10 s receive timeout.
 */
static void
test_idle_connections_do_not_hold_off_healthz(void **state)
{
    struct fixture *f = *state;
    static const char trickle[] = "GET /healthz HTTP/1.1\r\n";
    int idle[IDLE_CLIENTS], trickling[TRICKLING_CLIENTS];
    double started, healthz_seconds, metrics_seconds;
    char *response;

    metrics_set_health(f->metrics, true, true);
    for (int i = 0; i < TRICKLING_CLIENTS; i++)
        trickling[i] = connect_bounded(f->port, true);
    for (int i = 0; i < IDLE_CLIENTS; i++)
        idle[i] = connect_bounded(f->port, true);
    for (size_t byte = 0; byte < 3; byte++) {
        for (int i = 0; i < TRICKLING_CLIENTS; i++)
            send(trickling[i], trickle + byte, 1, MSG_NOSIGNAL);
        usleep(100 * 1000);
    }

    started = seconds_now();
    response = http_get_bounded(f->port, "/healthz");
    healthz_seconds = seconds_now() - started;
    assert_int_equal(status_of(response), 200);
    assert_int_equal(strncmp(body_of(response), "ok\n", 3), 0);
    free(response);

    started = seconds_now();
    response = http_get_bounded(f->port, "/metrics");
    metrics_seconds = seconds_now() - started;
    assert_int_equal(status_of(response), 200);
    assert_non_null(strstr(body_of(response), "outbox_"));
    free(response);
    print_message("with %d idle and %d trickling connections: /healthz in %.1f ms,"
                  " /metrics in %.1f ms\n",
                  IDLE_CLIENTS, TRICKLING_CLIENTS, healthz_seconds * 1000, metrics_seconds * 1000);

    for (int i = 0; i < TRICKLING_CLIENTS; i++)
        close(trickling[i]);
    for (int i = 0; i < IDLE_CLIENTS; i++)
        close(idle[i]);
}

#define HOSTILE_THREADS_MAX 3
#define HOSTILE_CLIENTS_MAX 100 /* per thread */
#define HOSTILE_PROBES 400
#define HOSTILE_UNANSWERED_MAX 2

/*
 * The crowd of test_hostile_reconnects: open while *running, each reconnected
 * once dropped; threads of clients each.
 */
struct hostile {
    int port;
    int threads, clients;
    atomic_bool running;
};

/*
 * Three threads of 60 clients; under valgrind (tests/run.sh's OUTBOX_VALGRIND),
 * which runs one thread at a time, one thread of 100: three crowds taking
 * whole scheduler slices in turn starve the server and the probes as no host
 * of two cores does. Either crowd is more than the server's 64 slots.
 */
static void
hostile_shape(struct hostile *h)
{
    const char *valgrind = getenv("OUTBOX_VALGRIND");
    bool serialized = valgrind != NULL && valgrind[0] != '\0';

    h->threads = serialized ? 1 : 3;
    h->clients = serialized ? 100 : 60;
}

static void *
hostile_main(void *arg)
{
    struct hostile *h = arg;
    struct pollfd fds[HOSTILE_CLIENTS_MAX];

    for (int i = 0; i < h->clients; i++)
        fds[i] = (struct pollfd){connect_bounded(h->port, true), POLLIN, 0};
    while (atomic_load(&h->running)) {
        if (poll(fds, (nfds_t)h->clients, 100) <= 0)
            continue;
        for (int i = 0; i < h->clients; i++) {
            char drain[256];

            if (fds[i].revents == 0 || recv(fds[i].fd, drain, sizeof(drain), 0) > 0)
                continue;
            close(fds[i].fd); /* dropped by the server: straight back in */
            fds[i].fd = connect_bounded(h->port, true);
            send(fds[i].fd, "GET /", 5, MSG_NOSIGNAL);
        }
    }
    for (int i = 0; i < h->clients; i++)
        close(fds[i].fd);
    return NULL;
}

/*
 * A hundred and eighty connections (hostile_shape()) that send half a
 * request and reconnect as fast as the server drops them (more than its
 * slots) do not cost health probes their answers: no two probes in a row go
 * unanswered, which is what an orchestrator acts on (failureThreshold 3 in
 * the chart), and at most HOSTILE_UNANSWERED_MAX of the 400 do (before, 6
 * and 8 of 400 were closed unanswered, some in a row). Not zero: with more
 * reconnecting clients than slots, a probe accepted while its client has
 * not yet been scheduled to send its request can still lose its slot (about
 * 1 in 4 000 probes here).
 */
static void
test_hostile_reconnects_do_not_drop_healthz(void **state)
{
    struct fixture *f = *state;
    struct hostile h = {.port = f->port};
    pthread_t threads[HOSTILE_THREADS_MAX];
    int unanswered = 0, in_a_row = 0, most_in_a_row = 0;

    metrics_set_health(f->metrics, true, true);
    atomic_init(&h.running, true);
    hostile_shape(&h);
    for (int i = 0; i < h.threads; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, hostile_main, &h), 0);
    usleep(200 * 1000);
    for (int i = 0; i < HOSTILE_PROBES; i++) {
        char *response = http_get_bounded(f->port, "/healthz");

        if (strncmp(response, "HTTP/1.1 200 ", 13) != 0) {
            unanswered++;
            in_a_row++;
        } else {
            in_a_row = 0;
        }
        if (in_a_row > most_in_a_row)
            most_in_a_row = in_a_row;
        free(response);
    }
    atomic_store(&h.running, false);
    for (int i = 0; i < h.threads; i++)
        pthread_join(threads[i], NULL);
    if (unanswered > HOSTILE_UNANSWERED_MAX || most_in_a_row > 1)
        fail_msg("%d of %d /healthz probes unanswered (%d in a row) under %d reconnecting"
                 " connections",
                 unanswered, HOSTILE_PROBES, most_in_a_row, h.threads * h.clients);
}

/* The metrics clock of test_livez_is_only_a_stuck_loop: seconds the test sets. */
static double
fake_now(void *context)
{
    return *(double *)context;
}

/*
 * /livez (what an orchestrator's liveness probe asks) is 200 while the
 * database and the broker are down, where /healthz is 503, and 503 only
 * when the relay loop stopped turning: a restart fixes a stuck process,
 * never an outage of an end.
 */
static void
test_livez_is_only_a_stuck_loop(void **state)
{
    struct fixture *f = *state;
    double now = 1000;
    char *response;

    metrics_set_clock(f->metrics, fake_now, &now);
    response = http_get(f->port, "/livez"); /* starting: not stuck */
    assert_int_equal(status_of(response), 200);
    free(response);
    metrics_set_health(f->metrics, false, false);
    response = http_get(f->port, "/healthz");
    assert_int_equal(status_of(response), 503);
    free(response);
    response = http_get(f->port, "/livez");
    assert_int_equal(status_of(response), 200);
    assert_string_equal(body_of(response), "alive\n");
    free(response);
    now += 25;
    metrics_loop_turned(f->metrics); /* a reconnect attempt turns the loop */
    now += 25;
    response = http_get(f->port, "/livez");
    assert_int_equal(status_of(response), 200);
    free(response);
    now += 20;
    response = http_get(f->port, "/livez");
    assert_int_equal(status_of(response), 503);
    assert_string_equal(body_of(response), "relay loop stalled for 45 s\n");
    free(response);
}

/* Bytes that cannot start a request get a 400 and a close at once, without a line end. */
static void
test_garbage_gets_400_at_once(void **state)
{
    struct fixture *f = *state;
    static const char *const garbage[] = {"\x16\x03\x01\x02\x00\x01\x00",
                                          "hello world",
                                          "GET metrics",
                                          "GET /metrics XTTP",
                                          "\r\n\r\n",
                                          "GET /\x01"};

    for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
        double started = seconds_now();
        char *response = http_exchange_bounded(f->port, garbage[i], strlen(garbage[i]) + (i == 0));

        if (strncmp(response, "HTTP/1.1 400 ", 13) != 0)
            fail_msg("garbage %zu got '%.40s', expected a 400", i, response);
        /* answered on sight, not when the request timeout closes the connection */
        assert_true(seconds_now() - started < HTTP_REQUEST_TIMEOUT_SECONDS);
        free(response);
    }
}

static void
test_stop_with_hanging_client(void **state)
{
    struct fixture *f = *state;
    int silent = connect_loopback(f->port);
    double started;

    /* A client that connects and sends half a request, then nothing. */
    assert_int_equal(send(silent, "GET /met", 8, MSG_NOSIGNAL), 8);
    usleep(100 * 1000);
    started = seconds_now();
    http_server_stop(f->server);
    f->server = NULL;
    /* Stop does not wait for the client's request timeout. */
    assert_true(seconds_now() - started < HTTP_REQUEST_TIMEOUT_SECONDS);
    close(silent);
}

static void
test_taken_port_fails_clearly(void **state)
{
    struct sockaddr_in sa;
    socklen_t sa_len = sizeof(sa);
    struct listen_addr addr;
    struct outbox_error err;
    struct http_server *server = NULL;
    struct metrics *m = metrics_new(NULL);
    char text[64], expected[80];
    int blocker = socket(AF_INET, SOCK_STREAM, 0);

    (void)state;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(blocker, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(blocker, 1), 0);
    assert_int_equal(getsockname(blocker, (struct sockaddr *)&sa, &sa_len), 0);

    snprintf(text, sizeof(text), "127.0.0.1:%d", ntohs(sa.sin_port));
    assert_int_equal(listen_addr_parse(text, &addr, &err), 0);
    assert_int_equal(http_server_start(&addr, m, &server, &err), -1);
    assert_null(server);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    snprintf(expected, sizeof(expected), "'%s'", text);
    if (strstr(err.message, expected) == NULL || strstr(err.message, "in use") == NULL)
        fail_msg("unclear error: %s", err.message);
    close(blocker);
    metrics_free(m);
}

static void
test_addr_parse(void **state)
{
    static const char *const bad[] = {
        "",         "localhost", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:65536",
        "::1:9187", "[::1]9187", "host:123456"};
    struct listen_addr addr;
    struct outbox_error err;

    (void)state;
    assert_int_equal(listen_addr_parse("off", &addr, &err), 0);
    assert_true(addr.off);
    assert_int_equal(listen_addr_parse(HTTP_DEFAULT_ADDR, &addr, &err), 0);
    assert_false(addr.off);
    assert_string_equal(addr.host, "127.0.0.1");
    assert_string_equal(addr.port, "9187");
    assert_int_equal(listen_addr_parse("[::1]:9187", &addr, &err), 0);
    assert_string_equal(addr.host, "::1");
    assert_int_equal(listen_addr_parse(":9000", &addr, &err), 0);
    assert_string_equal(addr.host, "");
    assert_string_equal(addr.port, "9000");
    assert_int_equal(listen_addr_parse("metrics.local:09187", &addr, &err), 0);
    assert_string_equal(addr.port, "9187");

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (listen_addr_parse(bad[i], &addr, &err) != -1)
            fail_msg("accepted bad address '%s'", bad[i]);
        assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
        assert_non_null(strstr(err.message, "--metrics-addr"));
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_metrics_endpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_healthz_follows_relay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_livez_is_only_a_stuck_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_connections_do_not_hold_off_healthz, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hostile_reconnects_do_not_drop_healthz, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_garbage_gets_400_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_with_hanging_client, setup, teardown),
        cmocka_unit_test(test_taken_port_fails_clearly),
        cmocka_unit_test(test_addr_parse),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
