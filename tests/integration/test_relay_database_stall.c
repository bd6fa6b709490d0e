/*
 * test_relay_database_stall.c - a database that stops answering.
 *
 * The relay's PostgreSQL backends are stopped with SIGSTOP: the server
 * accepts new connections, but the relay's sessions never answer again, and
 * their kernel still acknowledges every byte, so no TCP timeout notices.
 * The relay must say so in its log within 15 s, drop those connections and
 * make new ones, and once the old backends go on (SIGCONT) every row must
 * end succeeded: rows caught in a stalled claim come back after their lease.
 * Every wait is bounded, and the backends are let go on every exit path.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define MAX_BACKENDS 16
/* How long the backends stay stopped. */
#define STALL_SECONDS 20

struct fixture {
    char *url;
    PGconn *conn;
    char prefix[64];
    int stopped[MAX_BACKENDS];
    int stopped_count;
};

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    snprintf(f->prefix, sizeof(f->prefix), "stall-test-%d:", (int)getpid());
    *state = f;
    return 0;
}

/* Lets every stopped backend go on; safe to call twice. */
static void
resume_backends(struct fixture *f)
{
    for (int i = 0; i < f->stopped_count; i++)
        kill(f->stopped[i], SIGCONT);
    f->stopped_count = 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));

    resume_backends(f);
    if (redis != NULL) {
        stream_consumer_delete_prefix(redis, f->prefix);
        redisFree(redis);
    }
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

static double
seconds_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads the relay's log into text (size bytes). */
static void
read_log(const struct relay_process *relay, char *text, size_t size)
{
    FILE *log = fopen(relay->log_path, "r");
    size_t len = 0;

    if (log != NULL) {
        len = fread(text, 1, size - 1, log);
        fclose(log);
    }
    text[len] = '\0';
}

/* Waits up to timeout_s for the log to hold needle after offset; its position, or -1. */
static long
wait_for_log(const struct relay_process *relay, const char *needle, size_t offset,
             double timeout_s)
{
    static char text[256 * 1024];
    double until = seconds_now() + timeout_s;

    do {
        const char *found;

        read_log(relay, text, sizeof(text));
        found = strlen(text) > offset ? strstr(text + offset, needle) : NULL;
        if (found != NULL)
            return found - text;
        usleep(100 * 1000);
    } while (seconds_now() < until);
    return -1;
}

static void
test_stalled_backends_are_dropped_and_replaced(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--stream-prefix", f->prefix, "--concurrency", "2", "--lease", "5",
                           NULL};
    struct relay_process relay;
    PGresult *result;
    double stopped_at, noticed_after;
    long noticed, reconnected;

    enqueue_rows(f->conn, "stall", 50);
    relay_start_process(&relay, f->url, harness_env("OUTBOX_TEST_REDIS_URL"), extra);
    if (wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 50,
                       30000) != 50) {
        relay_dump_log(&relay);
        fail_msg("the relay did not publish the first rows");
    }

    /* every session the relay has open in this database */
    result = PQexec(f->conn, "SELECT pid FROM pg_stat_activity"
                             " WHERE datname = current_database()"
                             "   AND application_name = 'outbox-relay'");
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    assert_true(PQntuples(result) >= 1);
    for (int i = 0; i < PQntuples(result) && i < MAX_BACKENDS; i++) {
        f->stopped[f->stopped_count] = atoi(PQgetvalue(result, i, 0));
        assert_int_equal(kill(f->stopped[f->stopped_count], SIGSTOP), 0);
        f->stopped_count++;
    }
    PQclear(result);
    stopped_at = seconds_now();
    enqueue_rows(f->conn, "stall", 50);

    noticed = wait_for_log(&relay, "did not answer within", 0, 20);
    noticed_after = seconds_now() - stopped_at;
    if (noticed < 0 || noticed_after > 15) {
        relay_dump_log(&relay);
        fail_msg("the stalled database was not reported within 15 s (%s after %.1f s)",
                 noticed < 0 ? "not at all" : "only", noticed_after);
    }
    reconnected = wait_for_log(&relay, "database connected", (size_t)noticed, 15);
    if (reconnected < 0) {
        relay_dump_log(&relay);
        fail_msg("the relay did not connect again after dropping the stalled connection");
    }

    /* the stall lasts its full time; the relay keeps working meanwhile */
    while (seconds_now() - stopped_at < STALL_SECONDS)
        usleep(200 * 1000);
    resume_backends(f);

    if (wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 100,
                       60000) != 100) {
        relay_dump_log(&relay);
        fail_msg("not every row succeeded after the stall");
    }
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 20000), 0);
    unlink(relay.log_path);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state <> 'succeeded'"),
                     0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stalled_backends_are_dropped_and_replaced, setup,
                                        teardown),
    };

    return cmocka_run_group_tests_name("relay database stall", tests, NULL, NULL);
}
