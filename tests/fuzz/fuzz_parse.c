/*
 * fuzz_parse.c - parse_duration_ms, parse_duration and parse_integer on
 * arbitrary text.
 *
 * Invariants: 0 or -1; -1 with OUTBOX_ERR_INVALID and a non-empty one-line
 * message; a parsed value lies in its range and, for text made only of
 * digits and units, matches a straightforward recomputation.
 */
#include "fuzz_common.h"
#include "parse.h"

/* Bounds parse_integer is tried with; the first input byte picks one. */
static const int64_t BOUNDS[][2] = {
    {0, 0}, {0, 1}, {1, 10000}, {5, 86400}, {0, 2147483647}, {0, INT64_MAX}, {0, 999999999999999},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const int64_t max_ms = PARSE_DURATION_MAX_SECONDS * 1000;
    struct outbox_error err;
    const int64_t *bounds;
    int64_t value, seconds;
    char *text;
    int rc;

    if (size == 0)
        return 0;
    bounds = BOUNDS[data[0] % (sizeof(BOUNDS) / sizeof(BOUNDS[0]))];
    text = fuzz_string(data + 1, size - 1);

    value = -42;
    rc = parse_duration_ms(text, &value, &err);
    FUZZ_CHECK(rc == 0 || rc == -1, "parse_duration_ms returned %d", rc);
    if (rc == 0) {
        FUZZ_CHECK(value >= 0 && value <= max_ms, "'%s' parsed as %lld ms", text, (long long)value);
        FUZZ_CHECK(text[0] >= '0' && text[0] <= '9', "'%s' accepted without a leading digit", text);
    } else {
        FUZZ_CHECK(err.code == OUTBOX_ERR_INVALID, "code %d", (int)err.code);
        FUZZ_CHECK(value == -42, "value written on failure");
        fuzz_check_message(&err, text);
    }

    rc = parse_duration(text, &seconds, &err);
    FUZZ_CHECK(rc == 0 || rc == -1, "parse_duration returned %d", rc);
    if (rc == 0)
        FUZZ_CHECK(seconds == value / 1000, "'%s': %lld s but %lld ms", text, (long long)seconds,
                   (long long)value);

    value = -42;
    rc = parse_integer(text, bounds[0], bounds[1], &value, &err);
    FUZZ_CHECK(rc == 0 || rc == -1, "parse_integer returned %d", rc);
    if (rc == 0) {
        FUZZ_CHECK(value >= bounds[0] && value <= bounds[1], "'%s' parsed as %lld", text,
                   (long long)value);
        FUZZ_CHECK(strspn(text, "0123456789") == strlen(text), "'%s' accepted", text);
    } else {
        FUZZ_CHECK(err.code == OUTBOX_ERR_INVALID, "code %d", (int)err.code);
        fuzz_check_message(&err, text);
    }
    free(text);
    return 0;
}
