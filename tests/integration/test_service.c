/*
 * test_service.c - the relay as a systemd Type=notify service: READY=1 once
 * its pipelines run, WATCHDOG=1 while its loop turns, STOPPING=1 at SIGTERM,
 * all sent to the datagram socket named by $NOTIFY_SOCKET.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"

static long long
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits up to timeout_ms for a datagram equal to expected; counts others in *others. */
static bool
wait_for_state(int fd, const char *expected, int timeout_ms, int *others)
{
    long long deadline = now_ms() + timeout_ms;

    while (now_ms() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char buffer[256];
        ssize_t n;

        if (poll(&p, 1, (int)(deadline - now_ms())) <= 0)
            continue;
        n = recv(fd, buffer, sizeof(buffer) - 1, 0);
        if (n <= 0)
            continue;
        buffer[n] = '\0';
        if (strcmp(buffer, expected) == 0)
            return true;
        if (others != NULL)
            (*others)++;
    }
    return false;
}

static void
test_notifies_ready_watchdog_and_stopping(void **state)
{
    char *url = harness_database_new();
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char socket_path[108], prefix[64];
    const char *extra[] = {"--stream-prefix", prefix, NULL};
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    struct relay_process relay;
    int fd, watchdogs = 0, others = 0;
    long long started;

    (void)state;
    snprintf(prefix, sizeof(prefix), "service-%d:", (int)getpid());
    snprintf(socket_path, sizeof(socket_path), "/tmp/outbox-service-test.%d.sock", (int)getpid());
    unlink(socket_path);
    fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    snprintf(address.sun_path, sizeof(address.sun_path), "%s", socket_path);
    assert_int_equal(bind(fd, (struct sockaddr *)&address, sizeof(address)), 0);

    /* the child inherits these; a 2 s watchdog is fed every 0.5 s */
    setenv("NOTIFY_SOCKET", socket_path, 1);
    setenv("WATCHDOG_USEC", "2000000", 1);
    relay_start_process(&relay, url, broker, extra);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");

    if (!wait_for_state(fd, "READY=1", 30000, &others)) {
        relay_dump_log(&relay);
        fail_msg("no READY=1 within 30 s");
    }
    started = now_ms();
    while (now_ms() - started < 3000)
        if (wait_for_state(fd, "WATCHDOG=1", 1000, NULL))
            watchdogs++;
    if (watchdogs < 3) {
        relay_dump_log(&relay);
        fail_msg("%d WATCHDOG=1 in 3 s of a 2 s watchdog; expected at least 3", watchdogs);
    }

    relay_signal(&relay, SIGTERM);
    assert_true(wait_for_state(fd, "STOPPING=1", 10000, NULL));
    assert_int_equal(relay_wait(&relay, 30000), 0);
    assert_int_equal(others, 0); /* nothing before READY=1 */

    close(fd);
    unlink(socket_path);
    harness_database_drop(url);
}

/* Without a service manager nothing is sent and nothing fails: the relay runs by hand. */
static void
test_runs_without_a_service_manager(void **state)
{
    char *url = harness_database_new();
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    char prefix[64];
    const char *extra[] = {"--stream-prefix", prefix, NULL};

    (void)state;
    snprintf(prefix, sizeof(prefix), "service-%d:", (int)getpid());
    unsetenv("NOTIFY_SOCKET");
    setenv("WATCHDOG_USEC", "2000000", 1); /* a watchdog without a socket is ignored */
    assert_int_equal(relay_run_once(url, broker, extra), 0);
    unsetenv("WATCHDOG_USEC");
    harness_database_drop(url);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_notifies_ready_watchdog_and_stopping),
        cmocka_unit_test(test_runs_without_a_service_manager),
    };

    return cmocka_run_group_tests_name("service", tests, NULL, NULL);
}
