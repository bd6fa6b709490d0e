/*
 * test_notify.c - sd_notify datagrams reach a socket named by $NOTIFY_SOCKET;
 * the watchdog interval is read only when it is this process's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"

/* A datagram socket bound to path (abstract when path starts with '@'). */
static int
listen_datagrams(const char *path)
{
    struct sockaddr_un address;
    size_t length = strlen(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);

    assert_true(fd >= 0);
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    memcpy(address.sun_path, path, length);
    if (path[0] == '@')
        address.sun_path[0] = '\0';
    assert_int_equal(bind(fd, (struct sockaddr *)&address,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + length)),
                     0);
    return fd;
}

static void
receive_exactly(int fd, const char *expected)
{
    char buffer[64];
    ssize_t n = recv(fd, buffer, sizeof(buffer) - 1, MSG_DONTWAIT);

    assert_true(n > 0);
    buffer[n] = '\0';
    assert_string_equal(buffer, expected);
}

static void
test_sends_to_a_path_socket(void **state)
{
    char path[64];
    struct outbox_error err;
    int fd;

    (void)state;
    snprintf(path, sizeof(path), "/tmp/outbox-notify-test.%d", (int)getpid());
    unlink(path);
    fd = listen_datagrams(path);
    setenv("NOTIFY_SOCKET", path, 1);
    assert_int_equal(notify_send("READY=1", &err), 0);
    receive_exactly(fd, "READY=1");
    assert_int_equal(notify_send("STOPPING=1", &err), 0);
    receive_exactly(fd, "STOPPING=1");
    unsetenv("NOTIFY_SOCKET");
    close(fd);
    unlink(path);
}

static void
test_sends_to_an_abstract_socket(void **state)
{
    char name[64];
    struct outbox_error err;
    int fd;

    (void)state;
    snprintf(name, sizeof(name), "@outbox-notify-test.%d", (int)getpid());
    fd = listen_datagrams(name);
    setenv("NOTIFY_SOCKET", name, 1);
    assert_int_equal(notify_send("WATCHDOG=1", &err), 0);
    receive_exactly(fd, "WATCHDOG=1");
    unsetenv("NOTIFY_SOCKET");
    close(fd);
}

static void
test_without_a_manager_does_nothing(void **state)
{
    struct outbox_error err;

    (void)state;
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(notify_send("READY=1", &err), 0);
}

static void
test_bad_or_missing_socket_is_an_error(void **state)
{
    struct outbox_error err;

    (void)state;
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    assert_int_equal(notify_send("READY=1", &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    setenv("NOTIFY_SOCKET", "/nonexistent/outbox-notify.sock", 1);
    assert_int_equal(notify_send("READY=1", &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONNECTION);
    unsetenv("NOTIFY_SOCKET");
}

static void
test_watchdog_interval(void **state)
{
    char pid[32];

    (void)state;
    unsetenv("WATCHDOG_PID");
    unsetenv("WATCHDOG_USEC");
    assert_int_equal(notify_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "30000000", 1);
    assert_int_equal(notify_watchdog_usec(), 30000000);
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(notify_watchdog_usec(), 30000000);
    /* another process's watchdog is not ours */
    snprintf(pid, sizeof(pid), "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(notify_watchdog_usec(), 0);
    unsetenv("WATCHDOG_PID");
    setenv("WATCHDOG_USEC", "soon", 1);
    assert_int_equal(notify_watchdog_usec(), 0);
    unsetenv("WATCHDOG_USEC");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sends_to_a_path_socket),
        cmocka_unit_test(test_sends_to_an_abstract_socket),
        cmocka_unit_test(test_without_a_manager_does_nothing),
        cmocka_unit_test(test_bad_or_missing_socket_is_an_error),
        cmocka_unit_test(test_watchdog_interval),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
