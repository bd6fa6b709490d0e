/*
 * test_stream_admin.c - `outboxctl stream enable|disable` beside open transactions.
 *
 * Making a queue a stream creates a trigger on outbox.job, giving it back
 * drops it: both need a lock that an open producer (or reader) transaction
 * holds off. What a user relies on: while the command waits, producers of
 * every queue go on; the command says which session it waits for, gives up
 * after --lock-wait with that session named, and works once the session is
 * gone.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"

struct fixture {
    char *url;
    PGconn *conn;
    PGconn *holder; /* the session with an open transaction */
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->holder = harness_connect(f->url);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    PQfinish(f->holder);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

static double
now_seconds(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Starts outboxctl with args (after --database-url) in the background; its output goes to log. */
static pid_t
start_outboxctl(const struct fixture *f, const char *const *args, const char *log)
{
    const char *argv[16];
    char program[512];
    int n = 0;

    snprintf(program, sizeof(program), "%s/outboxctl", harness_env("OUTBOX_BIN"));
    argv[n++] = program;
    argv[n++] = "--database-url";
    argv[n++] = f->url;
    for (; *args != NULL && n < 15; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    unlink(log);
    return harness_spawn(argv, log);
}

/*
 * While outboxctl waits, an insert into another queue from a third session,
 * under a 2 s statement_timeout, goes in at once; the seconds it took.
 */
static double
unrelated_insert_seconds(const struct fixture *f)
{
    PGconn *producer = harness_connect(f->url);
    double start;

    harness_exec(producer, "SET statement_timeout = '2s'");
    start = now_seconds();
    harness_exec(producer, "SELECT outbox.enqueue('unrelated', '{}')");
    start = now_seconds() - start;
    PQfinish(producer);
    return start;
}

/*
 * Runs `stream SUBCOMMAND ev --lock-wait 3s` while holder's transaction is
 * open: producers go on meanwhile (each insert waits at most one short try
 * of the lock), and it fails after about 3 s naming the holder's pid.
 */
static void
expect_waits_and_names_holder(struct fixture *f, const char *subcommand)
{
    const char *args[] = {"stream", subcommand, "ev", "--lock-wait", "3s", NULL};
    char *log = harness_log_path("test_stream_admin_outboxctl");
    char pid_text[32];
    double start = now_seconds(), took;
    pid_t pid;
    char *out;
    int status;

    snprintf(pid_text, sizeof(pid_text), "pid %d", PQbackendPID(f->holder));
    pid = start_outboxctl(f, args, log);
    usleep(700 * 1000);
    for (int i = 0; i < 3; i++) {
        double insert = unrelated_insert_seconds(f);

        print_message("insert beside 'stream %s': %.0f ms\n", subcommand, insert * 1e3);
        assert_true(insert < 1.0);
        usleep(300 * 1000);
    }
    status = harness_wait_exit(pid, 20000);
    took = now_seconds() - start;
    out = fixture_read_file(log);
    print_message("outboxctl stream %s gave up after %.1f s: %s", subcommand, took, out);
    assert_int_equal(status, 1);
    assert_true(took >= 2.5 && took < 10);
    if (strstr(out, pid_text) == NULL)
        fail_msg("the output does not name the holder (%s): %s", pid_text, out);
    assert_non_null(strstr(out, "outbox.job"));
    free(out);
    free(log);
}

/*
 * An open producer transaction holds off `stream enable`, not every
 * producer behind it; enable works once that transaction ends.
 */
static void
test_enable_beside_an_open_producer_transaction(void **state)
{
    struct fixture *f = *state;
    const char *args[] = {"stream", "enable", "ev", "--lock-wait", "10s", NULL};
    char *log = harness_log_path("test_stream_admin_outboxctl");
    pid_t pid;

    harness_exec(f->holder, "BEGIN; SELECT outbox.enqueue('orders', '{}')");
    expect_waits_and_names_holder(f, "enable");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.stream"), 0);

    /* the holder commits while the command waits: it goes on and succeeds */
    pid = start_outboxctl(f, args, log);
    usleep(1500 * 1000);
    harness_exec(f->holder, "COMMIT");
    assert_int_equal(harness_wait_exit(pid, 20000), 0);
    free(fixture_read_file(log));
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.stream"), 1);
    harness_exec(f->conn, "SELECT outbox.enqueue('ev', '{}')");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev' AND state = 'stream'"),
                     1);
    free(log);
}

/* `stream disable` waits the same way, beside a transaction that read outbox.job. */
static void
test_disable_beside_an_open_reader_transaction(void **state)
{
    struct fixture *f = *state;

    harness_exec(f->conn, "SELECT outbox.stream_enable('ev', 2)");
    harness_exec(f->holder, "BEGIN; SELECT count(*) FROM outbox.job");
    expect_waits_and_names_holder(f, "disable");
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.stream"), 1);
    harness_exec(f->holder, "COMMIT");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_enable_beside_an_open_producer_transaction, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_disable_beside_an_open_reader_transaction, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
