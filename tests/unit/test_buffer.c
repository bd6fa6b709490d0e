/*
 * test_buffer.c - the growable buffer: appends, formatting, growth, clearing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdlib.h>
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

/* array_grow: room for every item appended, the items kept across reallocations. */
static void
test_array_grows_and_keeps_items(void **state)
{
    long *items = NULL;
    size_t count = 0, capacity = 0;

    (void)state;
    for (long i = 0; i < 1000; i++) {
        long *grown = array_grow(items, &capacity, count, sizeof(*items));

        assert_non_null(grown);
        items = grown;
        assert_true(capacity > count);
        items[count++] = i;
    }
    for (size_t i = 0; i < count; i++)
        assert_int_equal(items[i], (long)i);
    /* with room left the array is not moved */
    if (count < capacity)
        assert_ptr_equal(array_grow(items, &capacity, count, sizeof(*items)), items);
    free(items);
}

/* A size whose doubling would overflow is refused, the array and capacity untouched. */
static void
test_array_refuses_overflow(void **state)
{
    char one[1];
    size_t capacity = 1;

    (void)state;
    assert_null(array_grow(one, &capacity, 1, SIZE_MAX / 2 + 1));
    assert_int_equal(capacity, 1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends_and_terminates),
        cmocka_unit_test(test_grows_past_any_first_size),
        cmocka_unit_test(test_failed_stays_failed),
        cmocka_unit_test(test_array_grows_and_keeps_items),
        cmocka_unit_test(test_array_refuses_overflow),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
