/*
 * test_wait.c - the relay's wait: ends at the deadline, when its descriptor
 * is readable, or at once when the stop latch is set, from another thread too.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <unistd.h>

#include "clock.h"
#include "wait.h"

static void
test_deadline_passes(void **state)
{
    struct wait_latch stop;
    struct outbox_error err;
    double started;

    (void)state;
    assert_int_equal(wait_latch_open(&stop, &err), 0);
    started = clock_monotonic_seconds();
    assert_int_equal(wait_ms(&stop, -1, 30), WAIT_TIMEOUT);
    /* never early */
    assert_true(clock_monotonic_seconds() - started >= 0.030);
    assert_false(wait_latch_is_set(&stop));
    wait_latch_close(&stop);
}

static void
test_readable_fd_ends_the_wait(void **state)
{
    struct wait_latch stop;
    struct outbox_error err;
    int fds[2];

    (void)state;
    assert_int_equal(wait_latch_open(&stop, &err), 0);
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(write(fds[1], "x", 1), 1);
    assert_int_equal(wait_until(&stop, fds[0], WAIT_FOREVER), WAIT_READY);
    close(fds[0]);
    close(fds[1]);
    wait_latch_close(&stop);
}

static void *
set_later(void *arg)
{
    usleep(20 * 1000);
    wait_latch_set(arg);
    return NULL;
}

/* A wait without deadline ends when another thread sets the latch, and every later wait at once. */
static void
test_stop_from_another_thread(void **state)
{
    struct wait_latch stop;
    struct outbox_error err;
    pthread_t thread;
    int fds[2];

    (void)state;
    assert_int_equal(wait_latch_open(&stop, &err), 0);
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(pthread_create(&thread, NULL, set_later, &stop), 0);
    assert_int_equal(wait_until(&stop, fds[0], WAIT_FOREVER), WAIT_STOPPED);
    pthread_join(thread, NULL);
    assert_true(wait_latch_is_set(&stop));
    wait_latch_set(&stop); /* twice is harmless */
    assert_int_equal(wait_ms(&stop, -1, 60 * 1000), WAIT_STOPPED);
    /* the stop wins over a readable descriptor */
    assert_int_equal(write(fds[1], "x", 1), 1);
    assert_int_equal(wait_until(&stop, fds[0], WAIT_FOREVER), WAIT_STOPPED);
    close(fds[0]);
    close(fds[1]);
    wait_latch_close(&stop);
    wait_latch_close(&stop); /* closed twice: a no-op */
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline_passes),
        cmocka_unit_test(test_readable_fd_ends_the_wait),
        cmocka_unit_test(test_stop_from_another_thread),
    };

    return cmocka_run_group_tests_name("wait", tests, NULL, NULL);
}
