/*
 * test_console_databases.c - `outboxctl --databases FILE serve`: one console
 * over a relay's list of databases against a real PostgreSQL. The
 * Databases view lists every database with its own counts, a database
 * that does not exist or does not answer costs only its own entry, every
 * other endpoint works on the database its database=NAME names, an action
 * changes that database only, an unknown name is a 404, and the list's
 * file is followed while the console runs. With --database-url the view
 * lists the one database.
 *
 * Needs the environment tests/run.sh gives (OUTBOX_TEST_PG_URL, OUTBOX_BIN).
 * Each test has its own databases, list file and console process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "console_client.h"
#include "fixtures.h"
#include "harness.h"

#define DATABASES 3 /* alpha, beta, gamma: created empty, migrated over the list */

static const char *const names[DATABASES] = {"alpha", "beta", "gamma"};

struct fixture {
    char *urls[DATABASES];
    PGconn *conns[DATABASES];
    char *extra_url; /* a database a test adds to the list while the console runs */
    char missing_url[256];
    char list_path[256];
    char token_file[256];
    int silent_fd; /* a loopback socket that takes connections and never answers; -1: none */
    int port;
    pid_t pid;
};

/* alpha: 2 ready and 1 dead rows of orders; beta: 1 ready and 1 running of billing. */
static const char *const seeds[DATABASES] = {
    "SELECT outbox.enqueue('orders', '{}'); SELECT outbox.enqueue('orders', '{}');"
    "INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts, finished_at)"
    " VALUES ('orders', '{}', 'dead', 3, 3, now());",
    "SELECT outbox.enqueue('billing', '{}');"
    "INSERT INTO outbox.job (queue, payload, state, attempts, worker_id, lease_until)"
    " VALUES ('billing', '{}', 'running', 1, 'relay-a', now() + interval '30 seconds');",
    "",
};

/* Writes the list file: the three databases, then the lines of extra ("" for none). */
static void
write_list(const struct fixture *f, const char *extra)
{
    char temporary[300];
    FILE *file;

    snprintf(temporary, sizeof(temporary), "%s.new", f->list_path);
    file = fopen(temporary, "w");
    assert_non_null(file);
    for (int i = 0; i < DATABASES; i++)
        fprintf(file, "%s %s\n", names[i], f->urls[i]);
    fputs(extra, file);
    fclose(file);
    assert_int_equal(rename(temporary, f->list_path), 0); /* whole, as an operator's tool would */
}

/* Creates the databases empty and migrates them with `outboxctl --databases FILE migrate`. */
static void
create_and_migrate(struct fixture *f)
{
    const char *argv[] = {"--databases", f->list_path, "migrate", NULL};
    char output[8192];

    for (int i = 0; i < DATABASES; i++)
        f->urls[i] = harness_database_new_empty();
    write_list(f, "");
    assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 0);
    if (strstr(output, "databases: 3, ok: 3, failed: 0") == NULL)
        fail_msg("migrate over the list said: %s", output);
    for (int i = 0; i < DATABASES; i++) {
        f->conns[i] = harness_connect(f->urls[i]);
        if (seeds[i][0] != '\0')
            harness_exec(f->conns[i], seeds[i]);
    }
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    const char *slash;

    assert_non_null(f);
    f->silent_fd = -1;
    snprintf(f->list_path, sizeof(f->list_path), "%s/console-databases-%d.list",
             harness_env("OUTBOX_TEST_STACK_DIR"), (int)getpid());
    create_and_migrate(f);
    slash = strrchr(f->urls[0], '/');
    snprintf(f->missing_url, sizeof(f->missing_url), "%.*s/outbox_test_missing_%d",
             (int)(slash - f->urls[0]), f->urls[0], (int)getpid());
    console_token_file(f->token_file, sizeof(f->token_file), "console-databases");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    console_stop(f->pid);
    if (f->silent_fd >= 0)
        close(f->silent_fd);
    for (int i = 0; i < DATABASES; i++) {
        PQfinish(f->conns[i]);
        harness_database_drop(f->urls[i]);
    }
    harness_database_drop(f->extra_url);
    unlink(f->list_path);
    unlink(f->token_file);
    free(f);
    return 0;
}

/* Starts the console over the list, with a token and --allow-actions. */
static void
start_console(struct fixture *f)
{
    const char *options[] = {"--auth-token-file", f->token_file, "--allow-actions", NULL};

    f->port = harness_closed_port();
    f->pid = console_start_list(f->port, f->list_path, options);
}

/* A loopback port that accepts connections (the kernel's backlog) and never answers. */
static int
silent_port(struct fixture *f)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t length = sizeof(addr);

    f->silent_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->silent_fd >= 0);
    assert_int_equal(bind(f->silent_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_int_equal(listen(f->silent_fd, 16), 0);
    assert_int_equal(getsockname(f->silent_fd, (struct sockaddr *)&addr, &length), 0);
    return ntohs(addr.sin_port);
}

/* Fails the test unless text holds part. */
static void
expect_in(const char *text, const char *part)
{
    if (strstr(text, part) == NULL)
        fail_msg("expected '%s' in: %s", part, text);
}

/* The JSON object of database name in a GET databases answer (malloc'd). */
static char *
entry_of(const char *body, const char *name)
{
    char needle[96];
    const char *start, *end;

    snprintf(needle, sizeof(needle), "{\"name\":\"%s\"", name);
    if ((start = strstr(body, needle)) == NULL) {
        fail_msg("no database '%s' in: %s", name, body);
        return NULL;
    }
    end = strstr(start + 1, "{\"name\":");
    if (end == NULL)
        end = strstr(start, "\"totals\"");
    assert_non_null(end);
    return strndup(start, (size_t)(end - start));
}

/* Fails the test unless database name's entry in body holds each of the parts (NULL-ended). */
static void
expect_entry(const char *body, const char *name, const char *const *parts)
{
    char *entry = entry_of(body, name);

    for (int i = 0; parts[i] != NULL; i++)
        expect_in(entry, parts[i]);
    free(entry);
}

static long
milliseconds_since(const struct timespec *start)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

/* ---- the Databases view ---- */

static void
test_databases_view(void **state)
{
    struct fixture *f = *state;
    const char *alpha[] = {"\"reachable\":true,\"error\":null", "\"identity\":{\"database_id\":",
                           "\"paused\":false", "\"ready\":2,\"running\":0,\"dead\":1,\"waiting\":0",
                           NULL};
    const char *beta[] = {"\"reachable\":true,\"error\":null", "\"lease_owner\":\"relay-x\"",
                          "\"ready\":1,\"running\":1,\"dead\":0,\"waiting\":0", NULL};
    const char *gamma[] = {"\"paused\":true", "\"pause_reason\":\"maintenance\"",
                           "\"ready\":0,\"running\":0,\"dead\":0,\"waiting\":0", NULL};
    const char *missing[] = {"\"reachable\":false,\"error\":\"unable to connect to the database",
                             "does not exist", "\"ready\":null", NULL};
    const char *silent[] = {"\"reachable\":false,\"error\":\"unable to connect to the database",
                            NULL};
    char extra[512], version[64];
    struct timespec start;
    struct http_reply r;

    harness_exec(f->conns[1], "SELECT outbox.database_lease_take('relay-x', 60)");
    harness_exec(f->conns[2], "SELECT outbox.database_pause('maintenance')");
    snprintf(extra, sizeof(extra),
             "missing %s\nsilent postgresql://postgres@127.0.0.1:%d/silent\n", f->missing_url,
             silent_port(f));
    write_list(f, extra);
    start_console(f);
    clock_gettime(CLOCK_MONOTONIC, &start);
    r = console_get(f->port, "/api/v1/databases");
    /* the silent server costs its connect timeout (2 s), in parallel with the others */
    if (milliseconds_since(&start) > 4500 * harness_time_scale())
        fail_msg("the view took %ld ms", milliseconds_since(&start));
    console_expect(&r, 200, "\"totals\":{\"databases\":5,\"ok\":3,\"failed\":2,\"paused\":1,"
                            "\"ready\":3,\"running\":1,\"dead\":1,\"waiting\":0}");
    snprintf(version, sizeof(version), "\"schema_version\":%lld",
             harness_query_ll(f->conns[0], "SELECT max(version) FROM outbox.schema_migrations"));
    expect_entry(r.body, "alpha", alpha);
    expect_entry(r.body, "alpha", (const char *[]){version, NULL});
    expect_entry(r.body, "beta", beta);
    expect_entry(r.body, "gamma", gamma);
    expect_entry(r.body, "missing", missing);
    expect_entry(r.body, "silent", silent);
    expect_in(r.body, "\"list_error\":null");
    http_reply_free(&r);
    /* the page: a row per database, the error of the missing one, the totals line */
    r = console_get(f->port, "/databases");
    console_expect(&r, 200, "<tr data-database=\"missing\">");
    expect_in(r.body, "does not exist");
    expect_in(r.body, "<a href=\"/?database=beta\">beta</a>");
    expect_in(r.body, "5 databases: 3 ok, 2 failed, 1 paused; ready 3, running 1, dead 1");
    expect_in(r.body, "paused since ");
    http_reply_free(&r);
}

/* ---- the other endpoints, on the database of database=NAME ---- */

static void
test_endpoints_per_database(void **state)
{
    struct fixture *f = *state;
    struct http_reply r;

    start_console(f);
    r = console_get(f->port, "/api/v1/queues?database=beta");
    console_expect(&r, 200, "\"queue\":\"billing\"");
    assert_null(strstr(r.body, "orders"));
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues"); /* the first database of the list */
    console_expect(&r, 200, "\"queue\":\"orders\"");
    assert_null(strstr(r.body, "billing"));
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/dead?database=alpha");
    console_expect(&r, 200, "\"queue\":\"orders\"");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/dead?database=beta");
    console_expect(&r, 200, "[]");
    http_reply_free(&r);
    /* the pages carry their database in their links and forms, and switch it */
    r = console_get(f->port, "/keys?database=beta");
    console_expect(&r, 200, "<a href=\"/dead?database=beta\">");
    expect_in(r.body, "data-api=\"/api/v1/pause?database=beta\"");
    expect_in(r.body, "<option value=\"beta\" selected>");
    expect_in(r.body, "<option value=\"gamma\">");
    http_reply_free(&r);
    r = console_get(f->port, "/?database=beta");
    console_expect(&r, 200, "href=\"/dead?queue=billing&amp;database=beta\"");
    assert_null(strstr(r.body, "data-queue=\"orders\""));
    http_reply_free(&r);
}

static void
test_action_on_one_database(void **state)
{
    struct fixture *f = *state;
    struct http_reply r;

    start_console(f);
    r = console_post(f->port, "/api/v1/pause?database=beta",
                     "{\"queue\":\"orders\",\"reason\":\"beta only\"}");
    console_expect(&r, 200, "\"changed\":true");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conns[1], "SELECT count(*) FROM outbox.paused"
                                                   " WHERE queue = 'orders'"),
                     1);
    assert_int_equal(harness_query_ll(f->conns[0], "SELECT count(*) FROM outbox.paused"), 0);
    assert_int_equal(harness_query_ll(f->conns[2], "SELECT count(*) FROM outbox.paused"), 0);
    r = console_get(f->port, "/api/v1/paused?database=beta");
    console_expect(&r, 200, "\"reason\":\"beta only\"");
    http_reply_free(&r);
    /* the dead rows of orders retried on alpha: the others have none to retry */
    r = console_post(f->port, "/api/v1/dead/retry?database=alpha", "{\"queue\":\"orders\"}");
    console_expect(&r, 200, "\"retried\":1");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conns[0], "SELECT count(*) FROM outbox.job"
                                                   " WHERE state = 'dead'"),
                     0);
    /* without --allow-actions, a database named changes nothing either */
    console_stop(f->pid);
    f->port = harness_closed_port();
    f->pid = console_start_list(f->port, f->list_path,
                                (const char *[]){"--auth-token-file", f->token_file, NULL});
    r = console_post(f->port, "/api/v1/resume?database=beta", "{\"queue\":\"orders\"}");
    console_expect(&r, 403, "read-only");
    http_reply_free(&r);
    assert_int_equal(harness_query_ll(f->conns[1], "SELECT count(*) FROM outbox.paused"), 1);
}

static void
test_unknown_database(void **state)
{
    struct fixture *f = *state;
    struct http_reply r;

    start_console(f);
    r = console_get(f->port, "/api/v1/queues?database=nope");
    console_expect(&r, 404, "{\"error\":\"no database 'nope' in the console's list\"}\n");
    assert_int_equal(strchr(r.body, '\n') - r.body + 1, (long)strlen(r.body)); /* one line */
    http_reply_free(&r);
    r = console_post(f->port, "/api/v1/pause?database=nope", "{\"queue\":\"orders\"}");
    console_expect(&r, 404, "no database 'nope'");
    http_reply_free(&r);
    for (int i = 0; i < DATABASES; i++)
        assert_int_equal(harness_query_ll(f->conns[i], "SELECT count(*) FROM outbox.paused"), 0);
    r = console_get(f->port, "/dead?database=nope");
    console_expect(&r, 404, "no database 'nope'");
    http_reply_free(&r);
    /* a name is echoed escaped, never as markup */
    r = console_get(f->port, "/api/v1/queues?database=%3Cscript%3E");
    console_expect(&r, 404, "\\u003cscript\\u003e");
    assert_null(strstr(r.body, "<script>"));
    http_reply_free(&r);
}

/* ---- the list's file, followed ---- */

/* Polls GET databases until its body holds part (true) or 10 s passed (false). */
static bool
databases_say_within(const struct fixture *f, const char *part)
{
    for (int waited = 0; waited < 10000; waited += 200) {
        struct http_reply r = console_get(f->port, "/api/v1/databases");
        bool found = r.status == 200 && strstr(r.body, part) != NULL;

        http_reply_free(&r);
        if (found)
            return true;
        usleep(200 * 1000);
    }
    return false;
}

static void
test_list_followed(void **state)
{
    struct fixture *f = *state;
    char extra[512];
    struct timespec start;
    struct http_reply r;
    PGconn *conn;

    f->extra_url = harness_database_new(); /* migrated already */
    conn = harness_connect(f->extra_url);
    harness_exec(conn, "SELECT outbox.enqueue('delta_queue', '{}')");
    PQfinish(conn);
    start_console(f);
    r = console_get(f->port, "/api/v1/queues?database=delta");
    console_expect(&r, 404, "no database 'delta'");
    http_reply_free(&r);
    snprintf(extra, sizeof(extra), "delta %s\n", f->extra_url);
    write_list(f, extra);
    clock_gettime(CLOCK_MONOTONIC, &start);
    assert_true(databases_say_within(f, "{\"name\":\"delta\""));
    if (milliseconds_since(&start) > 5000)
        fail_msg("the database added showed after %ld ms", milliseconds_since(&start));
    r = console_get(f->port, "/api/v1/queues?database=delta");
    console_expect(&r, 200, "\"queue\":\"delta_queue\"");
    http_reply_free(&r);
    /* a bad file keeps the list in use, and says why */
    write_list(f, "delta not a url at all\n");
    assert_true(databases_say_within(f, "\"list_error\":\"--databases "));
    r = console_get(f->port, "/api/v1/queues?database=delta");
    console_expect(&r, 200, "\"queue\":\"delta_queue\"");
    http_reply_free(&r);
    r = console_get(f->port, "/databases");
    console_expect(&r, 200, "id=\"list-error\"");
    http_reply_free(&r);
    /* a good file again: delta is gone from the console */
    write_list(f, "");
    assert_true(databases_say_within(f, "\"list_error\":null"));
    r = console_get(f->port, "/api/v1/queues?database=delta");
    console_expect(&r, 404, "no database 'delta'");
    http_reply_free(&r);
}

/* ---- one database: --database-url ---- */

static void
test_single_database(void **state)
{
    struct fixture *f = *state;
    const char *options[] = {"--auth-token-file", f->token_file, NULL};
    const char *both[] = {"--databases", f->list_path, "serve", "--database-url", f->urls[0],
                          NULL};
    const char *name = strrchr(f->urls[1], '/') + 1;
    char output[4096], entry[128];
    struct http_reply r;

    f->port = harness_closed_port();
    f->pid = console_start(f->port, f->urls[1], options);
    r = console_get(f->port, "/api/v1/databases");
    snprintf(entry, sizeof(entry), "{\"name\":\"%s\",\"reachable\":true", name);
    console_expect(&r, 200, entry);
    expect_in(r.body, "\"totals\":{\"databases\":1,\"ok\":1,\"failed\":0,\"paused\":0,"
                      "\"ready\":1,\"running\":1,\"dead\":0,\"waiting\":0}");
    http_reply_free(&r);
    r = console_get(f->port, "/api/v1/queues");
    console_expect(&r, 200, "\"queue\":\"billing\"");
    http_reply_free(&r);
    /* no selector without a list */
    r = console_get(f->port, "/");
    console_expect(&r, 200, "data-queue=\"billing\"");
    assert_null(strstr(r.body, "<select name=\"database\""));
    http_reply_free(&r);
    assert_int_equal(fixture_run_outboxctl(both, output, sizeof(output)), 2);
    expect_in(output, "--databases and --database-url exclude each other");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_databases_view, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoints_per_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_action_on_one_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_followed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_single_database, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
