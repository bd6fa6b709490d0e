/*
 * test_relay_nats_creds.c - outbox-relay with --nats-creds against a NATS
 * server in operator mode (decentralized JWT auth).
 *
 * The group starts its own nats-server on a free loopback port, trusting
 * the throwaway operator of tests/fixtures/nats (its accounts preloaded
 * in a memory resolver, JetStream on, the store under the stack
 * directory), and stops it on the way out; a test process that dies takes
 * the server with it (PR_SET_PDEATHSIG). Such a server admits only users
 * with a JWT of a known account, so the relay gets in with the fixture's
 * user.creds and with nothing else. Each test has its own database and its
 * own stream "nats-creds-<pid>-<n>" over "<stream>.>", made through a
 * connection with the same credentials (a stream lives in its account).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "nats_consumer.h"
#include "relay_runner.h"

/* Rows the relay publishes in the test with credentials. */
#define ROWS 300

/* The group's operator-mode server. */
struct operator_server {
    pid_t pid;
    char dir[512];     /* its config, store and log */
    char url[64];      /* nats://127.0.0.1:<port> */
    char creds[600];   /* the fixture's user.creds */
    char missing[600]; /* a credentials file that does not exist */
};

static struct operator_server server;

/* A fresh database, a consumer in the fixture's account and a stream name of the test's own. */
#define fixture fixture_nats

/* ---- the server ---------------------------------------------------------------------- */

/* The first line of tests/fixtures/nats/name into out; false when it cannot be read. */
static bool
read_fixture(const char *name, char *out, size_t size)
{
    char path[600];
    FILE *file;
    bool ok;

    snprintf(path, sizeof(path), "%s/tests/fixtures/nats/%s", harness_env("OUTBOX_SOURCE_DIR"),
             name);
    file = fopen(path, "r");
    if (file == NULL)
        return false;
    ok = fgets(out, (int)size, file) != NULL;
    fclose(file);
    out[strcspn(out, "\r\n")] = '\0';
    return ok && out[0] != '\0';
}

/*
 * Writes the server's configuration to dir/server.conf: the fixture's
 * operator, its two accounts in a memory resolver, JetStream with its store
 * in dir. False when a fixture is unreadable.
 */
static bool
write_config(int port)
{
    char path[600], account[64], account_jwt[2048], sys[64], sys_jwt[2048];
    FILE *file;

    if (!read_fixture("account.pub", account, sizeof(account)) ||
        !read_fixture("account.jwt", account_jwt, sizeof(account_jwt)) ||
        !read_fixture("sys.pub", sys, sizeof(sys)) ||
        !read_fixture("sys.jwt", sys_jwt, sizeof(sys_jwt)))
        return false;
    snprintf(path, sizeof(path), "%s/server.conf", server.dir);
    file = fopen(path, "w");
    if (file == NULL)
        return false;
    fprintf(file,
            "listen: \"127.0.0.1:%d\"\n"
            "operator: \"%s/tests/fixtures/nats/operator.jwt\"\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n  %s: \"%s\"\n  %s: \"%s\"\n}\n"
            "jetstream { store_dir: \"%s/store\" }\n",
            port, harness_env("OUTBOX_SOURCE_DIR"), account, account_jwt, sys, sys_jwt,
            server.dir);
    return fclose(file) == 0;
}

static void
server_stop(void)
{
    if (server.pid > 0) {
        kill(server.pid, SIGTERM);
        harness_wait_exit(server.pid, 10000); /* SIGKILL after that */
        server.pid = 0;
    }
}

/* Group setup: the server listens within 10 s, or the group fails with no server left. */
static int
server_start(void **state)
{
    char config[600], log_path[600];
    int port = harness_free_port(); /* the private range: never an ephemeral one */

    (void)state;
    snprintf(server.dir, sizeof(server.dir), "%s/nats-operator-%d",
             harness_env("OUTBOX_TEST_STACK_DIR"), (int)getpid());
    snprintf(server.url, sizeof(server.url), "nats://127.0.0.1:%d", port);
    snprintf(server.creds, sizeof(server.creds), "%s/tests/fixtures/nats/user.creds",
             harness_env("OUTBOX_SOURCE_DIR"));
    snprintf(server.missing, sizeof(server.missing), "%s/missing.creds", server.dir);
    snprintf(config, sizeof(config), "%s/server.conf", server.dir);
    snprintf(log_path, sizeof(log_path), "%s/nats.log", server.dir);
    if (mkdir(server.dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot make %s: %s\n", server.dir, strerror(errno));
        return -1;
    }
    if (!write_config(port)) {
        fprintf(stderr, "cannot write %s from tests/fixtures/nats\n", config);
        return -1;
    }
    fflush(NULL);
    server.pid = fork();
    if (server.pid < 0)
        return -1;
    if (server.pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);

        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that dies leaves no server behind */
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execlp("nats-server", "nats-server", "-c", config, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100 && !fixture_port_open(port); i++)
        usleep(100 * 1000);
    if (!fixture_port_open(port)) {
        server_stop();
        fprintf(stderr, "nats-server in operator mode did not listen on 127.0.0.1:%d (log %s)\n",
                port, log_path);
        return -1;
    }
    return 0;
}

/* Group teardown. */
static int
server_teardown(void **state)
{
    (void)state;
    server_stop();
    return 0;
}

/* ---- each test ----------------------------------------------------------------------- */

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    nats_consumer *nats = nats_consumer_connect_creds(server.url, server.creds);

    assert_non_null(f);
    if (nats == NULL)
        fail_msg("cannot connect to %s with %s (log %s/nats.log)", server.url, server.creds,
                 server.dir);
    fixture_nats_open(f, "nats-creds", nats);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    fixture_nats_close(f);
    free(f);
    return 0;
}

/* Makes the test's stream over every subject of its prefix, in the fixture's account. */
static void
make_stream(struct fixture *f)
{
    char subject[128];

    snprintf(subject, sizeof(subject), "%s>", f->prefix);
    assert_int_equal(nats_consumer_create_stream(
                         f->nats, f->stream,
                         &(struct nats_consumer_stream_options){.subject = subject}),
                     0);
    f->made_stream = true;
}

/*
 * Copies the relay's one error line ("outbox-relay: ...", without the
 * newline) from output into line; fails the test unless there is exactly one.
 */
static void
relay_error_line(const char *output, char *line, size_t size)
{
    const char *first = strstr(output, "outbox-relay: ");

    if (first == NULL || (first != output && first[-1] != '\n'))
        fail_msg("no line of the relay's own error in:\n%s", output);
    if (strstr(first + 1, "\noutbox-relay: ") != NULL)
        fail_msg("more than one error line in:\n%s", output);
    snprintf(line, size, "%.*s", (int)strcspn(first, "\n"), first);
}

static int
compare_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* The stream holds every row of the table once (by Nats-Msg-Id) and nothing else. */
static void
assert_each_row_once(struct fixture *f, long long expected)
{
    struct nats_consumer_message *messages;
    PGresult *rows = PQexec(f->conn, "SELECT job_id FROM outbox.job ORDER BY 1");
    int64_t *ids;
    size_t count;

    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(rows), expected);
    assert_int_equal(nats_consumer_read(f->nats, f->stream, &messages, &count), 0);
    assert_int_equal((long long)count, expected);
    ids = calloc(count + 1, sizeof(*ids));
    assert_non_null(ids);
    for (size_t i = 0; i < count; i++)
        ids[i] = messages[i].job_id;
    qsort(ids, count, sizeof(*ids), compare_id);
    for (size_t i = 0; i < count; i++) {
        if (i > 0 && ids[i] == ids[i - 1])
            fail_msg("job %lld stored twice", (long long)ids[i]);
        if (ids[i] != strtoll(PQgetvalue(rows, (int)i, 0), NULL, 10))
            fail_msg("stream and table differ at job %lld", (long long)ids[i]);
    }
    free(ids);
    nats_consumer_messages_free(messages, count);
    PQclear(rows);
}

/* No row was claimed, marked or charged an attempt, and the stream is empty. */
static void
assert_nothing_touched(struct fixture *f, long long rows)
{
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'ready' AND attempts = 0"),
                     rows);
    assert_int_equal(nats_consumer_stream_count(f->nats, f->stream), 0);
}

/* ---- the tests ----------------------------------------------------------------------- */

/* With the user's credentials file: --check passes, and --once relays every row once. */
static void
test_creds_relay_every_row_once(void **state)
{
    struct fixture *f = *state;
    const char *check[] = {"--check", "--database-url", f->url, "--broker", server.url,
                           "--subject-prefix", f->prefix, "--nats-creds", server.creds, NULL};
    const char *extra[] = {"--subject-prefix", f->prefix, "--nats-creds", server.creds, NULL};
    char output[8192];
    int rc;

    make_stream(f);
    enqueue_rows(f->conn, "orders", ROWS);
    rc = relay_run_capture(check, output, sizeof(output));
    if (rc != 0 || strstr(output, "configuration OK") == NULL)
        fail_msg("--check with --nats-creds exited %d:\n%s", rc, output);

    assert_int_equal(relay_run_once(f->url, server.url, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 1"),
                     ROWS);
    assert_each_row_once(f, ROWS);
}

/*
 * Without credentials the server refuses the login: --check fails with one
 * line naming it, and a relay (--once, then a daemon) stops at start with
 * no row claimed.
 */
static void
test_no_creds_is_refused(void **state)
{
    struct fixture *f = *state;
    const char *check[] = {"--check", "--database-url", f->url, "--broker", server.url,
                           "--subject-prefix", f->prefix, NULL};
    const char *once[] = {"--once", "--subject-prefix", f->prefix, NULL};
    const char *const *daemon = once + 1;
    struct relay_process relay;
    char output[8192], line[1024];
    char *log;

    make_stream(f);
    enqueue_rows(f->conn, "orders", 20);
    assert_int_equal(relay_run_capture(check, output, sizeof(output)), 1);
    relay_error_line(output, line, sizeof(line));
    if (strstr(line, "unable to connect to nats") == NULL ||
        strstr(line, "Authorization Violation") == NULL)
        fail_msg("--check without credentials said: %s", line);

    for (int run = 0; run < 2; run++) {
        relay_start_process(&relay, f->url, server.url, run == 0 ? once : daemon);
        assert_int_equal(relay_wait(&relay, 60000), 1);
        log = fixture_read_file(relay.log_path);
        if (strstr(log, "Authorization Violation") == NULL) {
            relay_dump_log(&relay);
            fail_msg("the log of a relay without credentials names no refused login");
        }
        free(log);
        unlink(relay.log_path);
    }
    assert_nothing_touched(f, 20);
}

/* A credentials file that does not exist is a configuration error naming it, exit 2. */
static void
test_missing_creds_file_is_a_config_error(void **state)
{
    struct fixture *f = *state;
    const char *check[] = {"--check", "--database-url", f->url, "--broker", server.url,
                           "--subject-prefix", f->prefix, "--nats-creds", server.missing, NULL};
    const char *extra[] = {"--subject-prefix", f->prefix, "--nats-creds", server.missing, NULL};
    char output[8192], line[1024], expected[1024];

    make_stream(f);
    enqueue_rows(f->conn, "orders", 20);
    unlink(server.missing);
    snprintf(expected, sizeof(expected),
             "outbox-relay: --nats-creds: unable to read '%s': No such file or directory",
             server.missing);

    assert_int_equal(relay_run_capture(check, output, sizeof(output)), 2);
    relay_error_line(output, line, sizeof(line));
    assert_string_equal(line, expected);
    assert_int_equal(relay_run_once(f->url, server.url, extra), 2);
    assert_nothing_touched(f, 20);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_creds_relay_every_row_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_creds_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_creds_file_is_a_config_error, setup,
                                        teardown),
    };

    return cmocka_run_group_tests_name("relay_nats_creds", tests, server_start, server_teardown);
}
