/*
 * test_backoff.c - retry delays: exponential, capped, jittered within bounds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "outbox.h"

static void
test_doubles_per_attempt(void **state)
{
    (void)state;
    /* random 0.999999 is (almost) no jitter: the full delay */
    assert_float_equal(outbox_backoff_seconds(1, 1, 300, 0.999999), 1.0, 0.001);
    assert_float_equal(outbox_backoff_seconds(2, 1, 300, 0.999999), 2.0, 0.001);
    assert_float_equal(outbox_backoff_seconds(5, 1, 300, 0.999999), 16.0, 0.001);
}

static void
test_capped(void **state)
{
    (void)state;
    assert_float_equal(outbox_backoff_seconds(30, 1, 300, 0.999999), 300.0, 0.001);
    /* a huge attempt count neither overflows nor loops long */
    assert_float_equal(outbox_backoff_seconds(2000000000, 1, 300, 0.999999), 300.0, 0.001);
}

static void
test_jitter_keeps_at_least_half(void **state)
{
    (void)state;
    assert_float_equal(outbox_backoff_seconds(3, 1, 300, 0.0), 2.0, 0.001);
    assert_float_equal(outbox_backoff_seconds(3, 1, 300, 0.5), 3.0, 0.001);
    for (double r = 0; r < 1; r += 0.01) {
        double d = outbox_backoff_seconds(4, 0.5, 300, r);

        assert_true(d >= 2.0 && d <= 4.0);
    }
}

static void
test_out_of_range_inputs(void **state)
{
    (void)state;
    /* attempt 0 or negative counts as the first; random outside [0,1) is clamped */
    assert_float_equal(outbox_backoff_seconds(0, 1, 300, 0.0), 0.5, 0.001);
    assert_float_equal(outbox_backoff_seconds(-5, 1, 300, -3.0), 0.5, 0.001);
    assert_true(outbox_backoff_seconds(1, 1, 300, 7.0) <= 1.0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doubles_per_attempt),
        cmocka_unit_test(test_capped),
        cmocka_unit_test(test_jitter_keeps_at_least_half),
        cmocka_unit_test(test_out_of_range_inputs),
    };

    return cmocka_run_group_tests_name("backoff", tests, NULL, NULL);
}
