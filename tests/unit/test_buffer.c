/*
 * test_buffer.c - the growable buffer: appends, formatting, growth, clearing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "buffer.h"

static void
test_appends_and_terminates(void **state)
{
    struct buffer b = {0};

    (void)state;
    buffer_puts(&b, "claim");
    buffer_putc(&b, ' ');
    buffer_append(&b, "rows!", 4);
    buffer_printf(&b, " %d/%s", 42, "s");
    assert_false(b.failed);
    assert_string_equal(b.data, "claim rows 42/s");
    assert_int_equal(b.len, strlen("claim rows 42/s"));
    buffer_clear(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    buffer_clear(&b); /* twice is fine */
}

static void
test_grows_past_any_first_size(void **state)
{
    struct buffer b = {0};
    char big[10000];

    (void)state;
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    for (int i = 0; i < 30; i++)
        buffer_puts(&b, big);
    buffer_printf(&b, "%s|", big); /* longer than any fixed scratch buffer */
    assert_false(b.failed);
    assert_int_equal(b.len, 31 * (sizeof(big) - 1) + 1);
    assert_int_equal(b.data[b.len - 1], '|');
    assert_int_equal(b.data[b.len], '\0');
    buffer_clear(&b);
}

static void
test_failed_stays_failed(void **state)
{
    struct buffer b = {0};

    (void)state;
    b.failed = true;
    buffer_puts(&b, "ignored");
    buffer_printf(&b, "%d", 1);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends_and_terminates),
        cmocka_unit_test(test_grows_past_any_first_size),
        cmocka_unit_test(test_failed_stays_failed),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
