/*
 * test_parse.c - durations and bounded integers from command-line text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "parse.h"

static int64_t
duration_ok(const char *text)
{
    struct outbox_error err;
    int64_t seconds = -1;

    outbox_error_clear(&err);
    assert_int_equal(parse_duration(text, &seconds, &err), 0);
    assert_int_equal(err.code, OUTBOX_OK);
    return seconds;
}

/* Fails and names the text in the message. */
static void
duration_bad(const char *text)
{
    struct outbox_error err;
    int64_t seconds = 12345;

    assert_int_equal(parse_duration(text, &seconds, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_non_null(strstr(err.message, "duration"));
    assert_non_null(strstr(err.message, text));
    assert_int_equal(seconds, 12345); /* untouched on failure */
}

static void
test_duration_units(void **state)
{
    (void)state;
    assert_int_equal(duration_ok("90s"), 90);
    assert_int_equal(duration_ok("15m"), 900);
    assert_int_equal(duration_ok("24h"), 86400);
    assert_int_equal(duration_ok("7d"), 604800);
    assert_int_equal(duration_ok("0s"), 0);
    assert_int_equal(duration_ok("1h30m"), 5400);
    assert_int_equal(duration_ok("1d2h3m4s"), 86400 + 7200 + 180 + 4);
    assert_int_equal(duration_ok("007m"), 420);
}

/*
 * A bare 0 is a duration: the help and the operating guide write
 * "--retention 0" (keep succeeded rows) and "purge --older-than 0"; other
 * unitless numbers stay refused.
 */
static void
test_duration_bare_zero(void **state)
{
    struct outbox_error err;
    int64_t ms = 1;

    (void)state;
    assert_int_equal(duration_ok("0"), 0);
    assert_int_equal(parse_duration_ms("0", &ms, &err), 0);
    assert_int_equal(ms, 0);
    duration_bad("00");
    duration_bad("01");
    duration_bad("0 ");
}

static void
test_duration_rejects_bad_syntax(void **state)
{
    (void)state;
    duration_bad("");
    duration_bad("90");   /* no unit */
    duration_bad("s");    /* no number */
    duration_bad("5x");   /* unknown unit */
    duration_bad("-5m");  /* negative */
    duration_bad("+5m");  /* sign */
    duration_bad(" 5m");  /* leading space */
    duration_bad("5m ");  /* trailing space */
    duration_bad("5mm");  /* trailing junk */
    duration_bad("5 m");  /* space inside */
    duration_bad("1.5h"); /* fraction */
    duration_bad("5M");   /* units are lowercase */
}

static void
test_duration_limits(void **state)
{
    (void)state;
    assert_int_equal(duration_ok("36500d"), PARSE_DURATION_MAX_SECONDS);
    duration_bad("36501d");
    duration_bad("36500d1s");
    duration_bad("99999999999999999999999s"); /* would overflow int64 */
    duration_bad("9223372036854775807d");
}

static void
test_integer_valid(void **state)
{
    struct outbox_error err;
    int64_t value = 0;

    (void)state;
    assert_int_equal(parse_integer("1", 1, 10, &value, &err), 0);
    assert_int_equal(value, 1);
    assert_int_equal(parse_integer("10", 1, 10, &value, &err), 0);
    assert_int_equal(value, 10);
    assert_int_equal(parse_integer("0", 0, 5, &value, &err), 0);
    assert_int_equal(value, 0);
    assert_int_equal(parse_integer("9223372036854775807", 1, INT64_MAX, &value, &err), 0);
    assert_true(value == INT64_MAX);
}

/* Fails with OUTBOX_ERR_INVALID and leaves value alone. */
static void
integer_bad(const char *text, int64_t min, int64_t max)
{
    struct outbox_error err;
    int64_t value = 777;

    assert_int_equal(parse_integer(text, min, max, &value, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    assert_non_null(strstr(err.message, text));
    assert_int_equal(value, 777);
}

static void
test_integer_invalid(void **state)
{
    (void)state;
    integer_bad("", 1, 10);
    integer_bad("x", 1, 10);
    integer_bad("-1", 0, 10);
    integer_bad("+1", 0, 10);
    integer_bad("1x", 1, 10);
    integer_bad(" 1", 1, 10);
    integer_bad("1 ", 1, 10);
    integer_bad("0x10", 0, 100);
    integer_bad("1e3", 0, 10000);
    integer_bad("0", 1, 10);  /* below min */
    integer_bad("11", 1, 10); /* above max */
    integer_bad("9223372036854775808", 1, INT64_MAX);
    integer_bad("99999999999999999999999999", 1, INT64_MAX);
}

static void
test_duration_milliseconds(void **state)
{
    struct outbox_error err;
    int64_t ms = 0;

    (void)state;
    assert_int_equal(parse_duration_ms("250ms", &ms, &err), 0);
    assert_int_equal(ms, 250);
    assert_int_equal(parse_duration_ms("1s500ms", &ms, &err), 0);
    assert_int_equal(ms, 1500);
    assert_int_equal(parse_duration_ms("2m", &ms, &err), 0);
    assert_int_equal(ms, 120000);
    assert_int_equal(parse_duration_ms("5", &ms, &err), -1);
    assert_int_equal(parse_duration_ms("5mss", &ms, &err), -1);
    assert_int_equal(parse_duration_ms("-5ms", &ms, &err), -1);
    assert_int_equal(parse_duration_ms("36501d", &ms, &err), -1);
    assert_non_null(strstr(err.message, "too long"));
}

/* Regressions found by tests/fuzz/fuzz_parse.c: messages stay on one line. */
static void
test_messages_one_line(void **state)
{
    struct outbox_error err;
    int64_t value;

    (void)state;
    assert_int_equal(parse_duration_ms("1\n2s", &value, &err), -1);
    assert_null(strpbrk(err.message, "\r\n"));
    assert_non_null(strstr(err.message, "'1?2s'"));
    assert_int_equal(parse_duration_ms("99999999d\r", &value, &err), -1);
    assert_null(strpbrk(err.message, "\r\n"));
    assert_int_equal(parse_integer("12\n", 0, 100, &value, &err), -1);
    assert_null(strpbrk(err.message, "\r\n"));
    assert_int_equal(parse_integer(NULL, 0, 100, &value, &err), -1);
    assert_string_equal(err.message, "invalid number ''");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_milliseconds),
        cmocka_unit_test(test_duration_units),  cmocka_unit_test(test_duration_bare_zero),
        cmocka_unit_test(test_duration_rejects_bad_syntax),
        cmocka_unit_test(test_duration_limits), cmocka_unit_test(test_integer_valid),
        cmocka_unit_test(test_integer_invalid), cmocka_unit_test(test_messages_one_line),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
