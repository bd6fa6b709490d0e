/*
 * test_metrics_http.c - the relay's /metrics and /healthz, read over a
 * loopback socket from a real relay publishing to a real Redis.
 *
 * What an operator's scraper and health probe see: the text parses as
 * Prometheus exposition format (every sample under a HELP and a TYPE line,
 * valid names, numeric values), the counters match what happened to the
 * rows (published, completed, failed, dead, claims, per queue), and
 * /healthz turns 503 while the broker is down and 200 again once it is back.
 * Every wait is bounded.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "http_client.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define MAX_BACKENDS 16

struct fixture {
    char *url;
    PGconn *conn;
    redisContext *redis;
    const char *broker;
    char prefix[64];
    char metrics_addr[32];
    int port;
    char role[64];               /* a login role of the relay's own, "" when none */
    int stopped[MAX_BACKENDS];   /* backends stopped with SIGSTOP, let go in teardown */
    int stopped_count;
};

static int test_counter;

/* Waits up to timeout_ms for path to answer with status; the last status seen. */
static int
wait_for_status(int port, const char *path, int status, int timeout_ms)
{
    int last = 0;

    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        struct http_reply r = http_get(port, path);

        last = r.status;
        http_reply_free(&r);
        if (last == status)
            break;
        usleep(100 * 1000);
    }
    return last;
}

static bool
is_name_char(char c, bool first)
{
    return isalpha((unsigned char)c) || c == '_' || c == ':' || (!first && isdigit((unsigned char)c));
}

/* Length of a metric name at text, 0 when it does not start with one. */
static size_t
name_length(const char *text)
{
    size_t n = 0;

    while (text[n] != '\0' && is_name_char(text[n], n == 0))
        n++;
    return n;
}

/* True when family (a HELP/TYPE name) owns sample name, e.g. x_bucket of histogram x. */
static bool
family_owns(const char *family, const char *type, const char *name, size_t name_len)
{
    size_t f = strlen(family);

    if (name_len == f && strncmp(name, family, f) == 0)
        return true;
    if (strcmp(type, "histogram") != 0 || name_len <= f || strncmp(name, family, f) != 0)
        return false;
    name += f;
    name_len -= f;
    return (name_len == 7 && strncmp(name, "_bucket", 7) == 0) ||
           (name_len == 4 && strncmp(name, "_sum", 4) == 0) ||
           (name_len == 6 && strncmp(name, "_count", 6) == 0);
}

/*
 * Checks that text is Prometheus text format 0.0.4 as a scraper reads it:
 * each family has "# HELP" then "# TYPE" with a known type, each sample
 * belongs to the family announced last, label values are quoted, and the
 * value is a number. Returns the number of samples.
 */
static int
assert_prometheus_text(const char *text)
{
    char family[128] = "", type[32] = "";
    bool help_seen = false;
    int samples = 0, line_number = 0;
    const char *line = text;

    assert_true(strlen(text) > 0);
    assert_int_equal(text[strlen(text) - 1], '\n');
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        char copy[1024];
        size_t len = (size_t)(end - line);

        line_number++;
        assert_non_null(end);
        assert_true(len < sizeof(copy));
        memcpy(copy, line, len);
        copy[len] = '\0';
        line = end + 1;

        if (strncmp(copy, "# HELP ", 7) == 0) {
            size_t n = name_length(copy + 7);

            if (n == 0 || n >= sizeof(family) || copy[7 + n] != ' ')
                fail_msg("line %d: bad HELP line '%s'", line_number, copy);
            memcpy(family, copy + 7, n);
            family[n] = '\0';
            help_seen = true;
            type[0] = '\0';
        } else if (strncmp(copy, "# TYPE ", 7) == 0) {
            size_t n = name_length(copy + 7);

            if (!help_seen || strncmp(copy + 7, family, n) != 0 || family[n] != '\0')
                fail_msg("line %d: TYPE without its HELP: '%s'", line_number, copy);
            snprintf(type, sizeof(type), "%s", copy + 7 + n + 1);
            if (strcmp(type, "counter") != 0 && strcmp(type, "gauge") != 0 &&
                strcmp(type, "histogram") != 0)
                fail_msg("line %d: unknown type '%s'", line_number, type);
        } else if (copy[0] == '#' || copy[0] == '\0') {
            fail_msg("line %d: unexpected line '%s'", line_number, copy);
        } else {
            size_t n = name_length(copy);
            const char *rest = copy + n;
            char *number_end;

            if (n == 0 || type[0] == '\0' || !family_owns(family, type, copy, n))
                fail_msg("line %d: sample '%s' outside its family '%s'", line_number, copy,
                         family);
            if (strcmp(type, "counter") == 0 && (n < 6 || strncmp(copy + n - 6, "_total", 6) != 0))
                fail_msg("line %d: counter '%s' does not end in _total", line_number, copy);
            if (*rest == '{') {
                const char *close = strstr(rest, "\"}");

                if (close == NULL || strstr(rest, "=\"") == NULL)
                    fail_msg("line %d: bad labels in '%s'", line_number, copy);
                rest = close + 2;
            }
            if (*rest != ' ')
                fail_msg("line %d: no value in '%s'", line_number, copy);
            rest++;
            if (strcmp(rest, "+Inf") != 0 && strcmp(rest, "-Inf") != 0 &&
                strcmp(rest, "NaN") != 0) {
                strtod(rest, &number_end);
                if (number_end == rest || *number_end != '\0')
                    fail_msg("line %d: value is not a number in '%s'", line_number, copy);
            }
            samples++;
        }
    }
    return samples;
}

/*
 * The value of the sample named name whose labels include every
 * key="value" pair of labels (a comma-separated list, NULL for none);
 * -1 when there is no such sample.
 */
static double
metric_value(const char *text, const char *name, const char *labels)
{
    size_t name_len = strlen(name);

    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char copy[1024];

        if (len >= sizeof(copy)) {
            line += len + (end ? 1 : 0);
            continue;
        }
        memcpy(copy, line, len);
        copy[len] = '\0';
        line += len + (end ? 1 : 0);
        if (strncmp(copy, name, name_len) != 0 || (copy[name_len] != '{' && copy[name_len] != ' '))
            continue;
        if (labels != NULL) {
            char wanted[256];
            bool all = true;

            snprintf(wanted, sizeof(wanted), "%s", labels);
            for (char *save = NULL, *pair = strtok_r(wanted, ",", &save); pair != NULL;
                 pair = strtok_r(NULL, ",", &save)) {
                const char *brace = strchr(copy, '}');
                const char *found = strstr(copy, pair);

                if (found == NULL || brace == NULL || found > brace)
                    all = false;
            }
            if (!all)
                continue;
        }
        return strtod(strrchr(copy, ' ') + 1, NULL);
    }
    return -1;
}

/* Fetches /metrics, checks its format and returns the body (caller frees). */
static char *
scrape(const struct fixture *f)
{
    struct http_reply r = http_get(f->port, "/metrics");

    assert_int_equal(r.status, 200);
    assert_non_null(r.body);
    assert_true(assert_prometheus_text(r.body) > 0);
    free(r.head);
    return r.body;
}

/*
 * Waits up to timeout_ms for a sample to reach expected (the relay updates
 * its counters just after the database write the test waits for), and
 * returns the last value seen.
 */
static double
wait_for_metric(const struct fixture *f, const char *name, const char *labels, double expected,
                int timeout_ms)
{
    double value = -1;

    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        char *text = scrape(f);

        value = metric_value(text, name, labels);
        free(text);
        if (value == expected)
            break;
        usleep(100 * 1000);
    }
    return value;
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->broker = harness_env("OUTBOX_TEST_REDIS_URL");
    f->redis = stream_consumer_connect(f->broker);
    assert_non_null(f->redis);
    snprintf(f->prefix, sizeof(f->prefix), "metrics-test-%d-%d:", (int)getpid(), test_counter++);
    f->port = harness_free_port();
    snprintf(f->metrics_addr, sizeof(f->metrics_addr), "127.0.0.1:%d", f->port);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    for (int i = 0; i < f->stopped_count; i++)
        kill(f->stopped[i], SIGCONT);
    if (f->role[0] != '\0') {
        char sql[160];

        snprintf(sql, sizeof(sql), "ALTER ROLE %s CONNECTION LIMIT -1", f->role);
        harness_exec(f->conn, sql);
    }
    if (f->redis != NULL) {
        stream_consumer_delete_prefix(f->redis, f->prefix);
        redisFree(f->redis);
    }
    if (f->role[0] != '\0') {
        char sql[160];

        /* the relay's sessions end with it, a moment after it exits */
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM pg_stat_activity WHERE usename = '%s'",
                 f->role);
        wait_for_value(f->conn, sql, 0, 10000);
        fixture_drop_role(f->conn, f->role);
    }
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* Makes stream prefix+queue a plain string, so XADD to it fails with WRONGTYPE. */
static void
break_stream(struct fixture *f, const char *queue)
{
    char key[128];
    const char *argv[] = {"SET", key, "not a stream"};
    redisReply *reply;

    snprintf(key, sizeof(key), "%s%s", f->prefix, queue);
    reply = stream_consumer_command(f->redis, 3, argv);
    assert_non_null(reply);
    assert_int_not_equal(reply->type, REDIS_REPLY_ERROR);
    freeReplyObject(reply);
}

static void
test_counters_match_what_happened(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr,
                           "--retry-base", "1h", "--retry-max", "1h", "--concurrency", "1", NULL};
    struct relay_process relay;
    char *text;

    enqueue_rows(f->conn, "orders", 7);
    enqueue_rows(f->conn, "billing", 3);
    /* two rows that can only fail, with one attempt each: both become dead */
    harness_exec(f->conn, "SELECT outbox.enqueue('broken', '{\"n\": 1}', max_attempts => 1),"
                          "       outbox.enqueue('broken', '{\"n\": 2}', max_attempts => 1)");
    /* one that fails once and waits an hour for its retry */
    harness_exec(f->conn, "SELECT outbox.enqueue('flaky', '{\"n\": 1}', max_attempts => 5)");
    break_stream(f, "broken");
    break_stream(f, "flaky");

    relay_start_process(&relay, f->url, f->broker, extra);
    if (wait_for_value(f->conn,
                       "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'"
                       "    OR state = 'dead' OR (state = 'ready' AND attempts = 1)",
                       13, 30000) != 13)
        relay_dump_log(&relay);
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'"
                                    "    OR state = 'dead'"
                                    "    OR (state = 'ready' AND attempts = 1)",
                                    13, 1000),
                     13);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'broken' AND state = 'dead'"
                                               "   AND last_error LIKE '%WRONGTYPE%'"),
                     2);

    /* counters move just after the rows do */
    assert_true(wait_for_metric(f, "outbox_rows_completed_total", "queue=\"billing\"", 3, 10000) ==
                3);
    assert_true(wait_for_metric(f, "outbox_rows_dead_total", "queue=\"broken\"", 2, 10000) == 2);
    assert_true(wait_for_metric(f, "outbox_rows_failed_total", "queue=\"flaky\"", 1, 10000) == 1);
    assert_true(wait_for_metric(f, "outbox_rows_completed_total", "queue=\"orders\"", 7, 10000) ==
                7);

    text = scrape(f);
    /* every family is there, with the constant broker label */
    assert_true(metric_value(text, "outbox_rows_published_total",
                             "broker=\"redis\",queue=\"orders\"") == 7);
    assert_true(metric_value(text, "outbox_rows_published_total", "queue=\"billing\"") == 3);
    assert_true(metric_value(text, "outbox_rows_claimed_total", "queue=\"orders\"") == 7);
    assert_true(metric_value(text, "outbox_rows_claimed_total", "queue=\"broken\"") == 2);
    assert_true(metric_value(text, "outbox_rows_claimed_total", "queue=\"flaky\"") == 1);
    /* a failed row is never counted as published or completed */
    assert_true(metric_value(text, "outbox_rows_published_total", "queue=\"broken\"") == 0);
    assert_true(metric_value(text, "outbox_rows_completed_total", "queue=\"broken\"") == 0);
    assert_true(metric_value(text, "outbox_rows_completed_total", "queue=\"flaky\"") == 0);
    /* a dead row's last attempt is counted as dead, not also as failed */
    assert_true(metric_value(text, "outbox_rows_failed_total", "queue=\"broken\"") == 0);
    assert_true(metric_value(text, "outbox_rows_dead_total", "queue=\"flaky\"") == 0);
    assert_true(metric_value(text, "outbox_rows_dead_total", "queue=\"orders\"") == 0);
    assert_true(metric_value(text, "outbox_claims_total", NULL) >= 1);
    assert_true(metric_value(text, "outbox_lease_lost_total", NULL) == 0);
    assert_true(metric_value(text, "outbox_rows_in_flight", NULL) == 0);
    assert_true(metric_value(text, "outbox_up", "target=\"database\"") == 1);
    assert_true(metric_value(text, "outbox_up", "target=\"broker\"") == 1);
    assert_true(metric_value(text, "outbox_reconnects_total", "target=\"broker\"") == 0);
    assert_true(metric_value(text, "outbox_publish_duration_seconds_count", NULL) >= 1);
    /* commit-to-publish is observed once per published row */
    assert_true(metric_value(text, "outbox_commit_to_publish_seconds_count", NULL) == 10);
    assert_true(metric_value(text, "outbox_commit_to_publish_seconds_bucket", "le=\"+Inf\"") ==
                10);
    assert_non_null(strstr(text, "# TYPE outbox_oldest_ready_age_seconds gauge\n"));
    assert_non_null(strstr(text, "# TYPE outbox_ready_rows gauge\n"));
    free(text);

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
}

/*
 * --metrics-max-queues: 8 queues and a cap of 3 give 3 queues their own
 * series and sum the other 5 under queue="(other)": every row is still
 * counted once, and the folded gauge says 5.
 */
static void
test_queue_series_are_capped(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr,
                           "--metrics-max-queues", "3", NULL};
    struct relay_process relay;
    double total = 0;
    size_t series = 0;
    char *text;

    for (int i = 0; i < 8; i++) {
        char queue[24];

        snprintf(queue, sizeof(queue), "tenant-%d", i);
        enqueue_rows(f->conn, queue, 2);
    }
    relay_start_process(&relay, f->url, f->broker, extra);
    if (wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 16,
                       30000) != 16)
        relay_dump_log(&relay);
    assert_true(wait_for_metric(f, "outbox_metrics_queues_folded", NULL, 5, 10000) == 5);
    for (int waited = 0; waited <= 10000 && total != 16; waited += 100) {
        text = scrape(f);
        total = 0;
        series = 0;
        for (const char *at = text; (at = strstr(at, "\noutbox_rows_completed_total{")) != NULL;
             at++) {
            char line[512];

            snprintf(line, sizeof(line), "%.*s", (int)strcspn(at + 1, "\n"), at + 1);
            total += strtod(strrchr(line, ' ') + 1, NULL);
            series++;
        }
        free(text);
        if (total != 16)
            usleep(100 * 1000);
    }
    assert_true(total == 16);
    assert_int_equal(series, 4);
    text = scrape(f);
    assert_true(metric_value(text, "outbox_rows_completed_total", "queue=\"(other)\"") == 10);
    free(text);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
}

/*
 * The table gauges: a succeeded row past --retention that the cleanup
 * cannot take (another session holds its row lock) shows as waiting for
 * cleanup, with how long it is past the retention; rows within the
 * retention count as succeeded only.
 */
static void
test_table_gauges(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr,
                           "--retention", "1h", NULL};
    struct relay_process relay;
    PGconn *holder = harness_connect(f->url);
    double overdue;
    char *text;

    harness_exec(f->conn, "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " SELECT 'orders', '{}', 'succeeded', now() - interval '10 minutes'"
                          " FROM generate_series(1, 5);"
                          "INSERT INTO outbox.job (queue, payload, state, finished_at)"
                          " VALUES ('orders', '{}', 'succeeded', now() - interval '2 hours')");
    harness_exec(holder, "BEGIN");
    harness_exec(holder, "SELECT * FROM outbox.job WHERE finished_at < now() - interval '1 hour'"
                         " FOR UPDATE");

    relay_start_process(&relay, f->url, f->broker, extra);
    if (wait_for_status(f->port, "/healthz", 200, 10000) != 200 ||
        wait_for_metric(f, "outbox_succeeded_rows", NULL, 6, 15000) != 6)
        relay_dump_log(&relay);
    text = scrape(f);
    assert_true(metric_value(text, "outbox_succeeded_rows", NULL) == 6);
    assert_true(metric_value(text, "outbox_succeeded_past_retention_rows", NULL) == 1);
    overdue = metric_value(text, "outbox_oldest_succeeded_past_retention_seconds", NULL);
    assert_true(overdue > 3500 && overdue < 3700);
    assert_true(metric_value(text, "outbox_table_bytes", NULL) > 0);
    assert_true(metric_value(text, "outbox_index_bytes", NULL) > 0);
    assert_true(metric_value(text, "outbox_dead_tuples", NULL) >= 0);
    assert_true(metric_value(text, "outbox_rows_deleted_total", NULL) == 0);
    free(text);

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
    harness_exec(holder, "ROLLBACK");
    PQfinish(holder);
}

static void
test_other_paths(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr, NULL};
    struct relay_process relay;
    struct http_reply r;

    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_status(f->port, "/healthz", 200, 10000), 200);
    r = http_get(f->port, "/healthz");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "ok"));
    http_reply_free(&r);
    r = http_get(f->port, "/readyz");
    assert_int_equal(r.status, 200);
    http_reply_free(&r);
    r = http_get(f->port, "/nothing-here");
    assert_int_equal(r.status, 404);
    http_reply_free(&r);

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
    /* after a clean stop nothing listens there any more */
    r = http_get(f->port, "/healthz");
    assert_int_equal(r.status, 0);
    http_reply_free(&r);
}

/*
 * --healthcheck, the image's health check: 0 and "200 ok" from a healthy
 * relay, also through OUTBOX_METRICS_ADDR naming every interface (asked on
 * loopback); 1 and one line once nothing listens; 2 with --metrics-addr off.
 */
static void
test_healthcheck_flag(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr, NULL};
    const char *ask[] = {"--healthcheck", "--metrics-addr", f->metrics_addr, NULL};
    const char *ask_environment[] = {"--healthcheck", NULL};
    const char *ask_off[] = {"--healthcheck", "--metrics-addr", "off", NULL};
    struct relay_process relay;
    char output[1024], wildcard[32];

    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_status(f->port, "/healthz", 200, 10000), 200);
    assert_int_equal(relay_run_capture(ask, output, sizeof(output)), 0);
    assert_string_equal(output, "200 ok\n");
    snprintf(wildcard, sizeof(wildcard), "0.0.0.0:%d", f->port);
    setenv("OUTBOX_METRICS_ADDR", wildcard, 1);
    assert_int_equal(relay_run_capture(ask_environment, output, sizeof(output)), 0);
    unsetenv("OUTBOX_METRICS_ADDR");
    assert_string_equal(output, "200 ok\n");

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
    assert_int_equal(relay_run_capture(ask, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "--healthcheck: unable to connect to 127.0.0.1"));
    assert_ptr_equal(strchr(output, '\n'), output + strlen(output) - 1); /* one line */
    assert_int_equal(relay_run_capture(ask_off, output, sizeof(output)), 2);
    assert_non_null(strstr(output, "--metrics-addr is off"));
}

static void
test_health_follows_the_broker(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr, NULL};
    const char *ask[] = {"--healthcheck", "--metrics-addr", f->metrics_addr, NULL};
    struct relay_process relay;
    struct http_reply r;
    char output[1024];
    char *text;
    int status;

    relay_start_process(&relay, f->url, f->broker, extra);
    status = wait_for_status(f->port, "/healthz", 200, 10000);
    if (status != 200)
        relay_dump_log(&relay);
    assert_int_equal(status, 200);

    /* the fixture's own connection would only see errors while Redis is down */
    redisFree(f->redis);
    f->redis = NULL;
    assert_int_equal(harness_stack("stop-service", "redis"), 0);
    status = wait_for_status(f->port, "/healthz", 503, 30000);
    if (status != 503)
        relay_dump_log(&relay);
    assert_int_equal(status, 503);
    r = http_get(f->port, "/healthz");
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "broker"));
    http_reply_free(&r);
    /* the image's health check says so too, in one line */
    assert_int_equal(relay_run_capture(ask, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "--healthcheck: /healthz answered 503 broker"));
    text = scrape(f);
    assert_true(metric_value(text, "outbox_up", "target=\"broker\"") == 0);
    assert_true(metric_value(text, "outbox_up", "target=\"database\"") == 1);
    free(text);
    assert_int_equal(kill(relay.pid, 0), 0); /* waiting for the broker, not exited */
    /* liveness is a stuck process only: 40 s of outage (past the 30 s stall) never fail /livez */
    for (int i = 0; i < 20; i++) {
        r = http_get(f->port, "/livez");
        if (r.status != 200)
            fail_msg("/livez answered %d during a broker outage: %s", r.status, r.body);
        http_reply_free(&r);
        usleep(2000 * 1000);
    }

    assert_int_equal(harness_stack("start-service", "redis"), 0);
    f->redis = stream_consumer_connect(f->broker);
    assert_non_null(f->redis);
    status = wait_for_status(f->port, "/healthz", 200, 30000);
    if (status != 200)
        relay_dump_log(&relay);
    assert_int_equal(status, 200);
    text = scrape(f);
    assert_true(metric_value(text, "outbox_up", "target=\"broker\"") == 1);
    assert_true(metric_value(text, "outbox_reconnects_total", "target=\"broker\"") >= 1);
    free(text);

    /* and it publishes again */
    enqueue_rows(f->conn, "orders", 5);
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 5,
                                    30000),
                     5);

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
}

/*
 * The stream gauges: while a transaction holds the horizon, each partition
 * shows the rows after its cursor and their age, its owner, and the
 * holder's pid and age; once it ends the rows are published and the lag
 * drops to 0.
 */
static void
test_stream_gauges(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr, NULL};
    struct relay_process relay;
    PGconn *holder = harness_connect(f->url);
    long long holder_pid;
    double lag;
    char *text;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(holder, "BEGIN");
    harness_query_ll(holder, "SELECT pg_current_xact_id()::text::bigint");
    holder_pid = harness_query_ll(holder, "SELECT pg_backend_pid()");
    enqueue_rows(f->conn, "ev", 6);

    relay_start_process(&relay, f->url, f->broker, extra);
    if (wait_for_status(f->port, "/healthz", 200, 10000) != 200 ||
        wait_for_metric(f, "outbox_stream_horizon_pid", NULL, (double)holder_pid, 20000) !=
            (double)holder_pid ||
        wait_for_metric(f, "outbox_stream_partition_owned", "queue=\"ev\",partition=\"0\"", 1,
                        20000) != 1 ||
        wait_for_metric(f, "outbox_stream_partition_owned", "queue=\"ev\",partition=\"1\"", 1,
                        20000) != 1)
        relay_dump_log(&relay);
    text = scrape(f);
    assert_true(metric_value(text, "outbox_stream_horizon_pid", NULL) == (double)holder_pid);
    assert_true(metric_value(text, "outbox_stream_horizon_age_seconds", NULL) > 0);
    assert_true(metric_value(text, "outbox_stream_lag_rows", "queue=\"ev\",partition=\"0\"") +
                    metric_value(text, "outbox_stream_lag_rows", "queue=\"ev\",partition=\"1\"") ==
                6);
    lag = metric_value(text, "outbox_stream_lag_seconds", "queue=\"ev\",partition=\"0\"");
    assert_true(lag > 0 && lag < 600);
    assert_true(metric_value(text, "outbox_stream_partition_owned",
                             "queue=\"ev\",partition=\"0\"") == 1);
    assert_non_null(strstr(text, "/stream\"} 1"));
    free(text);

    harness_exec(holder, "ROLLBACK");
    if (wait_for_metric(f, "outbox_stream_lag_rows", "queue=\"ev\",partition=\"0\"", 0, 20000) !=
            0 ||
        wait_for_metric(f, "outbox_stream_lag_rows", "queue=\"ev\",partition=\"1\"", 0, 20000) !=
            0)
        relay_dump_log(&relay);
    text = scrape(f);
    assert_true(metric_value(text, "outbox_stream_lag_rows", "queue=\"ev\",partition=\"1\"") == 0);
    assert_true(metric_value(text, "outbox_stream_horizon_pid", NULL) != (double)holder_pid);
    free(text);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
    PQfinish(holder);
}

/* ---- health follows round trips -------------------------------------------------- */

/* Makes f->role, a login role with outbox_relay's privileges; the relay's URL as it. */
static char *
relay_role_url(struct fixture *f)
{
    char grants[160];

    snprintf(f->role, sizeof(f->role), "health_test_%d_%d", (int)getpid(), test_counter);
    fixture_create_outbox_roles(f->conn);
    snprintf(grants, sizeof(grants), "GRANT outbox_relay TO %s", f->role);
    fixture_create_login_role(f->conn, f->role, grants);
    return fixture_url_as(f->url, f->role);
}

/* Lets f->role hold at most its sessions open now less spare (new ones are refused); those open. */
static long long
freeze_role_connections(struct fixture *f, long long spare)
{
    char sql[256];
    long long open;

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM pg_stat_activity WHERE usename = '%s'",
             f->role);
    open = harness_query_ll(f->conn, sql);
    snprintf(sql, sizeof(sql), "ALTER ROLE %s CONNECTION LIMIT %lld", f->role, open - spare);
    harness_exec(f->conn, sql);
    return open;
}

/* GETs /healthz; its status, and its body in body (size bytes, "" when none). */
static int
get_healthz(const struct fixture *f, char *body, size_t size)
{
    struct http_reply r = http_get(f->port, "/healthz");
    int status = r.status;

    snprintf(body, size, "%s", r.body != NULL ? r.body : "");
    http_reply_free(&r);
    return status;
}

/* Waits up to timeout_s for /healthz to answer status; the last status, its body in body. */
static int
wait_for_healthz(const struct fixture *f, int status, int timeout_s, char *body, size_t size)
{
    int last = 0;

    for (int i = 0; i < timeout_s * 5; i++) {
        last = get_healthz(f, body, size);
        if (last == status)
            break;
        usleep(200 * 1000);
    }
    return last;
}

/*
 * A server full for one thread of the relay: one of its sessions is ended
 * and the role may not open another, so that thread retries its connect
 * again and again while the others go on moving rows. Health says "ok"
 * throughout (it said "database down" from the first failed attempt until
 * that thread got back in), with the age of the last database round trip.
 */
static void
test_health_ok_while_one_thread_cannot_reconnect(void **state)
{
    struct fixture *f = *state;
    char *url = relay_role_url(f);
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr,
                           "--concurrency", "2", NULL};
    const char *refused[] = {"database unavailable, retrying", "too many connections", NULL};
    struct relay_process relay;
    double started = wall_clock_seconds();
    char sql[256], body[512];
    int status;

    enqueue_rows(f->conn, "orders", 10);
    relay_start_process(&relay, url, f->broker, extra);
    if (wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 10,
                       30000) != 10 ||
        wait_for_healthz(f, 200, 10, body, sizeof(body)) != 200)
        relay_dump_log(&relay);
    /* two pipelines and the maintenance slot; one is ended and may not come back */
    assert_true(freeze_role_connections(f, 1) >= 3);
    snprintf(sql, sizeof(sql),
             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
             " WHERE pid = (SELECT max(pid) FROM pg_stat_activity WHERE usename = '%s')",
             f->role);
    assert_int_equal(harness_query_ll(f->conn, sql), 1);
    for (int i = 0; i < 150 && relay_log_find(&relay, started, false, refused, NULL, 0) < 0; i++)
        usleep(100 * 1000);
    if (relay_log_find(&relay, started, false, refused, NULL, 0) < 0) {
        relay_dump_log(&relay);
        fail_msg("the relay's thread was not refused a new session within 15 s");
    }

    /* rows move, and health says so, while that thread keeps being refused */
    enqueue_rows(f->conn, "orders", 20);
    for (int i = 0; i < 20; i++) {
        status = get_healthz(f, body, sizeof(body));
        if (status != 200) {
            relay_dump_log(&relay);
            fail_msg("one thread cannot reconnect and rows move, /healthz says %d '%s'", status,
                     body);
        }
        usleep(150 * 1000);
    }
    assert_int_equal(strncmp(body, "ok\ndatabase: last round trip ", 29), 0);
    assert_non_null(strstr(body, "\nbroker: last round trip "));
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'",
                                    30, 30000),
                     30);
    assert_true(relay_log_find(&relay, started, true, refused, NULL, 0) > 0);

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);
    free(url);
}

/*
 * Every PostgreSQL session of the relay stopped (SIGSTOP), and no new one
 * allowed: the connections look open but nothing answers. Once no round
 * trip succeeded for the window, /healthz is 503 naming the database, and
 * after SIGCONT it is "ok" again. Only "within N s it changes" is asserted.
 */
static void
test_health_down_while_database_does_not_answer(void **state)
{
    struct fixture *f = *state;
    char *url = relay_role_url(f);
    const char *extra[] = {"--stream-prefix", f->prefix, "--metrics-addr", f->metrics_addr,
                           "--concurrency", "2", NULL};
    struct relay_process relay;
    char sql[256], body[512];
    PGresult *result;
    int status;

    relay_start_process(&relay, url, f->broker, extra);
    if (wait_for_healthz(f, 200, 10, body, sizeof(body)) != 200)
        relay_dump_log(&relay);
    assert_string_equal(strtok(body, "\n"), "ok");
    freeze_role_connections(f, 0);
    snprintf(sql, sizeof(sql), "SELECT pid FROM pg_stat_activity WHERE usename = '%s'", f->role);
    result = PQexec(f->conn, sql);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    assert_true(PQntuples(result) >= 1);
    for (int i = 0; i < PQntuples(result) && i < MAX_BACKENDS; i++) {
        f->stopped[f->stopped_count] = atoi(PQgetvalue(result, i, 0));
        assert_int_equal(kill(f->stopped[f->stopped_count], SIGSTOP), 0);
        f->stopped_count++;
    }
    PQclear(result);

    /* the window is 15 s with the default --poll-interval */
    status = wait_for_healthz(f, 503, 45, body, sizeof(body));
    if (status != 503)
        relay_dump_log(&relay);
    assert_int_equal(status, 503);
    assert_int_equal(strncmp(body, "database", 8), 0);
    assert_non_null(strstr(body, "\ndatabase: last round trip "));

    for (int i = 0; i < f->stopped_count; i++)
        kill(f->stopped[i], SIGCONT);
    f->stopped_count = 0;
    snprintf(sql, sizeof(sql), "ALTER ROLE %s CONNECTION LIMIT -1", f->role);
    harness_exec(f->conn, sql);
    status = wait_for_healthz(f, 200, 45, body, sizeof(body));
    if (status != 200)
        relay_dump_log(&relay);
    assert_int_equal(status, 200);
    enqueue_rows(f->conn, "orders", 5);
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 5,
                                    30000),
                     5);

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 20000), 0);
    unlink(relay.log_path);
    free(url);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_counters_match_what_happened, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_gauges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_healthcheck_flag, setup, teardown),
        cmocka_unit_test_setup_teardown(test_health_follows_the_broker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_series_are_capped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_gauges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_health_ok_while_one_thread_cannot_reconnect, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_health_down_while_database_does_not_answer, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
