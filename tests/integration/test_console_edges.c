/*
 * test_console_edges.c - `outboxctl serve` at its edges, as an attacker on
 * the host would try it: actions that must name what they act on, values
 * from the database escaped in every answer, request heads a proxy in
 * front could read another way, the auth scheme in any case, failed logins
 * throttled, cheap requests that no slow page holds up, and the succeeded
 * estimate of a large table.
 *
 * Needs the environment tests/run.sh gives (OUTBOX_TEST_PG_URL, OUTBOX_BIN).
 * Each test has its own database and its own console process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "clock.h"
#include "console_client.h"
#include "fixtures.h"
#include "harness.h"

struct fixture {
    char *url;
    PGconn *conn;
    PGconn *other; /* a session holding a lock, closed by teardown */
    char token_file[128];
    int port;
    pid_t pid;
};

/* Dead rows in three queues, some with the ordering key k or the error "timeout". */
static const char seed_sql[] =
    "INSERT INTO outbox.job (queue, payload, headers, state, attempts, max_attempts,"
    "                        finished_at, last_error, ordering_key)"
    " SELECT q, '{\"html\": \"</script><b>\"}', '{\"x-note\": \"<i>&\"}', 'dead', 3, 3, now(),"
    "        CASE WHEN i % 2 = 0 THEN 'timeout' ELSE 'refused' END,"
    "        CASE WHEN i % 3 = 0 THEN 'k' END"
    " FROM unnest(ARRAY['orders', 'billing', 'mail']) AS q, generate_series(1, 5) AS i";

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    const char *options[] = {"--auth-token-file", NULL, "--allow-actions", NULL};

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    harness_exec(f->conn, seed_sql);
    console_token_file(f->token_file, sizeof(f->token_file), "edges");
    options[1] = f->token_file;
    f->port = harness_closed_port();
    f->pid = console_start(f->port, f->url, options);
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
    unlink(f->token_file);
    free(f);
    return 0;
}

static long long
dead_rows(const struct fixture *f)
{
    return harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'dead'");
}

static void
expect(struct http_reply r, int status, const char *body_part)
{
    console_expect(&r, status, body_part);
    http_reply_free(&r);
}

/* Runs `outboxctl --database-url URL dead retry` with one more word (or none); its exit status. */
static int
dead_retry_cli(const struct fixture *f, const char *word, const char *value)
{
    char bin[512];
    char *log = harness_log_path("edges-outboxctl");
    const char *argv[] = {bin, "--database-url", f->url, "dead", "retry", word, value, NULL};
    int status;

    snprintf(bin, sizeof(bin), "%s/outboxctl", harness_env("OUTBOX_BIN"));
    status = harness_wait_exit(harness_spawn(argv, log), 30000);
    free(log);
    return status;
}

/*
 * A retry or delete acts only where it is told: a body that names neither
 * job ids nor a queue (only narrowing fields, or none) is refused, every
 * queue needs "all": true, and the answer counts the rows. The command line
 * likewise: `dead retry` alone is a usage error, --all retries everywhere.
 */
static void
test_dead_actions_need_a_selection(void **state)
{
    struct fixture *f = *state;

    expect(console_post(f->port, "/api/v1/dead/delete", "{\"error\":\"timeout\"}"), 400,
           "true for every queue");
    expect(console_post(f->port, "/api/v1/dead/retry", "{\"ordering_key\":\"k\"}"), 400,
           "give job_ids");
    expect(console_post(f->port, "/api/v1/dead/retry", "{}"), 400, "give job_ids");
    expect(console_post(f->port, "/api/v1/dead/delete", "{\"all\":false}"), 400, "give job_ids");
    expect(console_post(f->port, "/api/v1/dead/delete", "{\"all\":true,\"queue\":\"mail\"}"), 400,
           "excludes");
    expect(console_post(f->port, "/api/v1/dead/delete", "{\"all\":\"yes\"}"), 400,
           "all must be true or false");
    expect(console_post(f->port, "/api/v1/dead/delete", "{\"queues\":[\"mail\"]}"), 400,
           "unknown field 'queues'");
    assert_int_equal(dead_rows(f), 15);

    /* a queue, narrowed: only its rows */
    expect(console_post(f->port, "/api/v1/dead/delete", "{\"queue\":\"mail\",\"error\":\"timeout\"}"),
           200, "{\"deleted\":2}");
    /* every queue, said so, narrowed by the error: 2 + 2 of the other two queues */
    expect(console_post(f->port, "/api/v1/dead/retry", "{\"all\":true,\"error\":\"timeout\"}"), 200,
           "{\"retried\":4}");
    assert_int_equal(dead_rows(f), 9);

    assert_int_equal(dead_retry_cli(f, NULL, NULL), 2);
    assert_int_equal(dead_retry_cli(f, "--all", NULL), 0);
    assert_int_equal(dead_rows(f), 0);
}

/* Payloads and headers of dead rows come back with < > & as \u escapes, as docs/console.md says. */
static void
test_dead_api_escapes_payloads(void **state)
{
    struct fixture *f = *state;
    struct http_reply r = console_get(f->port, "/api/v1/dead?queue=orders&limit=1");

    console_expect(&r, 200, "\\u003c/script\\u003e\\u003cb\\u003e");
    assert_non_null(strstr(r.body, "\\u003ci\\u003e\\u0026"));
    assert_null(strchr(r.body, '<'));
    assert_null(strchr(r.body, '>'));
    http_reply_free(&r);
}

/*
 * Sends the len bytes of request on a fresh connection and reads the
 * answer's status (0: closed without one); *seconds how long that took.
 */
static int
raw_status(int port, const char *request, size_t len, double *seconds)
{
    double started = clock_monotonic_seconds();
    char answer[512] = "";
    int fd = fixture_connect_loopback(port, 15), status = 0;
    size_t got = 0;
    ssize_t n;

    assert_true(fd >= 0);
    assert_int_equal(write(fd, request, len), (ssize_t)len);
    while (got < sizeof(answer) - 1 && (n = read(fd, answer + got, sizeof(answer) - 1 - got)) > 0)
        got += (size_t)n;
    close(fd);
    *seconds = clock_monotonic_seconds() - started;
    if (sscanf(answer, "HTTP/1.1 %d", &status) != 1)
        status = 0;
    return status;
}

/* Sends the request of the format (a NUL written as \x01) and expects a 400 within a second. */
static void
expect_refused_at_once(int port, const char *format)
{
    char request[512];
    int len = snprintf(request, sizeof(request), format, port);
    double seconds;
    int status;

    for (int i = 0; i < len; i++)
        if (request[i] == '\x01')
            request[i] = '\0';
    status = raw_status(port, request, (size_t)len, &seconds);
    if (status != 400 || seconds > 1.0)
        fail_msg("'%.40s...' got %d after %.1f s, expected a 400 at once", format, status, seconds);
}

/*
 * Heads a proxy in front could read another way are refused at once: a NUL
 * in a header or the path (not a 408 after the request deadline), a CR
 * without its LF (which split a header into two), a second Host.
 */
static void
test_request_heads_refused(void **state)
{
    struct fixture *f = *state;

    expect_refused_at_once(f->port, "GET /api/v1/queues HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                    "X-Note: a\x01" "b\r\n\r\n");
    expect_refused_at_once(f->port, "GET /api/v1/que\x01ues HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n");
    expect_refused_at_once(f->port, "GET /api/v1/queues HTTP/1.1\r\nX-Note: a\rHost: evil\r\n"
                                    "Host: 127.0.0.1:%d\r\n" CONSOLE_BEARER "\r\n");
    expect_refused_at_once(f->port, "GET /api/v1/queues HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                    "Host: evil.example\r\n" CONSOLE_BEARER "\r\n");
    /* and a plain one still works */
    expect(console_get(f->port, "/api/v1/queues"), 200, "\"queue\":\"orders\"");
}

/* The dead rows page answers a queue that is not UTF-8 with 400, as the API does. */
static void
test_dead_page_bad_queue_is_400(void **state)
{
    struct fixture *f = *state;

    expect(console_get(f->port, "/api/v1/dead?queue=%FF%FE"), 400, NULL);
    expect(console_get(f->port, "/dead?queue=%FF%FE"), 400, NULL);
}

/* The scheme of Authorization is case-insensitive (RFC 7235). */
static void
test_bearer_in_any_case(void **state)
{
    struct fixture *f = *state;

    expect(http_request(f->port, "GET", "/api/v1/session",
                        "Authorization: bearer " CONSOLE_TOKEN "\r\n", NULL, 20),
           200, "\"identity\":\"bearer\"");
    expect(http_request(f->port, "GET", "/api/v1/session",
                        "Authorization: BEARER " CONSOLE_TOKEN "\r\n", NULL, 20),
           200, "\"identity\":\"bearer\"");
}

/*
 * Wrong tokens from one address are throttled: after ten in a minute the
 * address gets 429, by bearer or by the login form, its right token too.
 */
static void
test_failed_logins_throttled(void **state)
{
    struct fixture *f = *state;
    int refused = 0, throttled = 0;

    for (int i = 0; i < 15; i++) {
        struct http_reply r =
            http_request(f->port, "GET", "/api/v1/queues",
                         "Authorization: Bearer wrong-token-0000000\r\n", NULL, 20);

        refused += r.status == 401;
        throttled += r.status == 429;
        http_reply_free(&r);
    }
    assert_int_equal(refused, 10);
    assert_int_equal(throttled, 5);
    expect(console_get(f->port, "/api/v1/queues"), 429, "too many failed logins");
    expect(http_request(f->port, "POST", "/login",
                        "Content-Type: application/x-www-form-urlencoded\r\n",
                        "token=" CONSOLE_TOKEN, 20),
           429, "too many failed logins");
}

/*
 * While every worker waits on a slow page (a query held by a lock), the
 * cheap requests are answered at once: the session, the stylesheet, the
 * script, the login page.
 */
static void
test_cheap_requests_not_behind_slow_ones(void **state)
{
    struct fixture *f = *state;
    static const char *const cheap[] = {"/api/v1/session", "/static/console.css",
                                        "/static/console.js", "/login"};
    int slow[8];

    f->other = harness_connect(f->url);
    harness_exec(f->other, "BEGIN; LOCK TABLE outbox.paused IN ACCESS EXCLUSIVE MODE");
    for (int i = 0; i < 8; i++) {
        slow[i] = fixture_connect_loopback(f->port, 10);
        assert_true(slow[i] >= 0);
        assert_true(dprintf(slow[i], "GET /api/v1/paused HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                     CONSOLE_BEARER "\r\n", f->port) > 0);
    }
    usleep(300 * 1000); /* the workers now wait for the lock */
    for (size_t i = 0; i < sizeof(cheap) / sizeof(cheap[0]); i++) {
        double started = clock_monotonic_seconds();
        struct http_reply r = http_request(f->port, "GET", cheap[i], CONSOLE_BEARER, NULL, 5);
        double took = clock_monotonic_seconds() - started;

        if (r.status != 200 || took > 0.5)
            fail_msg("%s: %d after %.2f s behind slow pages, expected 200 at once", cheap[i],
                     r.status, took);
        http_reply_free(&r);
    }
    harness_exec(f->other, "COMMIT");
    for (int i = 0; i < 8; i++)
        close(slow[i]);
}

/*
 * Past the size where succeeded rows are counted (64 MiB), each queue's
 * succeeded is estimated near its count with a margin that holds it: 200
 * queues of 900 succeeded rows (180 000, 76 MB), more queues than the
 * planner keeps most common values of. Before, a queue outside that list
 * read 0 (7 709 in all where 600 000 were).
 */
static void
test_succeeded_estimate_at_scale(void **state)
{
    struct fixture *f = *state;
    struct http_reply r;
    long long total = 0;
    int queues = 0;
    char *p;

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                          " SELECT 'q' || (i % 200), jsonb_build_object('pad', repeat('x', 300)),"
                          "        'succeeded', 1, now() - interval '2 hours'"
                          "   FROM generate_series(1, 180000) AS i;"
                          "INSERT INTO outbox.job (queue, payload)"
                          " SELECT 'q' || (i % 200), '{}' FROM generate_series(1, 1000) AS i;"
                          "ANALYZE outbox.job");
    r = console_get(f->port, "/api/v1/overview");
    console_expect(&r, 200, "\"succeeded_estimated\":true");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues");
    console_expect(&r, 200, NULL);
    for (p = strstr(r.body, "{\"queue\":\"q"); p != NULL; p = strstr(p + 1, "{\"queue\":\"q")) {
        long long succeeded = -1, margin = -1;

        assert_true(sscanf(strstr(p, "\"succeeded\":"), "\"succeeded\":%lld", &succeeded) == 1);
        assert_true(sscanf(strstr(p, "\"succeeded_margin\":"), "\"succeeded_margin\":%lld",
                           &margin) == 1);
        if (margin <= 0 || llabs(succeeded - 900) > 2 * margin)
            fail_msg("a queue of 900 succeeded rows reads %lld +- %lld: %.60s", succeeded, margin,
                     p);
        total += succeeded;
        queues++;
    }
    http_reply_free(&r);
    assert_int_equal(queues, 200);
    if (llabs(total - 180000) > 9000)
        fail_msg("succeeded in all: %lld estimated for 180000", total);
}

/* The sum of the "published" counts of a GET chart. */
static long long
chart_published(const struct fixture *f)
{
    struct http_reply r = console_get(f->port, "/api/v1/chart");
    long long total = 0, n;

    console_expect(&r, 200, "\"minutes\":[");
    for (const char *p = strstr(r.body, "\"published\":"); p != NULL;
         p = strstr(p + 1, "\"published\":"))
        if (sscanf(p, "\"published\":%lld", &n) == 1)
            total += n;
    http_reply_free(&r);
    return total;
}

/*
 * The chart keeps the minutes that are over between requests and counts
 * only the recent ones again: rows published now show at the next request,
 * those of ten minutes ago stay counted.
 */
static void
test_chart_keeps_past_minutes_counts_new_ones(void **state)
{
    struct fixture *f = *state;
    static const char publish_sql[] =
        "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at, created_at)"
        " SELECT 'charted', '{}', 'succeeded', 1, now() - %s, now() - %s"
        "   FROM generate_series(1, %d)";
    char sql[512];

    snprintf(sql, sizeof(sql), publish_sql, "interval '10 minutes'", "interval '11 minutes'", 30);
    harness_exec(f->conn, sql);
    assert_int_equal(chart_published(f), 30);
    snprintf(sql, sizeof(sql), publish_sql, "interval '0 seconds'", "interval '1 second'", 7);
    harness_exec(f->conn, sql);
    assert_int_equal(chart_published(f), 37);
    assert_int_equal(chart_published(f), 37);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dead_actions_need_a_selection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_api_escapes_payloads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_heads_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_page_bad_queue_is_400, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bearer_in_any_case, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_logins_throttled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cheap_requests_not_behind_slow_ones, setup, teardown),
        cmocka_unit_test_setup_teardown(test_succeeded_estimate_at_scale, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chart_keeps_past_minutes_counts_new_ones, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
