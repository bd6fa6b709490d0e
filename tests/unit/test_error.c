/*
 * test_error.c - the error codes (src/error.c): what is worth a retry, and quoting.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "error.h"

/*
 * An error without SQLSTATE is a connection error only when the connection
 * is gone; on a good connection libpq refused the call itself (pipeline
 * mode, a command in progress), which no retry cures.
 */
static void
test_no_sqlstate_is_classified_by_the_connection(void **state)
{
    struct outbox_error err = {.code = OUTBOX_OK};

    (void)state;
    assert_int_equal(outbox_error_code_for_sqlstate(NULL, false), OUTBOX_ERR_CONNECTION);
    assert_int_equal(outbox_error_code_for_sqlstate(NULL, true), OUTBOX_ERR_STATE);
    assert_int_equal(outbox_error_code_for_sqlstate("", true), OUTBOX_ERR_STATE);
    assert_int_equal(outbox_error_code_for_sqlstate("08006", true), OUTBOX_ERR_CONNECTION);
    assert_int_equal(outbox_error_code_for_sqlstate("55P03", true), OUTBOX_ERR_BUSY);
    err.code = outbox_error_code_for_sqlstate(NULL, true);
    assert_false(outbox_error_is_transient(&err));
    err.code = outbox_error_code_for_sqlstate(NULL, false);
    assert_true(outbox_error_is_transient(&err));
    assert_false(outbox_error_is_transient(NULL));
}

/* Quoting keeps a message one line of printable characters. */
static void
test_quote_replaces_control_characters(void **state)
{
    char out[16];

    (void)state;
    assert_string_equal(outbox_error_quote(out, sizeof(out), "a\nb\r\x1b[1m\x7f"), "a?b??[1m?");
    assert_string_equal(outbox_error_quote(out, 4, "abcdef"), "abc");
    assert_string_equal(outbox_error_quote(out, sizeof(out), NULL), "");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_sqlstate_is_classified_by_the_connection),
        cmocka_unit_test(test_quote_replaces_control_characters),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
