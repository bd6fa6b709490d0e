/*
 * test_clock.c - the monotonic clock and durations for client library timeouts.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "clock.h"

static void
test_timeval_from_ms(void **state)
{
    struct timeval tv = timeval_from_ms(10250);

    (void)state;
    assert_int_equal(tv.tv_sec, 10);
    assert_int_equal(tv.tv_usec, 250000);
    tv = timeval_from_ms(999);
    assert_int_equal(tv.tv_sec, 0);
    assert_int_equal(tv.tv_usec, 999000);
}

/* A negative duration (a deadline already past) is no wait, never a negative timeval. */
static void
test_timeval_from_negative_ms_is_zero(void **state)
{
    struct timeval tv = timeval_from_ms(-1500);

    (void)state;
    assert_int_equal(tv.tv_sec, 0);
    assert_int_equal(tv.tv_usec, 0);
}

static void
test_monotonic_never_goes_back(void **state)
{
    int64_t last = clock_monotonic_ms();

    (void)state;
    for (int i = 0; i < 1000; i++) {
        int64_t now = clock_monotonic_ms();

        assert_true(now >= last);
        last = now;
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeval_from_ms),
        cmocka_unit_test(test_timeval_from_negative_ms_is_zero),
        cmocka_unit_test(test_monotonic_never_goes_back),
    };

    return cmocka_run_group_tests_name("clock", tests, NULL, NULL);
}
