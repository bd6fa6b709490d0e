/*
 * test_console.c - `outboxctl serve` against a real PostgreSQL: every
 * endpoint of the JSON API and the pages, the token and the login cookie,
 * CSRF, read-only mode, escaping of values from the database, bad input,
 * the listen rules and a database that is away.
 *
 * Needs the environment tests/run.sh gives (OUTBOX_TEST_PG_URL, OUTBOX_BIN).
 * Each test has its own database and its own console process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "console_client.h"
#include "fixtures.h"
#include "harness.h"

#define XSS_ERROR "<img src=x onerror=alert(1)>"
#define XSS_KEY "<script>alert(2)</script>"

struct fixture {
    char *url;
    const char *serve_url; /* the console's database when not url */
    PGconn *conn;
    PGconn *other; /* a second session of a test, closed by teardown */
    char token_file[128];
    int port;
    pid_t pid;
};

/* One request to the console of f, the way every test here sends it. */
static struct http_reply
http(int port, const char *method, const char *path, const char *extra, const char *body)
{
    return http_request(port, method, path, extra, body, 20);
}

/* Starts a console with the given options (NULL-terminated); waits until it answers. */
static void
start_console(struct fixture *f, const char *const *options)
{
    f->port = harness_closed_port();
    f->pid = console_start(f->port, f->serve_url ? f->serve_url : f->url, options);
}

static void
stop_console(struct fixture *f)
{
    console_stop(f->pid);
    f->pid = 0;
}

static const char seed_sql[] =
    "SELECT outbox.enqueue('orders', '{\"n\": 1}');"
    "SELECT outbox.enqueue('orders', '{\"n\": 2}', ordering_key => 'k1');"
    "SELECT outbox.enqueue('billing', '{\"n\": 3}');"
    "INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts, finished_at,"
    "                        last_error, ordering_key)"
    " VALUES ('orders', '{\"html\": \"<b>bold</b>\"}', 'dead', 3, 3, now(), '" XSS_ERROR "',"
    "         '" XSS_KEY "');"
    "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at, created_at)"
    " SELECT 'orders', '{}', 'succeeded', 1, now() - interval '2 minutes',"
    "        now() - interval '3 minutes' FROM generate_series(1, 5);"
    "INSERT INTO outbox.job (queue, payload, state, attempts, worker_id, lease_until)"
    " VALUES ('billing', '{}', 'running', 1, 'relay-a', now() + interval '30 seconds');";

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    harness_exec(f->conn, seed_sql);
    console_token_file(f->token_file, sizeof(f->token_file), "console");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    PQfinish(f->other); /* first: a lock it holds would keep the console from stopping */
    stop_console(f);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    unlink(f->token_file);
    free(f);
    return 0;
}

static void
start_with_token(struct fixture *f, bool actions)
{
    const char *options[] = {"--auth-token-file", f->token_file,
                             actions ? "--allow-actions" : NULL, NULL};

    start_console(f, options);
}

/* ---- access ---- */

static void
test_token_required(void **state)
{
    struct fixture *f = *state;
    struct http_reply r;

    start_with_token(f, true);
    r = http(f->port, "GET", "/api/v1/queues", NULL, NULL);
    console_expect(&r, 401, "authentication required");
    http_reply_free(&r);
    r = http(f->port, "GET", "/api/v1/queues", "Authorization: Bearer wrong-token-000000\r\n",
             NULL);
    console_expect(&r, 401, NULL);
    http_reply_free(&r);
    r = http(f->port, "POST", "/api/v1/pause", "Content-Type: application/json\r\n",
             "{\"queue\":\"orders\"}");
    console_expect(&r, 401, NULL);
    http_reply_free(&r);
    /* a page without credentials is the login form, with 401 */
    r = http(f->port, "GET", "/", NULL, NULL);
    console_expect(&r, 401, "name=\"token\"");
    assert_null(strstr(r.body, "orders"));
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues");
    console_expect(&r, 200, "\"queue\":\"orders\"");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 0);
}

/* Logs in through the form; returns the "outbox_session=..." cookie (malloc'd). */
static char *
login(const struct fixture *f)
{
    struct http_reply r =
        http(f->port, "POST", "/login", "Content-Type: application/x-www-form-urlencoded\r\n",
             "token=" CONSOLE_TOKEN);
    char *cookie, *start, *end;

    console_expect(&r, 303, NULL);
    start = strstr(r.head, "Set-Cookie: outbox_session=");
    assert_non_null(start);
    assert_non_null(strstr(start, "HttpOnly"));
    assert_non_null(strstr(start, "SameSite=Strict"));
    start += strlen("Set-Cookie: ");
    end = strchr(start, ';');
    cookie = strndup(start, (size_t)(end - start));
    http_reply_free(&r);
    return cookie;
}

static void
test_login_cookie_and_csrf(void **state)
{
    struct fixture *f = *state;
    char *cookie, headers[512], csrf[80] = "";
    struct http_reply r;
    const char *at;

    start_with_token(f, true);
    r = http(f->port, "POST", "/login", NULL, "token=not-the-token-at-all");
    console_expect(&r, 401, "wrong token");
    assert_null(strstr(r.head, "Set-Cookie"));
    http_reply_free(&r);
    cookie = login(f);

    snprintf(headers, sizeof(headers), "Cookie: %s\r\n", cookie);
    r = http(f->port, "GET", "/", headers, NULL);
    console_expect(&r, 200, "data-queue=\"orders\"");
    assert_non_null(strstr(r.head, "Content-Security-Policy: default-src 'self'"));
    at = strstr(r.body, "name=\"csrf-token\" content=\"");
    assert_non_null(at);
    sscanf(at + strlen("name=\"csrf-token\" content=\""), "%64[0-9a-f]", csrf);
    assert_int_equal(strlen(csrf), 64);
    http_reply_free(&r);

    /* a cookie alone, or with a wrong token, cannot act: that is what a forged form sends */
    snprintf(headers, sizeof(headers), "Cookie: %s\r\nContent-Type: application/json\r\n", cookie);
    r = http(f->port, "POST", "/api/v1/pause", headers, "{\"queue\":\"orders\"}");
    console_expect(&r, 403, "csrf");
    http_reply_free(&r);
    snprintf(headers, sizeof(headers),
             "Cookie: %s\r\nContent-Type: application/json\r\nX-CSRF-Token: %064d\r\n", cookie, 0);
    r = http(f->port, "POST", "/api/v1/pause", headers, "{\"queue\":\"orders\"}");
    console_expect(&r, 403, "csrf");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 0);

    snprintf(headers, sizeof(headers),
             "Cookie: %s\r\nContent-Type: application/json\r\nX-CSRF-Token: %s\r\n", cookie, csrf);
    r = http(f->port, "POST", "/api/v1/pause", headers, "{\"queue\":\"orders\"}");
    console_expect(&r, 200, "\"changed\":true");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"
                                               " WHERE queue = 'orders'"),
                     1);

    /* after logout the cookie is worth nothing */
    snprintf(headers, sizeof(headers), "Cookie: %s\r\n", cookie);
    r = http(f->port, "POST", "/logout", headers, "");
    console_expect(&r, 303, NULL);
    http_reply_free(&r);
    r = http(f->port, "GET", "/api/v1/queues", headers, NULL);
    console_expect(&r, 401, NULL);
    http_reply_free(&r);
    free(cookie);
}

static void
test_read_only(void **state)
{
    struct fixture *f = *state;
    static const char *const posts[][2] = {
        {"/api/v1/pause", "{\"queue\":\"orders\"}"},
        {"/api/v1/resume", "{\"queue\":\"orders\"}"},
        {"/api/v1/dead/retry", "{\"queue\":\"orders\"}"},
        {"/api/v1/dead/delete", "{\"queue\":\"orders\"}"},
        {"/api/v1/replay", "{\"queue\":\"orders\",\"since\":\"-infinity\",\"dry_run\":false}"},
    };
    struct http_reply r;

    start_with_token(f, false);
    for (size_t i = 0; i < sizeof(posts) / sizeof(posts[0]); i++) {
        r = console_post(f->port, posts[i][0], posts[i][1]);
        console_expect(&r, 403, "read-only");
        http_reply_free(&r);
    }
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'dead'"),
                     1);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     5);
    r = console_get(f->port, "/api/v1/dead");
    console_expect(&r, 200, "\"job_id\"");
    http_reply_free(&r);
    r = console_get(f->port, "/dead");
    console_expect(&r, 200, "<fieldset disabled>");
    http_reply_free(&r);
}

/* ---- endpoints ---- */

static void
test_get_endpoints(void **state)
{
    struct fixture *f = *state;
    struct http_reply r;

    start_with_token(f, true);
    r = console_get(f->port, "/api/v1/queues");
    console_expect(&r, 200, "{\"queue\":\"billing\",\"ready\":1,\"running\":1,\"succeeded\":0,\"dead\":0,");
    assert_non_null(strstr(r.body, "{\"queue\":\"orders\",\"ready\":2,\"running\":0,"
                                   "\"succeeded\":5,\"dead\":1,"));
    assert_non_null(strstr(r.body, "\"oldest_ready_seconds\":"));
    assert_non_null(strstr(r.body, "\"blocked_keys\":1"));
    assert_non_null(strstr(r.head, "Content-Type: application/json"));
    http_reply_free(&r);

    r = console_get(f->port, "/api/v1/dead?queue=orders&limit=10");
    console_expect(&r, 200, "\"queue\":\"orders\"");
    assert_non_null(strstr(r.body, "\"attempts\":3"));
    /* the payload's JSON as it is, but for < > &, escaped like every string of an answer */
    assert_non_null(strstr(r.body, "\"payload\":{\"html\": \"\\u003cb\\u003ebold\\u003c/b\\u003e\"}"));
    assert_non_null(strstr(r.body, "\"last_error\":\"\\u003cimg src=x onerror=alert(1)\\u003e\""));
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/dead?queue=billing");
    console_expect(&r, 200, NULL);
    assert_string_equal(r.body, "[]\n");
    http_reply_free(&r);
    /* a payload too big for a page comes cut, as a JSON string that says so */
    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                          " VALUES ('big', jsonb_build_object('s', repeat('x', 70000)), 'dead',"
                          " 1, now())");
    r = console_get(f->port, "/api/v1/dead?queue=big");
    console_expect(&r, 200, "xxx [cut]\"");
    assert_true(strlen(r.body) < 67000);
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/dead?error=ONERROR");
    console_expect(&r, 200, "\"job_id\"");
    http_reply_free(&r);

    r = console_get(f->port, "/api/v1/overview");
    console_expect(&r, 200, "\"schema_version\":");
    assert_non_null(strstr(r.body, "\"succeeded_estimated\":false"));
    assert_non_null(strstr(r.body, "\"vacuum_horizon\":{"));
    assert_non_null(strstr(r.body, "\"relays\":[{\"worker_id\":\"relay-a\",\"rows\":1,"));
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/relays");
    console_expect(&r, 200, "\"worker_id\":\"relay-a\"");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/blocked");
    console_expect(&r, 200, "\"head_state\":\"dead\"");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/paused");
    console_expect(&r, 200, NULL);
    assert_string_equal(r.body, "[]\n");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/chart");
    console_expect(&r, 200, "\"minutes\":[{\"minute\":");
    assert_non_null(strstr(r.body, "\"published\":5"));
    assert_non_null(strstr(r.body, "\"enqueued\":5,")); /* the 5 rows created 3 minutes ago */
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/session");
    console_expect(&r, 200, "\"identity\":\"bearer\"");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/nothing");
    console_expect(&r, 404, "no such endpoint");
    http_reply_free(&r);

    static const char *const pages[] = {"/", "/dead", "/dead?queue=orders", "/keys", "/replay"};
    for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++) {
        r = console_get(f->port, pages[i]);
        console_expect(&r, 200, "</html>");
        assert_non_null(strstr(r.head, "Content-Security-Policy: default-src 'self'"));
        assert_null(strstr(r.body, "<script>")); /* no inline script anywhere */
        assert_null(strstr(r.body, "style=\""));
        http_reply_free(&r);
    }
    r = console_get(f->port, "/static/console.js");
    console_expect(&r, 200, "X-CSRF-Token");
    http_reply_free(&r);
}

static void
test_dead_retry_and_delete(void **state)
{
    struct fixture *f = *state;
    long long dead_id = harness_query_ll(f->conn, "SELECT job_id FROM outbox.job"
                                                  " WHERE state = 'dead'");
    char body[128];
    struct http_reply r;

    start_with_token(f, true);
    snprintf(body, sizeof(body), "{\"job_ids\":[%lld]}", dead_id);
    r = console_post(f->port, "/api/v1/dead/retry", body);
    console_expect(&r, 200, "{\"retried\":1}");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state ="
                                               " 'ready' AND max_attempts = 4 AND job_id = (SELECT"
                                               " max(job_id) FROM outbox.job WHERE attempts = 3)"),
                     1);
    r = console_post(f->port, "/api/v1/dead/retry", body);
    console_expect(&r, 200, "{\"retried\":0}");
    http_reply_free(&r);

    /* more dead rows than one batch: all of them, in several transactions */
    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at,"
                          " last_error) SELECT 'bulk', '{}', 'dead', 1, now(), 'boom ' || i"
                          " FROM generate_series(1, 2500) AS i;"
                          "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at,"
                          " last_error) VALUES ('bulk', '{}', 'dead', 1, now(), 'other')");
    r = console_post(f->port, "/api/v1/dead/retry", "{\"queue\":\"bulk\",\"error\":\"BOOM\"}");
    console_expect(&r, 200, "{\"retried\":2500}");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue ="
                                               " 'bulk' AND state = 'ready'"),
                     2500);
    r = console_post(f->port, "/api/v1/dead/delete", "{\"queue\":\"bulk\"}");
    console_expect(&r, 200, "{\"deleted\":1}");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue ="
                                               " 'bulk' AND state = 'dead'"),
                     0);
}

static void
test_pause_resume_and_replay(void **state)
{
    struct fixture *f = *state;
    char body[256];
    struct http_reply r;

    start_with_token(f, true);
    r = console_post(f->port, "/api/v1/pause",
                     "{\"queue\":\"orders\",\"ordering_key\":\"k1\","
                     "\"reason\":\"investigating\"}");
    console_expect(&r, 200, "{\"changed\":true}");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/paused");
    console_expect(&r, 200, "\"ordering_key\":\"k1\",\"reason\":\"investigating\"");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues");
    console_expect(&r, 200, "\"paused\":false,\"paused_keys\":1");
    http_reply_free(&r);
    r = console_post(f->port, "/api/v1/resume", "{\"queue\":\"orders\",\"ordering_key\":\"k1\"}");
    console_expect(&r, 200, "\"changed\":true");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 0);

    r = console_post(f->port, "/api/v1/replay",
                     "{\"queue\":\"orders\",\"since\":\"-infinity\","
                     "\"dry_run\":true}");
    console_expect(&r, 200, "{\"dry_run\":true,\"replayed\":5,");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     5);
    snprintf(body, sizeof(body), "{\"queue\":\"orders\",\"job_ids\":[%lld,999999],"
                                 "\"dry_run\":false}",
             harness_query_ll(f->conn, "SELECT min(job_id) FROM outbox.job"
                                       " WHERE state = 'succeeded'"));
    r = console_post(f->port, "/api/v1/replay", body);
    console_expect(&r, 200, "\"replayed\":1,");
    assert_non_null(strstr(r.body, "\"missing\":1"));
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     4);
}

/*
 * The endpoints that show no counts do not wait for the queue statistics:
 * with the stream cursors locked (which only the counts read) they answer.
 */
static void
test_endpoints_without_counts(void **state)
{
    struct fixture *f = *state;
    static const char *const paths[] = {"/api/v1/relays", "/api/v1/blocked", "/api/v1/paused",
                                        "/keys"};
    PGconn *locker = f->other = harness_connect(f->url);
    struct http_reply r;

    start_with_token(f, false);
    harness_exec(locker, "BEGIN; LOCK TABLE outbox.stream_cursor IN ACCESS EXCLUSIVE MODE");
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        r = http_request(f->port, "GET", paths[i], CONSOLE_BEARER, NULL, 3);
        if (r.status != 200)
            fail_msg("%s did not answer beside a lock the counts wait for: %d", paths[i],
                     r.status);
        http_reply_free(&r);
    }
    r = console_get(f->port, "/api/v1/relays");
    console_expect(&r, 200, "\"worker_id\":\"relay-a\",\"rows\":1,");
    http_reply_free(&r);
    r = console_get(f->port, "/keys");
    console_expect(&r, 200, "&lt;script&gt;alert(2)");
    http_reply_free(&r);
    harness_exec(locker, "COMMIT");
}

/* GET identity answers what outboxctl identity show --json prints, byte for byte. */
static void
test_identity(void **state)
{
    struct fixture *f = *state;
    static const char *const argv[] = {"identity", "show", "--json", NULL};
    char printed[512];
    struct http_reply r;

    setenv("OUTBOX_DATABASE_URL", f->url, 1);
    assert_int_equal(fixture_run_outboxctl(argv, printed, sizeof(printed)), 0);
    unsetenv("OUTBOX_DATABASE_URL");
    start_with_token(f, false);
    r = console_get(f->port, "/api/v1/identity");
    console_expect(&r, 200, "{\"database_id\":\"");
    assert_non_null(strstr(r.head, "Content-Type: application/json"));
    assert_string_equal(r.body, printed);
    http_reply_free(&r);
    /* read-only: a POST to it is no action */
    r = console_post(f->port, "/api/v1/identity", "{}");
    console_expect(&r, 403, "read-only");
    http_reply_free(&r);
}

/* ---- escaping and bad input ---- */

static void
test_escaping(void **state)
{
    struct fixture *f = *state;
    struct http_reply r;

    harness_exec(f->conn, "SELECT outbox.pause('orders', '<script>pause()</script>',"
                          " '<script>reason()</script>')");
    start_with_token(f, true);
    static const char *const pages[] = {"/dead", "/keys", "/"};
    for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++) {
        r = console_get(f->port, pages[i]);
        console_expect(&r, 200, NULL);
        assert_null(strstr(r.body, "<script>"));
        assert_null(strstr(r.body, "<img"));
        assert_null(strstr(r.body, "<b>bold"));
        http_reply_free(&r);
    }
    r = console_get(f->port, "/dead");
    assert_non_null(strstr(r.body, "&lt;img src=x onerror=alert(1)&gt;"));
    assert_non_null(strstr(r.body, "&lt;script&gt;alert(2)&lt;/script&gt;"));
    assert_non_null(strstr(r.body, "&lt;b&gt;bold&lt;/b&gt;"));
    http_reply_free(&r);
    r = console_get(f->port, "/keys");
    assert_non_null(strstr(r.body, "&lt;script&gt;pause()&lt;/script&gt;"));
    assert_non_null(strstr(r.body, "&lt;script&gt;reason()&lt;/script&gt;"));
    http_reply_free(&r);
    /* a filter value echoed into the page is escaped too */
    r = console_get(f->port, "/dead?queue=%22%3E%3Cscript%3Ex()%3C/script%3E");
    console_expect(&r, 200, "&quot;&gt;&lt;script&gt;x()");
    assert_null(strstr(r.body, "<script>"));
    http_reply_free(&r);
    /* JSON escapes < and > so a misread answer cannot become markup */
    r = console_get(f->port, "/api/v1/blocked");
    console_expect(&r, 200, "\\u003cscript\\u003ealert(2)\\u003c/script\\u003e");
    http_reply_free(&r);
    /* queue names cannot hold markup at all: the schema refuses them */
    r = console_post(f->port, "/api/v1/pause", "{\"queue\":\"<script>\"}");
    console_expect(&r, 400, "invalid outbox queue name");
    http_reply_free(&r);
}

/* Asserts a 400 whose body is one line of JSON naming reason. */
static void
expect_bad(struct http_reply r, const char *reason)
{
    console_expect(&r, 400, reason);
    assert_non_null(strchr(r.body, '\n'));
    assert_int_equal(strchr(r.body, '\n')[1], '\0');
    http_reply_free(&r);
}

static void
test_bad_input(void **state)
{
    struct fixture *f = *state;

    start_with_token(f, true);
    expect_bad(console_get(f->port, "/api/v1/dead?limit=abc"), "limit must be");
    expect_bad(console_get(f->port, "/api/v1/dead?limit=0"), "limit must be");
    expect_bad(console_get(f->port, "/api/v1/dead?job_id=x"), "job_id must be");
    expect_bad(console_post(f->port, "/api/v1/pause", "{\"queue\":"), "json");
    expect_bad(console_post(f->port, "/api/v1/pause", "[1]"), "json object");
    expect_bad(console_post(f->port, "/api/v1/pause", "{\"queue\":\"orders\"} x"), "trailing");
    expect_bad(console_post(f->port, "/api/v1/pause", "{\"queue\":1}"), "string");
    expect_bad(console_post(f->port, "/api/v1/pause", "{\"bogus\":\"x\"}"),
               "unknown field 'bogus'");
    expect_bad(console_post(f->port, "/api/v1/pause", "{}"), "queue is required");
    expect_bad(console_post(f->port, "/api/v1/dead/retry", "{}"), "give job_ids");
    expect_bad(console_post(f->port, "/api/v1/dead/retry", "{\"job_ids\":[\"1\"]}"), "job ids");
    expect_bad(console_post(f->port, "/api/v1/dead/retry", "{\"job_ids\":[]}"), "empty");
    expect_bad(console_post(f->port, "/api/v1/dead/retry", "{\"job_ids\":[-4]}"), "positive");
    expect_bad(console_post(f->port, "/api/v1/replay", "{\"queue\":\"orders\"}"), "either since");
    expect_bad(console_post(f->port, "/api/v1/replay", "{\"queue\":\"orders\",\"since\":\"soon\"}"),
               "since is not a time");
    expect_bad(console_post(f->port, "/api/v1/replay",
                            "{\"queue\":\"orders\",\"since\":\"-infinity\","
                            "\"dry_run\":\"yes\"}"),
               "dry_run");
    expect_bad(http(f->port, "POST", "/api/v1/pause", CONSOLE_BEARER "Content-Type: text/plain\r\n",
                    "{\"queue\":\"orders\"}"),
               "application/json");
    expect_bad(http(f->port, "POST", "/api/v1/pause", CONSOLE_BEARER, "{\"queue\":\"orders\"}"),
               "application/json");
    expect_bad(http(f->port, "POST", "/api/v1/pause",
                    CONSOLE_BEARER "Content-Type: application/jsonp\r\n", "{\"queue\":\"orders\"}"),
               "application/json");
    /* last-one-wins would pause billing where the reader saw orders */
    expect_bad(
        console_post(f->port, "/api/v1/pause", "{\"queue\":\"orders\",\"queue\":\"billing\"}"),
        "duplicate field 'queue'");
    expect_bad(console_post(f->port, "/api/v1/dead/retry", "{\"job_ids\":[1],\"job_ids\":[2]}"),
               "duplicate field 'job_ids'");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'dead'"),
                     1);
    /* a media type with parameters, in any case, is still JSON */
    {
        struct http_reply r = http(f->port, "POST", "/api/v1/pause",
                                   CONSOLE_BEARER "Content-Type: "
                                                  "Application/JSON; charset=utf-8\r\n",
                                   "{\"queue\":\"orders\"}");

        console_expect(&r, 200, "\"changed\":true");
        http_reply_free(&r);
    }
}

/* Without a token file: loopback only, no login, but still a CSRF token for every POST. */
static void
test_loopback_without_token(void **state)
{
    struct fixture *f = *state;
    const char *options[] = {"--allow-actions", NULL};
    char headers[256], csrf[80] = "";
    struct http_reply r;
    const char *at;

    start_console(f, options);
    r = http(f->port, "GET", "/api/v1/queues", NULL, NULL);
    console_expect(&r, 200, "\"queue\":\"orders\"");
    http_reply_free(&r);
    r = http(f->port, "POST", "/api/v1/pause", "Content-Type: application/json\r\n",
             "{\"queue\":\"orders\"}");
    console_expect(&r, 403, "csrf");
    http_reply_free(&r);
    /* a bearer header means nothing without a token file: still no CSRF token, still 403 */
    r = http(f->port, "POST", "/api/v1/pause", CONSOLE_BEARER "Content-Type: application/json\r\n",
             "{\"queue\":\"orders\"}");
    console_expect(&r, 403, "csrf");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 0);
    r = http(f->port, "GET", "/api/v1/session", NULL, NULL);
    console_expect(&r, 200, "\"identity\":\"anonymous\"");
    at = strstr(r.body, "\"csrf_token\":\"");
    assert_non_null(at);
    sscanf(at + strlen("\"csrf_token\":\""), "%64[0-9a-f]", csrf);
    http_reply_free(&r);
    snprintf(headers, sizeof(headers),
             "Content-Type: application/json\r\nX-CSRF-Token: %s\r\n", csrf);
    r = http(f->port, "POST", "/api/v1/pause", headers, "{\"queue\":\"orders\"}");
    console_expect(&r, 200, "\"changed\":true");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.paused"), 1);
}

/* ---- stream queues ---- */

/* Asserts that body holds the text printf makes of format. */
static void
expect_part(const char *body, const char *format, ...)
{
    char part[512];
    va_list args;

    va_start(args, format);
    vsnprintf(part, sizeof(part), format, args);
    va_end(args);
    if (strstr(body, part) == NULL)
        fail_msg("expected '%s' in: %s", part, body);
}

static void
test_streams(void **state)
{
    struct fixture *f = *state;
    long long lag[2];
    PGconn *holder;
    struct http_reply r;

    harness_exec(f->conn, "SELECT outbox.stream_enable('events', 2);"
                          "SELECT outbox.enqueue('events', jsonb_build_object('n', i))"
                          "  FROM generate_series(1, 7) AS i");
    lag[0] = harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                       " WHERE queue = 'events' AND stream_partition = 0");
    lag[1] = harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                       " WHERE queue = 'events' AND stream_partition = 1");
    assert_true(lag[0] > 0 && lag[1] > 0);
    assert_int_equal(lag[0] + lag[1], 7);
    start_with_token(f, false);

    /* each partition with the rows inserted in it, no owner; nobody holds the horizon */
    r = console_get(f->port, "/api/v1/streams");
    console_expect(&r, 200, "{\"partitions\":[");
    for (int p = 0; p < 2; p++)
        expect_part(r.body, "{\"queue\":\"events\",\"partition\":%d,\"lag_rows\":%lld,", p,
                    lag[p]);
    assert_null(strstr(r.body, "\"owner\":\""));
    assert_null(strstr(r.body, "\"lease_until\":\""));
    expect_part(r.body, "\"horizon\":null}");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues");
    console_expect(&r, 200, "{\"queue\":\"events\",\"ready\":0,\"running\":0,\"succeeded\":0,\"dead\":0,");
    expect_part(r.body, "\"stream\":true,\"stream_published\":0,\"stream_waiting\":7}");
    expect_part(r.body, "\"stream\":false,\"stream_published\":0,\"stream_waiting\":0}");
    http_reply_free(&r);

    /* partition 0 published and owned: its rows count as published, its owner shows */
    harness_exec(f->conn, "UPDATE outbox.stream_cursor AS c"
                          "   SET owner = 'relay-<s>', generation = 1,"
                          "       lease_until = now() + interval '1 hour',"
                          "       (cursor_xid, cursor_job_id) = (SELECT j.xid, j.job_id"
                          "         FROM outbox.job AS j WHERE j.queue = c.queue"
                          "          AND j.stream_partition = c.partition"
                          "        ORDER BY j.xid DESC, j.job_id DESC LIMIT 1)"
                          " WHERE c.queue = 'events' AND c.partition = 0");
    r = console_get(f->port, "/api/v1/streams");
    console_expect(&r, 200, "\"partition\":0,\"lag_rows\":0,\"lag_seconds\":0.000,"
                    "\"owner\":\"relay-\\u003cs\\u003e\",\"lease_until\":\"20");
    expect_part(r.body, "\"partition\":1,\"lag_rows\":%lld,", lag[1]);
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues");
    expect_part(r.body, "\"stream\":true,\"stream_published\":%lld,\"stream_waiting\":%lld}",
                lag[0], lag[1]);
    http_reply_free(&r);

    /* a transaction with an xid held open on another session holds the horizon */
    holder = f->other = harness_connect(f->url);
    harness_exec(holder, "BEGIN; SELECT pg_current_xact_id(), '<b>held</b>'");
    r = console_get(f->port, "/api/v1/streams");
    expect_part(r.body, "\"horizon\":{\"pid\":%d,\"age_seconds\":", PQbackendPID(holder));
    expect_part(r.body, "\"query\":\"BEGIN; SELECT pg_current_xact_id(), '\\u003cb\\u003eheld");
    http_reply_free(&r);

    /* the overview page: the queue marked, the partitions, the holder, all escaped */
    r = console_get(f->port, "/");
    console_expect(&r, 200, "<tr data-queue=\"events\" data-stream>");
    expect_part(r.body, "<table id=\"streams\">");
    for (int p = 0; p < 2; p++)
        expect_part(r.body, "<tr data-queue=\"events\" data-partition=\"%d\">", p);
    expect_part(r.body, "<td class=\"owner\">relay-&lt;s&gt;</td>");
    expect_part(r.body, "<td class=\"owner\">none</td>");
    expect_part(r.body, "pid <span class=\"pid\">%d</span>", PQbackendPID(holder));
    expect_part(r.body, "&lt;b&gt;held&lt;/b&gt;");
    assert_null(strstr(r.body, "<b>held"));
    http_reply_free(&r);
    harness_exec(holder, "ROLLBACK");
}

/* ---- listening and the database ---- */

/* Runs outboxctl serve with args (NULL-terminated) to its end; its exit status, its output. */
static int
run_serve_output(const char *const *args, char *output, size_t size)
{
    const char *argv[FIXTURE_MAX_ARGS + 1] = {"serve"};
    int n = 1;

    for (int i = 0; args[i] != NULL && n < FIXTURE_MAX_ARGS; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return fixture_run_program("outboxctl", argv, output, size, 10000);
}

static int
run_serve(const char *const *args)
{
    char output[4096];

    return run_serve_output(args, output, sizeof(output));
}

/* Writes text into path with mode. */
static void
write_file(const char *path, const char *text, mode_t mode)
{
    FILE *file = fopen(path, "w");

    assert_non_null(file);
    fputs(text, file);
    fclose(file);
    assert_int_equal(chmod(path, mode), 0);
}

/* A token file others may open, or without a token, is refused: exit 2, one line saying why. */
static void
test_token_file_rules(void **state)
{
    struct fixture *f = *state;
    static const struct {
        const char *text;
        mode_t mode;
        const char *why;
    } cases[] = {
        {CONSOLE_TOKEN "\n", 0644, "group or others"},
        {CONSOLE_TOKEN "\n", 0640, "group or others"},
        {CONSOLE_TOKEN "\n", 0604, "group or others"},
        {"                x\n", 0600, "printable characters without spaces"},
        {"\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", 0600, "printable characters without spaces"},
        {"console test token 0123456789\n", 0600, "printable characters without spaces"},
        {"\n" CONSOLE_TOKEN "\n", 0600, "16 to 4096"},
    };
    const char *args[] = {"--auth-token-file", f->token_file, "--listen", "127.0.0.1:0",
                          "--database-url", f->url, NULL};
    char output[4096];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_file(f->token_file, cases[i].text, cases[i].mode);
        if (run_serve_output(args, output, sizeof(output)) != 2 ||
            strstr(output, cases[i].why) == NULL)
            fail_msg("token file %zu (mode %o): expected exit 2 naming '%s', got: %s", i,
                     (unsigned)cases[i].mode, cases[i].why, output);
    }
    /* trailing blanks and the line end are not part of the token */
    write_file(f->token_file, CONSOLE_TOKEN " \t\r\n", 0400);
    start_with_token(f, false);
    {
        struct http_reply r = console_get(f->port, "/api/v1/queues");

        console_expect(&r, 200, "\"queue\":\"orders\"");
        http_reply_free(&r);
    }
}

static void
test_listen_rules(void **state)
{
    struct fixture *f = *state;
    const char *wide[] = {"--listen", "0.0.0.0:0", "--database-url", f->url, NULL};
    const char *all[] = {"--listen", ":0", "--database-url", f->url, NULL};
    const char *bad[] = {"--listen", "nowhere", "--database-url", f->url, NULL};
    const char *unknown[] = {"--frobnicate", "--database-url", f->url, NULL};
    const char *short_token[] = {"--auth-token-file", "/dev/null", "--database-url", f->url,
                                 NULL};

    assert_int_equal(run_serve(wide), 2);
    assert_int_equal(run_serve(all), 2);
    assert_int_equal(run_serve(bad), 2);
    assert_int_equal(run_serve(unknown), 2);
    assert_int_equal(run_serve(short_token), 2);
}

static void
test_database_down(void **state)
{
    struct fixture *f = *state;
    char url[128];
    struct http_reply r;

    snprintf(url, sizeof(url), "postgresql://postgres@127.0.0.1:%d/postgres",
             harness_closed_port());
    f->serve_url = url;
    start_with_token(f, true);
    r = console_get(f->port, "/");
    console_expect(&r, 503, "id=\"database-banner\"");
    http_reply_free(&r);
    r = console_get(f->port, "/dead");
    console_expect(&r, 503, "Database unavailable");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues");
    console_expect(&r, 503, "unable to connect to the database");
    http_reply_free(&r);
    /* still serving */
    r = console_get(f->port, "/replay");
    console_expect(&r, 200, "replay-form");
    http_reply_free(&r);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_token_required, setup, teardown),
        cmocka_unit_test_setup_teardown(test_login_cookie_and_csrf, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_endpoints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_retry_and_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_resume_and_replay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoints_without_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_escaping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loopback_without_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listen_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token_file_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_database_down, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
