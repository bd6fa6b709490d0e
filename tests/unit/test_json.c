/*
 * test_json.c - decoding header objects of string values and writing JSON
 * strings (common/json.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"

/* Parses text (NUL-terminated) and returns the result code. */
static int
parse(const char *text, struct json_string_object *object, struct outbox_error *err)
{
    return json_parse_string_object(text, strlen(text), object, err);
}

/* Asserts that text is refused as invalid and that the message mentions fragment. */
static void
assert_refused(const char *text, const char *fragment)
{
    struct json_string_object object;
    struct outbox_error err = {0};

    assert_int_equal(parse(text, &object, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_INVALID);
    if (strstr(err.message, fragment) == NULL)
        fail_msg("message '%s' for '%s' lacks '%s'", err.message, text, fragment);
    assert_null(object.members);
    assert_int_equal(object.count, 0);
}

static void
test_empty_object(void **state)
{
    struct json_string_object object;
    struct outbox_error err = {0};

    (void)state;
    assert_int_equal(parse("{}", &object, &err), 0);
    assert_int_equal(object.count, 0);
    json_string_object_clear(&object);
    assert_int_equal(parse("  \n{ \t }\r\n", &object, &err), 0);
    assert_int_equal(object.count, 0);
    json_string_object_clear(&object);
}

static void
test_members_in_order(void **state)
{
    struct json_string_object object;
    struct outbox_error err = {0};

    (void)state;
    assert_int_equal(parse("{\"trace-id\": \"abc\", \"tenant\":\"t1\" ,\"empty\":\"\"}", &object, &err),
                     0);
    assert_int_equal(object.count, 3);
    assert_string_equal(object.members[0].key, "trace-id");
    assert_string_equal(object.members[0].value, "abc");
    assert_int_equal(object.members[0].value_len, 3);
    assert_string_equal(object.members[1].key, "tenant");
    assert_string_equal(object.members[1].value, "t1");
    assert_string_equal(object.members[2].key, "empty");
    assert_int_equal(object.members[2].value_len, 0);
    json_string_object_clear(&object);
}

static void
test_simple_escapes(void **state)
{
    struct json_string_object object;
    struct outbox_error err = {0};

    (void)state;
    assert_int_equal(parse("{\"k\\n\":\"a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti\"}", &object, &err), 0);
    assert_int_equal(object.count, 1);
    assert_string_equal(object.members[0].key, "k\n");
    assert_string_equal(object.members[0].value, "a\"b\\c/d\be\ff\ng\rh\ti");
    json_string_object_clear(&object);
}

static void
test_unicode_escapes(void **state)
{
    struct json_string_object object;
    struct outbox_error err = {0};

    (void)state;
    /* é (2 bytes), € (3 bytes), 😀 as a surrogate pair (4 bytes), raw UTF-8 kept. */
    assert_int_equal(parse("{\"u\":\"\\u00e9\\u20AC\\ud83d\\ude00 \xc3\xa9\"}", &object, &err), 0);
    assert_string_equal(object.members[0].value, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xc3\xa9");
    json_string_object_clear(&object);

    /* \u0000 is kept as a NUL byte inside the value, visible through the length. */
    assert_int_equal(parse("{\"z\":\"a\\u0000b\"}", &object, &err), 0);
    assert_int_equal(object.members[0].value_len, 3);
    assert_memory_equal(object.members[0].value, "a\0b", 3);
    json_string_object_clear(&object);
}

static void
test_bad_surrogates_refused(void **state)
{
    (void)state;
    assert_refused("{\"u\":\"\\ud83d\"}", "lone high surrogate");
    assert_refused("{\"u\":\"\\ud83dx\"}", "lone high surrogate");
    assert_refused("{\"u\":\"\\ud83d\\u0041\"}", "lone high surrogate");
    assert_refused("{\"u\":\"\\ude00\"}", "lone low surrogate");
    assert_refused("{\"u\":\"\\u12g4\"}", "invalid \\u escape");
    assert_refused("{\"u\":\"\\x\"}", "invalid escape");
}

static void
test_non_string_values_refused(void **state)
{
    (void)state;
    assert_refused("{\"n\":1}", "value of 'n' is a number, not a string");
    assert_refused("{\"n\":-1}", "a number");
    assert_refused("{\"b\":true}", "a boolean");
    assert_refused("{\"z\":null}", "null");
    assert_refused("{\"a\":[\"x\"]}", "an array");
    assert_refused("{\"o\":{\"x\":\"y\"}}", "value of 'o' is an object");
    assert_refused("[]", "json is an array, not an object");
    assert_refused("\"text\"", "not an object");
    assert_refused("42", "not an object");
    assert_refused("{1:\"x\"}", "expected a key");
    assert_refused("{\"a\" \"x\"}", "expected ':'");
    assert_refused("{\"a\":\"x\" \"b\":\"y\"}", "expected ',' or '}'");
    assert_refused("{\"a\":\"x\",}", "expected a key");
    assert_refused("{} {}", "trailing text");
    assert_refused("{\"a\":\"tab\there\"}", "control character");
}

static void
test_invalid_utf8_refused(void **state)
{
    (void)state;
    assert_refused("{\"a\":\"\xff\"}", "invalid utf-8");
    assert_refused("{\"a\":\"\xc3\"}", "invalid utf-8");         /* cut sequence */
    assert_refused("{\"a\":\"\xc0\xaf\"}", "invalid utf-8");     /* overlong '/' */
    assert_refused("{\"a\":\"\xed\xa0\x80\"}", "invalid utf-8"); /* encoded surrogate */
    assert_refused("{\"a\":\"\xf4\x90\x80\x80\"}", "invalid utf-8"); /* above U+10FFFF */
    assert_refused("{\"\x80\":\"x\"}", "invalid utf-8");
}

static void
test_truncated_refused(void **state)
{
    static const char *const cuts[] = {
        "", "   ", "{", "{\"", "{\"a", "{\"a\"", "{\"a\":", "{\"a\":\"", "{\"a\":\"x",
        "{\"a\":\"x\"", "{\"a\":\"x\",", "{\"a\":\"\\", "{\"a\":\"\\u12", "{\"a\":\"\\ud83d\\u",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
        assert_refused(cuts[i], "unexpected end of json");
}

static void
test_length_bounds_input(void **state)
{
    struct json_string_object object;
    struct outbox_error err = {0};
    const char text[] = "{\"a\":\"b\"}garbage";

    (void)state;
    /* Only the given length is read: the text need not be NUL-terminated. */
    assert_int_equal(json_parse_string_object(text, 9, &object, &err), 0);
    assert_int_equal(object.count, 1);
    json_string_object_clear(&object);
    assert_int_equal(json_parse_string_object(text, 8, &object, &err), -1);
    json_string_object_clear(NULL);
}

static void
test_error_message_is_one_line(void **state)
{
    /* found by fuzzing: a key with a line break was quoted as is */
    static const char text[] = "{\"c\\\"c\\f\\nb}r\":[";
    struct json_string_object object = {0};
    struct outbox_error err;

    (void)state;
    assert_int_equal(json_parse_string_object(text, strlen(text), &object, &err), -1);
    assert_null(strchr(err.message, '\n'));
    assert_null(strchr(err.message, '\f'));
}

/* The writer's escapes: short forms, \u00XX, HTML-safe on request, U+FFFD for bad bytes. */
static void
test_writer_escapes(void **state)
{
    static const char text[] = "a\"b\\c\n\t\r\x01\x7f<&> caf\xc3\xa9 \xff";
    struct buffer out = {0};

    (void)state;
    json_put_string(&out, text, sizeof(text) - 1, 0);
    assert_string_equal(out.data, "\"a\\\"b\\\\c\\n\\t\\r\\u0001\\u007f<&> caf\xc3\xa9 \\ufffd\"");
    out.len = 0;
    json_put_text(&out, "<b>&", JSON_HTML_SAFE);
    assert_string_equal(out.data, "\"\\u003cb\\u003e\\u0026\"");
    out.len = 0;
    json_put_text(&out, NULL, 0);
    assert_string_equal(out.data, "null");
    buffer_clear(&out);
}

/* What the writer writes, the reader reads back, byte for byte. */
static void
test_writer_round_trip(void **state)
{
    static const char text[] = "tab\there \xf0\x9f\x98\x80 \x1f end";
    struct json_string_object object = {0};
    struct outbox_error err;
    struct buffer out = {0};

    (void)state;
    buffer_puts(&out, "{\"k\":");
    json_put_text(&out, text, 0);
    buffer_putc(&out, '}');
    assert_int_equal(json_parse_string_object(out.data, out.len, &object, &err), 0);
    assert_string_equal(object.members[0].value, text);
    json_string_object_clear(&object);
    buffer_clear(&out);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_message_is_one_line),
        cmocka_unit_test(test_writer_escapes),
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_empty_object),
        cmocka_unit_test(test_members_in_order),
        cmocka_unit_test(test_simple_escapes),
        cmocka_unit_test(test_unicode_escapes),
        cmocka_unit_test(test_bad_surrogates_refused),
        cmocka_unit_test(test_non_string_values_refused),
        cmocka_unit_test(test_invalid_utf8_refused),
        cmocka_unit_test(test_truncated_refused),
        cmocka_unit_test(test_length_bounds_input),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
