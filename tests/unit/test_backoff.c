/*
 * test_backoff.c - retry delays: exponential, capped, jittered within bounds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "backoff.h"
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

/* The backoff object: doubling steps from initial to max, each delay jittered within its step. */
static void
test_object_doubles_to_max_with_jitter(void **state)
{
    struct backoff b = backoff_make(0.2, 1.0, 42);
    const double steps[] = {0.2, 0.4, 0.8, 1.0, 1.0};

    (void)state;
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        double d = backoff_next(&b);

        assert_true(d >= steps[i] / 2 && d <= steps[i]);
    }
}

static void
test_object_reset_starts_over(void **state)
{
    struct backoff b = backoff_make(0.05, 2.0, 7);

    (void)state;
    for (int i = 0; i < 10; i++)
        backoff_next(&b);
    backoff_reset(&b);
    double d = backoff_next(&b);
    assert_true(d >= 0.025 && d <= 0.05);
}

/* Two backoffs seeded differently do not wait in lockstep. */
static void
test_object_jitter_differs_by_seed(void **state)
{
    struct backoff a = backoff_make(1, 300, 1), b = backoff_make(1, 300, 2);
    int same = 0;

    (void)state;
    for (int i = 0; i < 8; i++)
        same += backoff_next(&a) == backoff_next(&b);
    assert_true(same < 8);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doubles_per_attempt),
        cmocka_unit_test(test_capped),
        cmocka_unit_test(test_jitter_keeps_at_least_half),
        cmocka_unit_test(test_out_of_range_inputs),
        cmocka_unit_test(test_object_doubles_to_max_with_jitter),
        cmocka_unit_test(test_object_reset_starts_over),
        cmocka_unit_test(test_object_jitter_differs_by_seed),
    };

    return cmocka_run_group_tests_name("backoff", tests, NULL, NULL);
}
