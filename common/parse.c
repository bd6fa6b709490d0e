/*
 * parse.c - durations and bounded integers from command-line text.
 */
#include "parse.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "error.h"

/* Longest input quoted back in a message. */
#define QUOTE_MAX 64

/*
 * Copies at most QUOTE_MAX characters of text into out (QUOTE_MAX + 1
 * bytes) for a message, control characters as '?': a message stays one
 * line whatever the input holds.
 */
static const char *
quote(const char *text, char *out)
{
    return outbox_error_quote(out, QUOTE_MAX + 1, text);
}

/*
 * Reads the digits at *text into *value and advances *text. Sets *too_big,
 * leaving *value meaningless, when the number exceeds limit (no overflow can
 * happen). False when there is no digit.
 */
static bool
read_digits(const char **text, int64_t limit, int64_t *value, bool *too_big)
{
    const char *p = *text;
    int64_t n = 0;

    *too_big = false;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        int digit = *p - '0';

        if (*too_big || n > limit / 10 || n * 10 > limit - digit)
            *too_big = true;
        else
            n = n * 10 + digit;
    }
    *value = n;
    *text = p;
    return true;
}

/* Milliseconds in the unit at *text ("ms", "s", "m", "h", "d"), advancing past it; 0 if none. */
static int64_t
read_unit_ms(const char **text)
{
    const char *p = *text;

    if (p[0] == 'm' && p[1] == 's') {
        *text = p + 2;
        return 1;
    }
    *text = p + 1;
    switch (*p) {
    case 's':
        return 1000;
    case 'm':
        return 60 * 1000;
    case 'h':
        return 3600 * 1000;
    case 'd':
        return 86400 * 1000;
    default:
        *text = p;
        return 0;
    }
}

int
parse_duration_ms(const char *text, int64_t *milliseconds, struct outbox_error *err)
{
    const int64_t max_ms = PARSE_DURATION_MAX_SECONDS * 1000;
    const char *p = text;
    int64_t total = 0;
    char quoted[QUOTE_MAX + 1];

    if (text == NULL || *text == '\0')
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "invalid duration '': expected e.g. 250ms, 90s, 15m, 24h or 7d");
    /* a bare 0 needs no unit: "--retention 0" as the help and the docs write it */
    if (strcmp(text, "0") == 0) {
        *milliseconds = 0;
        return 0;
    }
    while (*p != '\0') {
        int64_t count, unit;
        bool too_big;

        if (!read_digits(&p, max_ms, &count, &too_big) || (unit = read_unit_ms(&p)) == 0)
            return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                    "invalid duration '%s': expected e.g. 250ms, 90s, 15m, 24h"
                                    " or 7d",
                                    quote(text, quoted));
        if (too_big || count > (max_ms - total) / unit)
            return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                    "duration '%s' is too long: at most 36500d",
                                    quote(text, quoted));
        total += count * unit;
    }
    *milliseconds = total;
    return 0;
}

int
parse_duration(const char *text, int64_t *seconds, struct outbox_error *err)
{
    int64_t ms;

    if (parse_duration_ms(text, &ms, err) != 0)
        return -1;
    *seconds = ms / 1000;
    return 0;
}

int
parse_integer(const char *text, int64_t min, int64_t max, int64_t *value, struct outbox_error *err)
{
    const char *p = text;
    int64_t n;
    bool too_big;
    char quoted[QUOTE_MAX + 1];

    if (text == NULL || !read_digits(&p, max, &n, &too_big) || *p != '\0')
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "invalid number '%s'",
                                quote(text, quoted));
    if (too_big || n < min)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "number '%s' is out of range %lld to %lld", quote(text, quoted),
                                (long long)min, (long long)max);
    *value = n;
    return 0;
}
