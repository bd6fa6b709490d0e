/*
 * test_relay_config.c - what outbox-relay and outboxctl say about a bad
 * configuration, and that they never say a password.
 *
 * A malformed --database-url is a configuration error (exit 2, one line
 * naming the option) in every form libpq reads a password from, and no
 * message, log line or retry line quotes the password, whole or in pieces.
 * Options name themselves once; the command line wins over the environment
 * without reading the variable it overrides; action flags never come from
 * the environment; /healthz names the end that is down.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "http_client.h"
#include "relay_runner.h"

/* Every password below is built from these words; none may ever be printed. */
#define WORD_A "Hunter"
#define WORD_B "Swordfish"

struct fixture {
    char *url; /* a database with the schema */
    PGconn *conn;
    int pg_port;
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->pg_port = atoi(harness_env("OUTBOX_TEST_PG_PORT"));
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    static const char *const variables[] = {"OUTBOX_BATCH_SIZE", "OUTBOX_LEASE",
                                            "OUTBOX_DATABASE_URL", "OUTBOX_HELP",
                                            "OUTBOX_VERSION", "OUTBOX_ONCE", "OUTBOX_CHECK"};

    /* a test that failed half way leaves none of its variables to the next */
    for (size_t i = 0; i < sizeof(variables) / sizeof(variables[0]); i++)
        unsetenv(variables[i]);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

static int
count_lines(const char *text)
{
    int lines = 0;

    for (; *text != '\0'; text++)
        lines += *text == '\n';
    return lines;
}

static int
count_occurrences(const char *text, const char *word)
{
    int count = 0;

    for (const char *p = strstr(text, word); p != NULL; p = strstr(p + 1, word))
        count++;
    return count;
}

/* Fails when output holds either secret word, naming what printed it. */
static void
assert_no_secret(const char *what, const char *url, const char *output)
{
    if (strstr(output, WORD_A) != NULL || strstr(output, WORD_B) != NULL)
        fail_msg("%s with '%s' printed a password:\n%s", what, url, output);
}

/* The relay and outboxctl each reject url as a configuration error naming --database-url. */
static void
assert_config_error(const char *url, const char *broker)
{
    char output[8192];
    const char *check[] = {"--database-url", url, "--broker", broker, "--check", NULL};
    const char *run[] = {"--database-url", url, "--broker", broker, "--metrics-addr", "off", NULL};
    const char *ctl[] = {"--database-url", url, "status", NULL};
    const char *const *argvs[] = {check, run};

    for (int i = 0; i < 2; i++) {
        int status = fixture_run_program("outbox-relay", argvs[i], output, sizeof(output), 20000);

        assert_no_secret(i == 0 ? "outbox-relay --check" : "outbox-relay", url, output);
        if (status != 2 || count_lines(output) != 1 || strstr(output, "--database-url") == NULL)
            fail_msg("outbox-relay%s with '%s': exit %d, expected 2 and one line naming"
                     " --database-url:\n%s",
                     i == 0 ? " --check" : "", url, status, output);
    }
    if (fixture_run_program("outboxctl", ctl, output, sizeof(output), 20000) != 2 ||
        count_lines(output) != 1 || strstr(output, "--database-url") == NULL)
        fail_msg("outboxctl with '%s': expected exit 2 and one line naming --database-url:\n%s",
                 url, output);
    assert_no_secret("outboxctl", url, output);
}

static void
test_malformed_database_url_is_a_config_error(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char urls[16][256];
    int n = 0, port = f->pg_port;

    /* userinfo: a bad escape, a forbidden %00 */
    snprintf(urls[n++], 256, "postgresql://u:" WORD_A "%%zz" WORD_B "@127.0.0.1:%d/app", port);
    snprintf(urls[n++], 256, "postgres://u:" WORD_A "%%00" WORD_B "@127.0.0.1:%d/app", port);
    /* the query's password: a bad escape, a percent-encoded key, no '=' */
    snprintf(urls[n++], 256, "postgresql://u@127.0.0.1:%d/app?password=" WORD_A "%%zz" WORD_B,
             port);
    snprintf(urls[n++], 256,
             "postgresql://u@127.0.0.1:%d/app?sslmode=disable&pass%%77ord=" WORD_A "%%zz" WORD_B,
             port);
    snprintf(urls[n++], 256, "postgresql://u@127.0.0.1:%d/app?password=" WORD_A "&bogus=1", port);
    snprintf(urls[n++], 256, "postgresql://u:" WORD_A "@127.0.0.1:%d/app?password", port);
    /* an unclosed '[' makes libpq quote the whole URI */
    snprintf(urls[n++], 256, "postgresql://u:" WORD_A WORD_B "@[127.0.0.1:%d/app", port);
    snprintf(urls[n++], 256, "postgresql://u:" WORD_A WORD_B "@[]:%d/app", port);
    /* conninfo: unknown keyword, unterminated quote, a keyword without '=' */
    snprintf(urls[n++], 256, "host=127.0.0.1 port=%d password=" WORD_A " bogus=1", port);
    snprintf(urls[n++], 256, "host=127.0.0.1 port=%d password='" WORD_A " " WORD_B, port);
    snprintf(urls[n++], 256, "host=127.0.0.1 port=%d password = '" WORD_A "\\' " WORD_B "' dbname",
             port);
    /* a dbname that is itself a URI or a conninfo, as libpq expands it */
    snprintf(urls[n++], 256, "port=%d dbname=postgresql://u:" WORD_A "%%zz" WORD_B "@127.0.0.1/app",
             port);
    snprintf(urls[n++], 256, "postgresql://127.0.0.1:%d/?dbname=password%%3D" WORD_A "%%20bogus%%3D1",
             port);
    for (int i = 0; i < n; i++)
        assert_config_error(urls[i], broker);
}

/*
 * URLs libpq parses but cannot connect with: the relay retries and logs each
 * failure, outboxctl and --check fail once; none of them shows a password,
 * not even the piece libpq takes for a host name.
 */
static void
test_retry_lines_hide_the_password(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    int closed = harness_closed_port();
    char urls[8][256], output[16384];
    int n = 0;

    (void)f;
    snprintf(urls[n++], 256, "postgresql://u:" WORD_A WORD_B "@127.0.0.1:%d/app", closed);
    /* hostaddr: libpq connects there (no DNS lookup) and names the host it read in its message */
    snprintf(urls[n++], 256,
             "postgresql://u:" WORD_A "@" WORD_B "@127.0.0.1:%d/app?hostaddr=127.0.0.1", closed);
    snprintf(urls[n++], 256, "postgresql://u:" WORD_A "/" WORD_B "@127.0.0.1:%d/app", closed);
    snprintf(urls[n++], 256, "postgresql://u@127.0.0.1:%d/app?password=" WORD_A "%%40" WORD_B,
             closed);
    snprintf(urls[n++], 256, "host=127.0.0.1 port=%d password='" WORD_A " " WORD_B "'", closed);
    snprintf(urls[n++], 256, "host=" WORD_A " hostaddr=127.0.0.1 port=%d password=" WORD_A,
             closed);
    for (int i = 0; i < n; i++) {
        const char *check[] = {"--database-url", urls[i], "--broker", broker, "--check", NULL};
        const char *ctl[] = {"--database-url", urls[i], "status", NULL};
        const char *extra[] = {"--log-level", "debug", NULL};
        struct relay_process relay;
        FILE *log;
        size_t len = 0;

        assert_int_equal(fixture_run_program("outbox-relay", check, output, sizeof(output), 30000), 1);
        assert_no_secret("outbox-relay --check", urls[i], output);
        assert_int_equal(fixture_run_program("outboxctl", ctl, output, sizeof(output), 30000), 1);
        assert_no_secret("outboxctl", urls[i], output);

        relay_start_process(&relay, urls[i], broker, extra);
        /* a few connection attempts: until two retry lines, 20 s at most (valgrind is slow) */
        for (int waited = 0; waited < 20000; waited += 100) {
            usleep(100 * 1000);
            len = 0;
            log = fopen(relay.log_path, "r");
            if (log != NULL) {
                len = fread(output, 1, sizeof(output) - 1, log);
                fclose(log);
            }
            output[len] = '\0';
            if (count_occurrences(output, "database unavailable") >= 2 ||
                (waited >= 1500 && strstr(output, "database unavailable") != NULL))
                break;
        }
        relay_signal(&relay, SIGTERM);
        harness_wait_exit(relay.pid, 15000);
        len = 0;
        log = fopen(relay.log_path, "r");
        if (log != NULL) {
            len = fread(output, 1, sizeof(output) - 1, log);
            fclose(log);
        }
        output[len] = '\0';
        unlink(relay.log_path);
        if (strstr(output, "database unavailable") == NULL)
            fail_msg("no retry line for '%s':\n%s", urls[i], output);
        assert_no_secret("the relay's log", urls[i], output);
    }
}

/* ---- item: messages and the environment ---------------------------------------------- */

static void
test_options_name_themselves_once(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_AMQP_URL");
    char exchange[300], output[4096];
    const char *argv[] = {"--database-url", f->url, "--broker", broker, "--exchange", exchange,
                          "--check", NULL};
    const char *metrics[] = {"--database-url", f->url, "--broker", broker, "--metrics-addr", "bad",
                             NULL};

    memset(exchange, 'x', 299);
    exchange[299] = '\0';
    assert_int_equal(fixture_run_program("outbox-relay", argv, output, sizeof(output), 20000), 2);
    if (strstr(output, "--exchange") == NULL || strstr(output, "--broker") != NULL ||
        count_lines(output) != 1)
        fail_msg("a 299-byte --exchange, expected one line naming --exchange:\n%s", output);

    assert_int_equal(fixture_run_program("outbox-relay", metrics, output, sizeof(output), 20000), 2);
    if (count_occurrences(output, "--metrics-addr") != 1 || count_lines(output) != 1)
        fail_msg("--metrics-addr bad, expected one line naming it once:\n%s", output);
}

static void
test_command_line_wins_without_reading_the_variable(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char output[4096];
    const char *argv[] = {"--database-url", f->url, "--broker", broker, "--batch-size", "10",
                          "--lease", "30", "--check", NULL};

    setenv("OUTBOX_BATCH_SIZE", "lots", 1);
    setenv("OUTBOX_LEASE", "-1", 1);
    setenv("OUTBOX_DATABASE_URL", "postgresql://u:" WORD_A "%zz@127.0.0.1/app", 1);
    assert_int_equal(fixture_run_program("outbox-relay", argv, output, sizeof(output), 20000), 0);
    assert_non_null(strstr(output, "configuration OK"));
    unsetenv("OUTBOX_BATCH_SIZE");
    unsetenv("OUTBOX_LEASE");
    unsetenv("OUTBOX_DATABASE_URL");
}

static void
test_flags_never_come_from_the_environment(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char output[4096];
    const char *argv[] = {"--database-url", f->url, "--broker", broker, "--check", NULL};
    const char *once[] = {"--database-url", f->url, "--broker", broker, "--metrics-addr", "off",
                          NULL};
    struct relay_process relay;
    int status;

    setenv("OUTBOX_HELP", "1", 1);
    setenv("OUTBOX_VERSION", "yes", 1);
    setenv("OUTBOX_ONCE", "yes", 1);
    assert_int_equal(fixture_run_program("outbox-relay", argv, output, sizeof(output), 20000), 0);
    if (strstr(output, "configuration OK") == NULL || strstr(output, "usage:") != NULL)
        fail_msg("OUTBOX_HELP=1 turned --check into something else:\n%s", output);

    /* OUTBOX_ONCE=yes does not make a daemon exit once the table is empty */
    (void)once;
    relay_start_process(&relay, f->url, broker, NULL);
    status = harness_wait_exit(relay.pid, 3000);
    unsetenv("OUTBOX_HELP");
    unsetenv("OUTBOX_VERSION");
    unsetenv("OUTBOX_ONCE");
    if (status != -1) {
        relay_dump_log(&relay);
        fail_msg("with OUTBOX_ONCE=yes the relay exited (%d) instead of running on", status);
    }
    unlink(relay.log_path);

    /* and OUTBOX_CHECK=1 does not turn a run into a check */
    setenv("OUTBOX_CHECK", "1", 1);
    relay_start_process(&relay, f->url, broker, NULL);
    status = harness_wait_exit(relay.pid, 3000);
    unsetenv("OUTBOX_CHECK");
    if (status != -1) {
        relay_dump_log(&relay);
        fail_msg("with OUTBOX_CHECK=1 the relay exited (%d) instead of running on", status);
    }
    unlink(relay.log_path);
}

/* GET /healthz on port; the body, or "" when nothing answers. */
static void
get_health(int port, char *body, size_t size)
{
    struct http_reply reply = http_get(port, "/healthz");

    snprintf(body, size, "%s", reply.body != NULL ? reply.body : "");
    http_reply_free(&reply);
}

/* Polls /healthz until its body (first line) is want, for up to 10 s; the last body. */
static void
wait_for_health(int port, const char *want, char *body, size_t size)
{
    for (int i = 0; i < 100; i++) {
        get_health(port, body, size);
        body[strcspn(body, "\r\n")] = '\0';
        if (strcmp(body, want) == 0)
            return;
        usleep(100 * 1000);
    }
}

static void
test_health_names_the_end_that_is_down(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char database[256], closed_broker[128], addr[64], body[1024];
    int port = harness_closed_port();
    const char *extra[] = {"--metrics-addr", addr, NULL};
    struct relay_process relay;

    (void)f;
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    snprintf(database, sizeof(database), "postgresql://postgres@127.0.0.1:%d/postgres",
             harness_closed_port());
    relay_start_process(&relay, database, broker, extra);
    wait_for_health(port, "database down", body, sizeof(body));
    relay_signal(&relay, SIGTERM);
    harness_wait_exit(relay.pid, 15000);
    unlink(relay.log_path);
    if (strcmp(body, "database down") != 0)
        fail_msg("only the database is down, /healthz says '%s'", body);

    /* both down */
    snprintf(closed_broker, sizeof(closed_broker), "redis://127.0.0.1:%d/0", harness_closed_port());
    relay_start_process(&relay, database, closed_broker, extra);
    wait_for_health(port, "database and broker down", body, sizeof(body));
    relay_signal(&relay, SIGTERM);
    harness_wait_exit(relay.pid, 15000);
    unlink(relay.log_path);
    if (strcmp(body, "database and broker down") != 0)
        fail_msg("both ends are down, /healthz says '%s'", body);
}

/* ---- --once gives up on an unreachable end ------------------------------------------ */

/* Reads a relay's log and returns its last line in line (size bytes). */
static void
last_line(const struct relay_process *relay, char *line, size_t size)
{
    char text[16384];
    size_t len = 0;
    FILE *log = fopen(relay->log_path, "r");
    char *end;

    if (log != NULL) {
        len = fread(text, 1, sizeof(text) - 1, log);
        fclose(log);
    }
    text[len] = '\0';
    while (len > 0 && text[len - 1] == '\n')
        text[--len] = '\0';
    end = strrchr(text, '\n');
    end = end != NULL ? end + 1 : text;
    len = strlen(end) < size ? strlen(end) : size - 1;
    memcpy(line, end, len);
    line[len] = '\0';
}

static double
seconds_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * --once with the database, the broker, or both unreachable: exit 1 after the
 * 10 s connect budget (not before, not much after), the last line naming what
 * it could not reach. The three runs go at the same time.
 */
static void
test_once_gives_up_on_an_unreachable_end(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char closed_database[256], closed_broker[128];
    const char *extra[] = {"--once", NULL};
    const char *databases[3], *brokers[3];
    const char *expected[3] = {"--once: database unreachable for 10 s",
                               "--once: broker unreachable for 10 s",
                               "--once: database and broker unreachable for 10 s"};
    struct relay_process relays[3];
    double started;

    snprintf(closed_database, sizeof(closed_database),
             "postgresql://postgres@127.0.0.1:%d/postgres", harness_closed_port());
    snprintf(closed_broker, sizeof(closed_broker), "redis://127.0.0.1:%d/0", harness_closed_port());
    databases[0] = closed_database;
    brokers[0] = broker;
    databases[1] = f->url;
    brokers[1] = closed_broker;
    databases[2] = closed_database;
    brokers[2] = closed_broker;
    enqueue_rows(f->conn, "once-unreachable", 5);

    started = seconds_now();
    for (int i = 0; i < 3; i++)
        relay_start_process(&relays[i], databases[i], brokers[i], extra);
    for (int i = 0; i < 3; i++) {
        char line[1024];
        int status = harness_wait_exit(relays[i].pid, 40000);
        double elapsed = seconds_now() - started;

        last_line(&relays[i], line, sizeof(line));
        if (status != 1 || strstr(line, expected[i]) == NULL || elapsed < 9.5 || elapsed > 30) {
            relay_dump_log(&relays[i]);
            fail_msg("--once, run %d: exit %d after %.1f s, last line '%s'; expected exit 1"
                     " after about 10 s with '%s'",
                     i, status, elapsed, line, expected[i]);
        }
        unlink(relays[i].log_path);
    }
    /* nothing was lost: the rows wait for the next run */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'ready'"),
                     5);
}

/* ---- --check verifies what the relay will do --------------------------------------- */

/* --check as user after grants (run as the owner); exit 2 naming missing, or 0 when NULL. */
static void
check_as_role(struct fixture *f, const char *user, const char *grants, const char *missing)
{
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char output[4096];
    char *url = fixture_url_as(f->url, user);
    const char *argv[] = {"--database-url", url, "--broker", broker, "--check", NULL};
    int status;

    fixture_create_login_role(f->conn, user, grants);
    status = fixture_run_program("outbox-relay", argv, output, sizeof(output), 30000);
    fixture_drop_role(f->conn, user);
    free(url);
    if (missing == NULL) {
        if (status != 0 || strstr(output, "configuration OK") == NULL)
            fail_msg("--check as a role with every privilege: exit %d\n%s", status, output);
        return;
    }
    if (status != 2 || strstr(output, missing) == NULL || count_lines(output) != 1)
        fail_msg("--check as a role without %s: exit %d, expected 2 and one line naming it:\n%s",
                 missing, status, output);
}

static void
test_check_names_a_missing_privilege(void **state)
{
    struct fixture *f = *state;
    char user[64];

    snprintf(user, sizeof(user), "check_role_%d", (int)getpid());
#define GRANTS(...) (snprintf(grants, sizeof(grants), __VA_ARGS__), grants)
    {
        char grants[512];

        check_as_role(f, user, GRANTS("GRANT SELECT, UPDATE, DELETE ON outbox.job TO %s", user),
                      "USAGE on schema outbox");
        check_as_role(f, user, GRANTS("GRANT USAGE ON SCHEMA outbox TO %1$s;"
                                      " GRANT UPDATE, DELETE ON outbox.job TO %1$s", user),
                      "SELECT on table outbox.job");
        check_as_role(f, user, GRANTS("GRANT USAGE ON SCHEMA outbox TO %1$s;"
                                      " GRANT SELECT, DELETE ON outbox.job TO %1$s", user),
                      "UPDATE on table outbox.job");
        check_as_role(f, user, GRANTS("GRANT USAGE ON SCHEMA outbox TO %1$s;"
                                      " GRANT SELECT, UPDATE ON outbox.job TO %1$s;"
                                      " GRANT SELECT ON outbox.paused TO %1$s", user),
                      "DELETE on table outbox.job");
        /* the claim skips paused queues */
        check_as_role(f, user, GRANTS("GRANT USAGE ON SCHEMA outbox TO %1$s;"
                                      " GRANT SELECT, UPDATE, DELETE ON outbox.job TO %1$s", user),
                      "SELECT on table outbox.paused");
        /* the CHECK on headers calls this function on every mark */
        check_as_role(f, user, GRANTS("GRANT USAGE ON SCHEMA outbox TO %1$s;"
                                      " GRANT SELECT, UPDATE, DELETE ON outbox.job TO %1$s;"
                                      " GRANT SELECT ON outbox.paused TO %1$s;"
                                      " REVOKE EXECUTE ON FUNCTION outbox.headers_are_strings(jsonb)"
                                      " FROM PUBLIC",
                                      user),
                      "EXECUTE on function outbox.headers_are_strings(jsonb)");
        harness_exec(f->conn, "GRANT EXECUTE ON FUNCTION outbox.headers_are_strings(jsonb)"
                              " TO PUBLIC");
        check_as_role(f, user, GRANTS("GRANT USAGE ON SCHEMA outbox TO %1$s;"
                                      " GRANT SELECT, UPDATE, DELETE ON outbox.job TO %1$s;"
                                      " GRANT SELECT ON outbox.paused TO %1$s;"
                                      " REVOKE EXECUTE ON FUNCTION pg_catalog.make_interval(integer,"
                                      " integer, integer, integer, integer, integer, double precision)"
                                      " FROM PUBLIC",
                                      user),
                      "EXECUTE on function make_interval(");
        harness_exec(f->conn, "GRANT EXECUTE ON FUNCTION pg_catalog.make_interval(integer, integer,"
                              " integer, integer, integer, integer, double precision) TO PUBLIC");
        /* what sql/roles grants the relay is enough */
        fixture_create_outbox_roles(f->conn);
        check_as_role(f, user, GRANTS("GRANT outbox_relay TO %s", user), NULL);
    }
#undef GRANTS
}

/*
 * --on-success delete without DELETE: a normal start refuses, naming the
 * option and the privilege, and publishes nothing (rows published and not
 * deleted would stay running until their lease and go out again). With the
 * grant, the same run deletes the rows.
 */
static void
test_on_success_delete_needs_the_delete_privilege(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char user[64], sql[512], prefix[64], output[4096];
    char *url;
    int status;

    snprintf(user, sizeof(user), "delete_role_%d", (int)getpid());
    snprintf(prefix, sizeof(prefix), "on-delete-%d:", (int)getpid());
    url = fixture_url_as(f->url, user);
    snprintf(sql, sizeof(sql),
             "GRANT USAGE ON SCHEMA outbox TO %1$s; GRANT SELECT, UPDATE ON outbox.job TO %1$s;"
             " GRANT SELECT ON outbox.paused TO %1$s",
             user);
    fixture_create_login_role(f->conn, user, sql);
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', '{}')) FROM generate_series(1, 5)");
    {
        const char *argv[] = {"--database-url", url,       "--broker",     broker,
                              "--stream-prefix", prefix, "--on-success", "delete",
                              "--metrics-addr",  "off",  "--once",       NULL};

        status = fixture_run_program("outbox-relay", argv, output, sizeof(output), 30000);
        if (status == 0 || strstr(output, "--on-success delete") == NULL ||
            strstr(output, "DELETE on table outbox.job") == NULL)
            fail_msg("--on-success delete without DELETE: exit %d, expected a failure naming the"
                     " option and the privilege:\n%s",
                     status, output);
        assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                                   " WHERE state = 'ready' AND attempts = 0"),
                         5);
        snprintf(sql, sizeof(sql), "GRANT DELETE ON outbox.job TO %s", user);
        harness_exec(f->conn, sql);
        status = fixture_run_program("outbox-relay", argv, output, sizeof(output), 30000);
        if (status != 0)
            fail_msg("--on-success delete with DELETE: exit %d\n%s", status, output);
        assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"), 0);
    }
    fixture_drop_role(f->conn, user);
    free(url);
}

/*
 * Waits for a --once relay to end; fails unless it exits 1 with a last line
 * holding each needle and not the word "unreachable" (it reached both ends).
 */
static void
assert_once_gave_up(struct relay_process *relay, const char *what, const char *const *needles)
{
    char line[1024];
    int status = harness_wait_exit(relay->pid, 60000);
    bool found = true;

    last_line(relay, line, sizeof(line));
    for (size_t i = 0; needles[i] != NULL; i++)
        found = found && strstr(line, needles[i]) != NULL;
    if (status != 1 || !found || strncmp(line, "outbox-relay: ", 14) != 0 ||
        strstr(line, "unreachable") != NULL) {
        relay_dump_log(relay);
        fail_msg("--once %s: exit %d, last line '%s'; expected exit 1 and one line naming the"
                 " cause ('%s')",
                 what, status, line, needles[0]);
    }
    unlink(relay->log_path);
}

/*
 * --once ends when it connects but no row can move: a Redis without the
 * replicas --redis-wait asks for, a role whose sessions are read-only, a
 * lock on outbox.job; each exit 1 with one line naming the cause, and
 * --check refuses the read-only role.
 */
static void
test_once_ends_when_no_row_can_move(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    const char *wait_extra[] = {"--once", "--redis-wait", "1", "--stream-prefix", "no-replica:",
                                NULL};
    const char *once[] = {"--once", NULL};
    const char *replicas[] = {"replicas", NULL}, *read_only[] = {"read-only", NULL};
    const char *locked[] = {"lock", NULL};
    char user[64], sql[512], output[4096];
    char *url;
    struct relay_process waiting, readonly, blocked;
    PGconn *locker;

    snprintf(user, sizeof(user), "readonly_role_%d", (int)getpid());
    fixture_create_outbox_roles(f->conn);
    snprintf(sql, sizeof(sql),
             "GRANT outbox_relay TO %1$s; ALTER ROLE %1$s SET default_transaction_read_only = on",
             user);
    fixture_create_login_role(f->conn, user, sql);
    url = fixture_url_as(f->url, user);
    enqueue_rows(f->conn, "stuck", 5);

    relay_start_process(&waiting, f->url, broker, wait_extra);
    relay_start_process(&readonly, url, broker, once);
    assert_once_gave_up(&waiting, "with --redis-wait 1 and no replica", replicas);
    assert_once_gave_up(&readonly, "as a read-only role", read_only);
    {
        const char *argv[] = {"--database-url", url, "--broker", broker, "--check", NULL};
        int status = fixture_run_program("outbox-relay", argv, output, sizeof(output), 30000);

        if (status != 2 || strstr(output, "read-only") == NULL || count_lines(output) != 1)
            fail_msg("--check as a read-only role: exit %d, expected 2 and one line:\n%s", status,
                     output);
    }

    locker = harness_connect(f->url);
    harness_exec(locker, "BEGIN; LOCK TABLE outbox.job IN ACCESS EXCLUSIVE MODE");
    relay_start_process(&blocked, f->url, broker, once);
    assert_once_gave_up(&blocked, "with outbox.job locked", locked);
    harness_exec(locker, "ROLLBACK");
    PQfinish(locker);

    /* nothing was lost: the rows wait for the next run */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'ready'"),
                     5);
    fixture_drop_role(f->conn, user);
    free(url);
}

/* Whether the relay's log holds needle (in the first 64 kB). */
static bool
log_contains(const struct relay_process *relay, const char *needle)
{
    static char text[65536];
    size_t len = 0;
    FILE *log = fopen(relay->log_path, "r");

    if (log != NULL) {
        len = fread(text, 1, sizeof(text) - 1, log);
        fclose(log);
    }
    text[len] = '\0';
    return strstr(text, needle) != NULL;
}

/* Fails unless every line of the relay's log is a JSON object. */
static void
assert_log_is_json(const struct relay_process *relay)
{
    char line[4096];
    FILE *log = fopen(relay->log_path, "r");

    assert_non_null(log);
    while (fgets(line, sizeof(line), log) != NULL)
        if (line[0] != '{') {
            fclose(log);
            fail_msg("a line of a --log-format json log is not JSON: %s", line);
        }
    fclose(log);
}

/*
 * UPDATE revoked while the relay runs: it keeps running, says so in its log
 * format, and publishes again once the grant is back.
 */
static void
test_revoked_privilege_is_waited_out(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    const char *extra[] = {"--log-format", "json", "--stream-prefix", "revoked:", NULL};
    const char *missing = "lacks UPDATE on table outbox.job";
    char user[64], sql[512];
    char *url;
    struct relay_process relay;

    snprintf(user, sizeof(user), "revoked_role_%d", (int)getpid());
    snprintf(sql, sizeof(sql),
             "GRANT USAGE ON SCHEMA outbox TO %1$s;"
             " GRANT SELECT, UPDATE, DELETE ON outbox.job TO %1$s;"
             " GRANT SELECT ON outbox.paused TO %1$s",
             user);
    fixture_create_login_role(f->conn, user, sql);
    url = fixture_url_as(f->url, user);
    relay_start_process(&relay, url, broker, extra);
    enqueue_rows(f->conn, "revoked", 10);
    assert_int_equal(wait_for_value(f->conn,
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 10,
                                    30000),
                     10);
    snprintf(sql, sizeof(sql), "REVOKE UPDATE ON outbox.job FROM %s", user);
    harness_exec(f->conn, sql);
    enqueue_rows(f->conn, "revoked", 10);
    /* the claim fails, the reconnect names what is missing */
    for (int i = 0; i < 100 && !log_contains(&relay, missing); i++)
        usleep(100 * 1000);
    usleep(500 * 1000); /* an exit right after the line would show below */
    if (!log_contains(&relay, missing) || kill(relay.pid, 0) != 0) {
        relay_dump_log(&relay);
        fail_msg("UPDATE revoked: the relay should run on and log what is missing");
    }
    snprintf(sql, sizeof(sql), "GRANT UPDATE ON outbox.job TO %s", user);
    harness_exec(f->conn, sql);
    if (wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 20,
                       30000) != 20) {
        relay_dump_log(&relay);
        fail_msg("the grant is back, but the rows did not move");
    }
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_log_is_json(&relay);
    unlink(relay.log_path);
    fixture_drop_role(f->conn, user);
    free(url);
}

static void
test_check_looks_for_the_exchange(void **state)
{
    struct fixture *f = *state;
    const char *broker = harness_env("OUTBOX_TEST_AMQP_URL");
    char output[4096];
    const char *argv[] = {"--database-url", f->url, "--broker", broker, "--exchange",
                          "no-such-exchange-here", "--check", NULL};

    assert_int_equal(fixture_run_program("outbox-relay", argv, output, sizeof(output), 30000), 2);
    if (strstr(output, "--exchange") == NULL || strstr(output, "no-such-exchange-here") == NULL ||
        count_lines(output) != 1)
        fail_msg("--check with a missing exchange, expected one line naming --exchange:\n%s",
                 output);
    argv[5] = "amq.topic";
    assert_int_equal(fixture_run_program("outbox-relay", argv, output, sizeof(output), 30000), 0);
    assert_non_null(strstr(output, "configuration OK"));
}

/* ---- the broker password from a file ------------------------------------------------ */

/* Writes text to a new file under /tmp; returns its malloc'd path. */
static char *
write_file(const char *name, const char *text)
{
    char *path = malloc(128);
    FILE *file;

    assert_non_null(path);
    snprintf(path, 128, "/tmp/outbox-config-test-%d-%s", (int)getpid(), name);
    file = fopen(path, "w");
    assert_non_null(file);
    fputs(text, file);
    fclose(file);
    return path;
}

/*
 * Redis (whose test server wants a password) and RabbitMQ take the password
 * from --broker-password-file, with or without a trailing newline, over
 * none or a wrong one in the URL; an unreadable file is exit 2 naming the
 * option.
 */
static void
test_broker_password_file(void **state)
{
    struct fixture *f = *state;
    const char *password = harness_env("OUTBOX_TEST_REDIS_PASSWORD");
    int redis_port = atoi(harness_env("OUTBOX_TEST_REDIS_PORT"));
    int amqp_port = atoi(harness_env("OUTBOX_TEST_AMQP_PORT"));
    char text[256], redis_bare[128], redis_wrong[128], amqp_wrong[128], output[4096];
    char *with_newline, *without_newline, *guest;
    const char *check[] = {"--database-url", f->url, "--broker", redis_bare, "--check", NULL};
    const char *with_file[] = {"--database-url", f->url, "--broker", redis_bare,
                               "--broker-password-file", NULL, "--check", NULL};
    const char *once[] = {"--broker-password-file", NULL, "--stream-prefix", "password-file-test:",
                          NULL};

    snprintf(text, sizeof(text), "%s\n", password);
    with_newline = write_file("redis-password", text);
    without_newline = write_file("redis-password-bare", password);
    guest = write_file("amqp-password", "guest\r\n");
    snprintf(redis_bare, sizeof(redis_bare), "redis://127.0.0.1:%d/0", redis_port);
    snprintf(redis_wrong, sizeof(redis_wrong), "redis://:not-it@127.0.0.1:%d/0", redis_port);
    snprintf(amqp_wrong, sizeof(amqp_wrong), "amqp://guest:not-it@127.0.0.1:%d/", amqp_port);

    /* without it the Redis server refuses */
    assert_int_equal(fixture_run_program("outbox-relay", check, output, sizeof(output), 30000), 1);
    with_file[5] = with_newline;
    if (fixture_run_program("outbox-relay", with_file, output, sizeof(output), 30000) != 0)
        fail_msg("redis with --broker-password-file:\n%s", output);
    with_file[5] = without_newline;
    with_file[3] = redis_wrong;
    if (fixture_run_program("outbox-relay", with_file, output, sizeof(output), 30000) != 0)
        fail_msg("redis, wrong password in the URL, the right one in the file:\n%s", output);
    assert_null(strstr(output, password));
    with_file[5] = guest;
    with_file[3] = amqp_wrong;
    if (fixture_run_program("outbox-relay", with_file, output, sizeof(output), 30000) != 0)
        fail_msg("amqp, wrong password in the URL, the right one in the file:\n%s", output);

    /* rows go through with it */
    enqueue_rows(f->conn, "password-file", 20);
    once[1] = with_newline;
    assert_int_equal(relay_run_once(f->url, redis_bare, once), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     20);

    /* unreadable and empty files */
    with_file[3] = redis_bare;
    with_file[5] = "/nonexistent/outbox-password";
    assert_int_equal(fixture_run_program("outbox-relay", with_file, output, sizeof(output), 30000), 2);
    if (strstr(output, "--broker-password-file") == NULL || count_lines(output) != 1 ||
        strstr(output, "No such file") == NULL)
        fail_msg("an unreadable password file, expected one line naming the option:\n%s", output);
    unlink(without_newline);
    free(without_newline);
    without_newline = write_file("redis-password-empty", "\n");
    with_file[5] = without_newline;
    assert_int_equal(fixture_run_program("outbox-relay", with_file, output, sizeof(output), 30000), 2);
    assert_non_null(strstr(output, "--broker-password-file"));

    unlink(with_newline);
    unlink(without_newline);
    unlink(guest);
    free(with_newline);
    free(without_newline);
    free(guest);
}

/* ---- small gaps ------------------------------------------------------------------------ */

/*
 * An option of the other broker: on the command line a configuration error
 * naming it (exit 2); from the environment (shared by relays of several
 * brokers) one warning line at start naming it.
 */
static void
test_options_of_the_other_broker_are_named(void **state)
{
    struct fixture *f = *state;
    const char *argv[] = {"--check", "--database-url", f->url, "--broker",
                          harness_env("OUTBOX_TEST_REDIS_URL"), "--exchange", "events", NULL};
    const char *extra[] = {"--once", NULL};
    struct relay_process relay;
    char text[16384];
    size_t len = 0;
    FILE *log;

    assert_int_equal(relay_run_capture(argv, text, sizeof(text)), 2);
    if (strstr(text, "--exchange is an option of amqp") == NULL)
        fail_msg("--exchange with a redis broker, expected exit 2 naming it:\n%s", text);

    /* --stream-prefix from the environment, with an AMQP broker */
    setenv("OUTBOX_STREAM_PREFIX", "orders.", 1);
    relay_start_process(&relay, f->url, harness_env("OUTBOX_TEST_AMQP_URL"), extra);
    unsetenv("OUTBOX_STREAM_PREFIX");
    assert_int_equal(relay_wait(&relay, 30000), 0);
    log = fopen(relay.log_path, "r");
    if (log != NULL) {
        len = fread(text, 1, sizeof(text) - 1, log);
        fclose(log);
    }
    text[len] = '\0';
    unlink(relay.log_path);
    if (count_occurrences(text, "options for the other broker") != 1 ||
        strstr(text, "ignored=\"--stream-prefix\"") == NULL)
        fail_msg("OUTBOX_STREAM_PREFIX with an amqp broker, expected one warning naming it:\n%s",
                 text);
}

/* Runs a shell command line; its exit status. */
static int
run_shell(const char *command)
{
    const char *argv[] = {"/bin/sh", "-c", command, NULL};
    char path[128];
    int status;

    snprintf(path, sizeof(path), "/tmp/outbox-config-test-%d-shell.log", (int)getpid());
    status = harness_wait_exit(harness_spawn(argv, path), 60000);
    if (status != 0) {
        char text[4096];
        size_t len = 0;
        FILE *log = fopen(path, "r");

        if (log != NULL) {
            len = fread(text, 1, sizeof(text) - 1, log);
            fclose(log);
        }
        text[len] = '\0';
        fprintf(stderr, "'%s' failed:\n%s\n", command, text);
    }
    unlink(path);
    return status;
}

/* outboxctl enqueue takes a 10 MB payload from a file and from stdin. */
static void
test_enqueue_payload_from_a_file_or_stdin(void **state)
{
    struct fixture *f = *state;
    char path[128], command[1024], output[4096];
    const size_t pad = 10 * 1024 * 1024;
    FILE *file;
    const char *missing[] = {"--database-url", f->url, "enqueue", "--queue", "big",
                             "--payload-file", "/nonexistent/payload.json", NULL};

    snprintf(path, sizeof(path), "/tmp/outbox-config-test-%d-payload.json", (int)getpid());
    file = fopen(path, "w");
    assert_non_null(file);
    fputs("{\"pad\": \"", file);
    for (size_t i = 0; i < pad; i++)
        fputc('a' + (int)(i % 26), file);
    fputs("\"}\n", file);
    fclose(file);

    snprintf(command, sizeof(command),
             "'%s/outboxctl' --database-url '%s' enqueue --queue big --payload-file '%s'",
             harness_env("OUTBOX_BIN"), f->url, path);
    assert_int_equal(run_shell(command), 0);
    snprintf(command, sizeof(command),
             "'%s/outboxctl' --database-url '%s' enqueue --queue big --payload-file - < '%s'",
             harness_env("OUTBOX_BIN"), f->url, path);
    assert_int_equal(run_shell(command), 0);
    unlink(path);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'big'"
                                               " AND length(payload->>'pad') = 10485760"
                                               " AND right(payload->>'pad', 3) = 'jkl'"),
                     2);

    assert_int_equal(fixture_run_program("outboxctl", missing, output, sizeof(output), 20000), 2);
    if (strstr(output, "--payload-file") == NULL || count_lines(output) != 1)
        fail_msg("an unreadable payload file, expected one line naming --payload-file:\n%s",
                 output);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_malformed_database_url_is_a_config_error, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_retry_lines_hide_the_password, setup, teardown),
        cmocka_unit_test_setup_teardown(test_options_name_themselves_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command_line_wins_without_reading_the_variable, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_flags_never_come_from_the_environment, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_health_names_the_end_that_is_down, setup, teardown),
        cmocka_unit_test_setup_teardown(test_once_gives_up_on_an_unreachable_end, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_check_names_a_missing_privilege, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_looks_for_the_exchange, setup, teardown),
        cmocka_unit_test_setup_teardown(test_on_success_delete_needs_the_delete_privilege, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_once_ends_when_no_row_can_move, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoked_privilege_is_waited_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broker_password_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_options_of_the_other_broker_are_named, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_payload_from_a_file_or_stdin, setup,
                                        teardown),
    };

    return cmocka_run_group_tests_name("relay configuration", tests, NULL, NULL);
}
